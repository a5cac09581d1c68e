"""docs/install.md's suite sizes: the number of tests it quotes for the stack running this suite is within 10% of what
this run collected (checked only when the whole suite is collected, not a selection of it)."""

import importlib.util
import os
import pathlib
import re

import pytest

TESTS = pathlib.Path(__file__).parent
INSTALL_MD = TESTS.parent / "docs" / "install.md"
TOLERANCE = 0.10


def documented_counts(text: str) -> dict[str, int]:
    """``{stack: tests}`` from the rows ``| stack | 1,558 | ...`` of the table after the suite-sizes marker."""
    table = text.split("<!-- suite sizes: checked by tests/test_install_numbers.py -->", 1)[1]
    rows = re.findall(r"^\| (current|comparison|legacy|jax)\b[^|]* \| ([\d,]+) \|", table, flags=re.MULTILINE)
    return {stack: int(count.replace(",", "")) for stack, count in rows}


def this_stack() -> str:
    """The stack this interpreter is (the names of docs/install.md and .ci/run)."""
    if importlib.util.find_spec("tensorflow") is None:
        return "jax"
    if importlib.util.find_spec("tensorflow_privacy") is not None:
        return "comparison"
    return "legacy" if os.environ.get("TF_USE_LEGACY_KERAS") == "1" else "current"


def whole_suite(config: pytest.Config) -> bool:
    """Whether this run collects every test: the tests folder (or nothing, i.e. testpaths), no -k / -m selection."""
    paths = {(pathlib.Path(config.invocation_params.dir) / arg).resolve() for arg in config.args}
    return paths <= {TESTS} and not config.option.keyword and not config.option.markexpr


def test_the_documented_counts_parse_for_every_stack():
    assert set(documented_counts(INSTALL_MD.read_text())) == {"current", "comparison", "legacy", "jax"}


def test_the_documented_count_of_this_stack_is_within_ten_percent_of_what_it_collects(request):
    if not whole_suite(request.config):
        pytest.skip("a selection of the suite: its count says nothing of the whole")
    documented = documented_counts(INSTALL_MD.read_text())[this_stack()]
    collected = len(request.session.items)
    assert abs(collected - documented) <= TOLERANCE * documented, (
        f"docs/install.md says {documented} tests for the {this_stack()} stack; this run collected {collected}: "
        "update the table"
    )

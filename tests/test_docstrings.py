"""Every public constructor and function explains each of its arguments where ``help()`` and the API reference
read it: an entry in its docstring's Google-style ``Args:`` (or, for a dataclass, ``Attributes:``) section; the
README's usage comments each of the optimizer's arguments.

Runs on every stack: the Keras-based names resolve to the backend in use (TensorFlow's or JAX's).
"""

import importlib
import inspect
import pathlib
import re

import pytest

import keras_dyndp
from keras_dyndp import optimizer_base
from keras_dyndp import schedules

_SECTION = re.compile(r"^(?P<indent>\s*)(Args|Arguments|Attributes):\s*$")
_ENTRY = re.compile(r"^(?P<name>\*{0,2}\w+)(\s*\([^)]*\))?:\s*(?P<text>.*)$")
_OPTIMIZERS = ("DynamicDPKerasSGD", "DynamicDPKerasAdam", "DynamicDPKerasAdagrad", "DynamicDPKerasRMSprop")


def documented_arguments(doc: str) -> dict[str, str]:
    """The entries of ``doc``'s Args / Attributes sections: argument name -> its explanation (continuation lines
    joined)."""
    entries: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").splitlines()
    index = 0
    while index < len(lines):
        header = _SECTION.match(lines[index])
        index += 1
        if header is None:
            continue
        entry_indent, name = None, None
        while index < len(lines):
            line = lines[index]
            indent = len(line) - len(line.lstrip())
            if line.strip() and indent <= len(header.group("indent")):
                break
            if line.strip():
                entry_indent = indent if entry_indent is None else entry_indent
                match = _ENTRY.match(line.strip()) if indent == entry_indent else None
                if match is not None:
                    name = match.group("name").lstrip("*")
                    entries[name] = match.group("text")
                elif name is not None:
                    entries[name] += " " + line.strip()
            index += 1
    return entries


def _parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name not in ("self", "cls")]


_PUBLIC_NAMESPACES = ("keras_dyndp", "keras_dyndp.schedules", "keras_dyndp.accounting", "keras_dyndp.audit")
"""The backend-neutral packages whose ``__all__`` the API reference (docs/api, built with ``mkdocs --strict``) shows."""


def _public_callables() -> list[str]:
    names = []
    for namespace in _PUBLIC_NAMESPACES:
        package = importlib.import_module(namespace)
        for name in package.__all__:
            try:
                value = getattr(package, name)
            except ImportError:  # TensorFlow's only, on JAX.
                continue
            if not callable(value) or (isinstance(value, type) and issubclass(value, BaseException)):
                continue
            names.append(f"{namespace}.{name}")
    return sorted(set(names))


def _public(dotted: str):
    namespace, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(namespace), name)


def _doc(value) -> str:
    doc = inspect.getdoc(value) or ""
    if isinstance(value, type) and value.__init__ is not object.__init__:
        doc += "\n\n" + (inspect.getdoc(value.__init__) or "")
    return doc


def test_parser_reads_google_sections():
    doc = """Summary.

    Args:
      alpha: the first,
        continued.
      **kwargs: the rest.

    Raises:
      ValueError: never.
    """
    assert documented_arguments(doc) == {"alpha": "the first, continued.", "kwargs": "the rest."}


def test_dp_optimizer_base_explains_every_argument():
    documented = documented_arguments(optimizer_base.DPOptimizerBase.__doc__)
    for name in _parameters(optimizer_base.DPOptimizerBase.__init__):
        assert name in documented, f"DPOptimizerBase's docstring does not explain `{name}`"
        assert len(documented[name]) >= 20, f"`{name}` has no real explanation: {documented[name]!r}"


@pytest.mark.parametrize("name", _OPTIMIZERS)
def test_help_of_each_optimizer_explains_every_argument(name):
    optimizer_class = getattr(keras_dyndp, name)
    documented = documented_arguments(optimizer_class.__doc__)
    missing = [arg for arg in _parameters(optimizer_base.DPOptimizerBase.__init__) if arg not in documented]
    assert not missing, f"help({name}) does not explain {missing}"
    assert "DynamicDPOptimizerMixin for its arguments" not in optimizer_class.__doc__
    for argument, words in {"method": "'dynamic'", "rho_mu": "mu_T / mu_0", "rho_c": "C_0 / C_T"}.items():
        assert words in documented[argument], f"{name}'s `{argument}` does not say {words}"


@pytest.mark.parametrize("name", _public_callables())
def test_every_public_name_explains_its_arguments(name):
    value = _public(name)
    documented = documented_arguments(_doc(value))
    missing = [arg for arg in _parameters(value) if arg not in documented]
    assert not missing, f"{name}'s docstring has no Args entry for {missing}"


def test_readme_usage_comments_every_argument_in_one_line():
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    call = re.search(r"^optimizer = keras_dyndp\.DynamicDPKerasSGD\(\n(.*?)^\)", readme, re.S | re.M)
    assert call is not None, "README's usage block no longer builds DynamicDPKerasSGD"
    arguments = {}
    for line in call.group(1).splitlines():
        name, _, comment = line.strip().partition("#")
        arguments[name.split("=")[0].strip()] = comment.strip()
    dp_arguments = set(_parameters(optimizer_base.DPOptimizerBase.__init__))
    assert set(arguments) - dp_arguments == {"learning_rate"}, "an argument the DP optimizers do not take"
    assert all(arguments.values()), f"README's usage leaves {[n for n, c in arguments.items() if not c]} unexplained"
    assert all(f'"{method}"' in arguments["method"] for method in schedules.METHODS)

"""Runs an example as a user does (``python -m examples.<name>`` from the repository root) and reads its report.

The runs are children forked from one server per pytest process (``example_server`` of tests/conftest.py), which
pays the import of ``examples`` (TensorFlow's) once; each child prints and returns what a fresh ``python -m`` process
would."""

import pathlib
import re

import pytest

_ACCURACY = re.compile(r"^Test accuracy: (\S+) ", re.MULTILINE)
_PRIVACY = re.compile(
    r"steps taken (\d+) of the schedule's (\d+)\n.*PLD \(rigorous upper bound\): (\S+)\n.*"
    r"budget calibrated under pld: target epsilon (\S+)\n",
    re.DOTALL,
)


@pytest.fixture(name="run_example")
def fixture_run_example(example_server):
    """``run_example(name, *flags)`` -> (test accuracy, steps, T, PLD epsilon, target epsilon, stdout)."""

    def run(name: str, *arguments: str) -> tuple[float, int, int, float, float, str]:
        result = example_server.run(f"examples.{name}", ["--verbose=0", *arguments], timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        accuracy, privacy = _ACCURACY.search(result.stdout), _PRIVACY.search(result.stdout)
        assert accuracy and privacy, result.stdout[-2000:]
        steps, total, epsilon, target = privacy.groups()
        return float(accuracy.group(1)), int(steps), int(total), float(epsilon), float(target), result.stdout

    return run


@pytest.fixture(name="acl_imdb_dir")
def fixture_acl_imdb_dir(tmp_path):
    """``acl_imdb_dir(per_class)``: a tiny aclImdb folder, ``per_class`` reviews per class in train/ and test/."""

    def write(per_class: int) -> pathlib.Path:
        words = {"pos": "great wonderful superb fun", "neg": "awful boring terrible bad"}
        for split in ("train", "test"):
            for label in ("pos", "neg"):
                folder = tmp_path / split / label
                folder.mkdir(parents=True)
                for i in range(per_class):
                    (folder / f"{i}_7.txt").write_text(f"A {words[label]} movie, number {i}!", encoding="utf-8")
        return tmp_path

    return write

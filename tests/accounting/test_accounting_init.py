"""Tests that keras_dyndp.accounting re-exports its public names and that its modules never import TensorFlow."""

import ast
import pathlib

import keras_dyndp.accounting as accounting


def test_all_names_resolve():
    for name in accounting.__all__:
        assert getattr(accounting, name) is not None


def test_no_tensorflow_import_in_accounting_sources():
    for path in pathlib.Path(accounting.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            assert not any(
                module.split(".")[0] in ("tensorflow", "tensorflow_privacy", "keras") for module in modules
            ), f"{path.name} imports {modules}"

"""Tests for the top-level keras_dyndp namespace."""

import importlib
import subprocess
import sys
import warnings

import pytest

import keras_dyndp


def test_import_and_accounting_do_not_load_tensorflow():
    code = (
        "import sys, keras_dyndp, keras_dyndp.accounting, keras_dyndp.privacy_cli; print('tensorflow' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("name", keras_dyndp.__all__)
def test_every_public_name_resolves_and_is_documented(name):
    value = getattr(keras_dyndp, name)
    if name != "__version__":
        assert value.__doc__


def test_unknown_attribute_raises():
    with pytest.raises(AttributeError, match="no attribute 'DPKerasSGD'"):
        _ = keras_dyndp.DPKerasSGD


def test_tensorflow_stacks_resolve_the_tensorflow_names():
    from keras_dyndp import tf_backend as optimizers  # pylint: disable=import-outside-toplevel

    assert keras_dyndp.keras_backend() == "tensorflow"
    assert keras_dyndp.DynamicDPKerasSGD is optimizers.DynamicDPKerasSGD


def test_each_public_name_is_listed_once_and_former_names_are_gone():
    assert len(keras_dyndp.__all__) == len(set(keras_dyndp.__all__))
    assert not hasattr(keras_dyndp, "poisson_batches_from_tensors")  # one sampler: keras_dyndp.poisson_batches
    assert keras_dyndp.BudgetStop.__module__ == "keras_dyndp.callbacks"


@pytest.mark.parametrize("name, folder", sorted(keras_dyndp._MOVED.items()))
def test_a_moved_module_resolves_at_its_former_path_with_a_deprecation_warning(name, folder):
    new_path = f"keras_dyndp.{folder}.{name}"
    with pytest.warns(DeprecationWarning, match=rf"keras_dyndp\.{name} is now {new_path}"):
        module = getattr(keras_dyndp, name)
    assert module is importlib.import_module(new_path)


def test_the_public_rule_module_keeps_its_path_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert keras_dyndp.layer_rules is importlib.import_module("keras_dyndp.rules.layer_rules")

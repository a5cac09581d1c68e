"""Tests for the top-level keras_dyndp namespace."""

import subprocess
import sys

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

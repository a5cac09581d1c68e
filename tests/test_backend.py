"""backend: which backend Keras runs on, and the Keras keras_dyndp trains with there."""

import importlib.util

import pytest

from keras_dyndp import backend


def test_the_backend_is_the_one_keras_runs_on():
    expected = "tensorflow" if importlib.util.find_spec("tensorflow") else "jax"
    assert backend.keras_backend() == expected


def test_keras_module_is_the_stacks_keras():
    keras = backend.keras_module()
    assert hasattr(keras, "Model") and hasattr(keras.optimizers, "SGD")
    if backend.keras_backend() == "jax":
        import keras as keras_3  # pylint: disable=import-outside-toplevel

        assert keras is keras_3
    else:
        from keras_dyndp.tf_backend import keras_compat  # pylint: disable=import-outside-toplevel

        assert keras is keras_compat.keras


def test_the_implementation_is_the_backends_package_and_another_backend_is_refused_naming_both(monkeypatch):
    package = {"tensorflow": "keras_dyndp.tf_backend", "jax": "keras_dyndp.jax_backend"}[backend.keras_backend()]
    assert backend.implementation_name("data") == f"{package}.data"
    assert backend.implementation("per_example.rules").__name__ == f"{package}.per_example.rules"
    monkeypatch.setattr(backend, "keras_backend", lambda: "torch")
    assert backend.implementation_name("data") is None
    with pytest.raises(ValueError, match=r"TensorFlow or JAX backend; Keras runs on 'torch' here\. Set KERAS_BACKEND"):
        backend.implementation("data")

"""Which backend Keras runs on, asked without importing TensorFlow or JAX before Keras does."""

import importlib
import importlib.util


def keras_backend() -> str:
    """The backend Keras runs on here: 'jax' when Keras 3 is set to JAX, else 'tensorflow' (Keras 2 included)."""
    if importlib.util.find_spec("keras") is None:
        return "tensorflow"
    try:
        keras = importlib.import_module("keras")
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        raise ImportError(
            "Keras is set to its TensorFlow backend (KERAS_BACKEND unset or 'tensorflow', or ~/.keras/keras.json), "
            "but TensorFlow is not installed: set KERAS_BACKEND=jax before importing keras (keras_dyndp[jax]), or "
            "pip install 'keras_dyndp[tensorflow]'."
        ) from error
    config = getattr(keras, "config", None)
    return config.backend() if config is not None and hasattr(config, "backend") else "tensorflow"


def keras_module():
    """The Keras that keras_dyndp trains with: ``keras`` on JAX, else the TensorFlow stack's (`keras_compat`)."""
    if keras_backend() == "jax":
        return importlib.import_module("keras")
    return importlib.import_module("keras_dyndp.tf_backend.keras_compat").keras

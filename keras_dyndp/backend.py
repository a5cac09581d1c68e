"""Which backend Keras runs on, asked without importing TensorFlow or JAX before Keras does, and the one place that
picks keras_dyndp's implementation for it (`implementation`)."""

import importlib
import importlib.util
import types

_IMPLEMENTATIONS = {"tensorflow": "keras_dyndp.tf_backend", "jax": "keras_dyndp.jax_backend"}


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


def implementation_name(module: str = "") -> str | None:
    """The dotted name of ``module`` (e.g. ``'data'``; '' for the package) in keras_dyndp's implementation for the
    backend Keras runs on (``keras_dyndp.tf_backend`` or ``.jax_backend``); None on others (PyTorch, NumPy)."""
    package = _IMPLEMENTATIONS.get(keras_backend())
    return None if package is None else ".".join(filter(None, (package, module)))


def implementation(module: str = "") -> types.ModuleType:
    """``module`` of keras_dyndp's implementation for the backend Keras runs on, imported (`implementation_name`);
    ValueError, naming the supported ones, on a backend keras_dyndp has no implementation for."""
    name = implementation_name(module)
    if name is None:
        raise ValueError(
            f"keras_dyndp runs on Keras's TensorFlow or JAX backend; Keras runs on {keras_backend()!r} here. Set "
            "KERAS_BACKEND=jax or KERAS_BACKEND=tensorflow before importing keras."
        )
    return importlib.import_module(name)

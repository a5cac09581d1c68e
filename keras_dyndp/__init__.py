"""keras_dyndp: dynamic differentially private SGD for TensorFlow/Keras.

Per-step clipping norms C_t and noise standard deviations sigma_t follow a `DPSchedule` calibrated so the whole
run meets a target (epsilon, delta) (Du et al., "Dynamic Differential-Privacy Preserving SGD"), and Keras
optimizers apply it with per-example clipping:

```python
import keras_dyndp
optimizer = keras_dyndp.DynamicDPKerasSGD(
    target_epsilon=1.2, target_delta=1e-5, num_examples=60000, batch_size=250, epochs=20,
    method='dynamic', initial_clip=1.5, rho_mu=1 / 0.8, rho_c=1 / 0.3, learning_rate=0.15)
model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(
    from_logits=True, reduction=tf.keras.losses.Reduction.NONE))
```

The accounting and schedule modules import no TensorFlow; the Keras-based names below (optimizers,
callbacks, data helpers, `make_private`) are imported on first use, so `keras_dyndp.accounting` and the
`dyndp-privacy` command start fast. The DP optimizers are registered with Keras (for `load_model`) as soon as Keras
is imported, before or after keras_dyndp (`keras_dyndp.registration`). When Keras 3 runs on JAX
(``KERAS_BACKEND=jax``), the optimizers, `make_private`, `check_model`, `PrivacyLogger` and `BudgetStop` are those of
`keras_dyndp.jax_backend`, so the same code trains on either backend; the other Keras-based names need TensorFlow.
"""

import importlib
import importlib.util

from keras_dyndp import registration
from keras_dyndp.accounting.gdp_clt_accountant import GdpCltAccountant
from keras_dyndp.accounting.registry import make_accountant
from keras_dyndp.schedules import CalibrationError
from keras_dyndp.schedules import DPSchedule
from keras_dyndp.schedules import calibrate
from keras_dyndp.schedules import calibrate_shape
from keras_dyndp.schedules import sampling_from_epochs
from keras_dyndp.version import __version__

_LAZY = {
    "DynamicDPKerasSGD": "keras_dyndp.optimizers",
    "DynamicDPKerasAdam": "keras_dyndp.optimizers",
    "DynamicDPKerasAdagrad": "keras_dyndp.optimizers",
    "DynamicDPKerasRMSprop": "keras_dyndp.optimizers",
    "make_dynamic_dp_optimizer_class": "keras_dyndp.optimizers",
    "PrivacyLogger": "keras_dyndp.callbacks",
    "BudgetStop": "keras_dyndp.callbacks",
    "poisson_batches": "keras_dyndp.data",
    "poisson_batches_from_tensors": "keras_dyndp.data",
    "shuffled_batches": "keras_dyndp.data",
    "make_private": "keras_dyndp.per_example",
    "check_model": "keras_dyndp.model_checks",
}

# The names keras_dyndp.jax_backend provides when Keras runs on JAX.
_JAX = {
    "DynamicDPKerasSGD",
    "DynamicDPKerasAdam",
    "DynamicDPKerasAdagrad",
    "DynamicDPKerasRMSprop",
    "make_dynamic_dp_optimizer_class",
    "make_private",
    "BudgetStop",
    "PrivacyLogger",
    "check_model",
}

__all__ = [
    "CalibrationError",
    "DPSchedule",
    "GdpCltAccountant",
    "__version__",
    "calibrate",
    "calibrate_shape",
    "make_accountant",
    "keras_backend",
    "sampling_from_epochs",
    *_LAZY,
]


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


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'keras_dyndp' has no attribute {name!r}")
    backend = keras_backend()
    if backend == "jax" and name in _JAX:
        return getattr(importlib.import_module("keras_dyndp.jax_backend"), name)
    try:
        return getattr(importlib.import_module(_LAZY[name]), name)
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        raise ImportError(
            f"keras_dyndp.{name} needs TensorFlow (pip install 'keras_dyndp[tensorflow]'), which is not installed. "
            f"Keras runs on {backend!r} here; with KERAS_BACKEND=jax and 'keras_dyndp[jax]' installed, "
            f"keras_dyndp provides {', '.join(sorted(_JAX))}."
        ) from error


def __dir__():
    return sorted(__all__)


# After keras_backend: load_model finds the DP optimizers in a process that only imported keras_dyndp and Keras.
registration.register_with_keras()

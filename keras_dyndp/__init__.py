"""keras_dyndp: dynamic differentially private SGD for Keras, on TensorFlow (Keras 2 or 3) and on JAX (Keras 3).

Per-step clipping norms C_t and noise standard deviations sigma_t follow a `DPSchedule` calibrated so the whole
run meets a target (epsilon, delta) (Du et al., "Dynamic Differential-Privacy Preserving SGD"); the DP optimizers
apply it with per-example clipping in the train step of ``make_private(model)``:

```python
import keras_dyndp
model = keras_dyndp.make_private(model)
model.compile(optimizer=keras_dyndp.DynamicDPKerasSGD(
    target_epsilon=1.2, target_delta=1e-5, num_examples=60000, batch_size=250, epochs=20,
    method='dynamic', initial_clip=1.5, rho_mu=1 / 0.8, rho_c=1 / 0.3, learning_rate=0.15), loss=per_example_loss)
model.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=250 / 60000), epochs=20,
          callbacks=[keras_dyndp.PrivacyLogger(delta=1e-5), keras_dyndp.BudgetStop()])
```

Every public name is listed once below. The backend-neutral names import no TensorFlow (fast start); the Keras-based
ones are imported on first use from the module of the backend Keras runs on (`keras_backend`). The DP optimizers are
registered with Keras (for ``load_model``) as soon as Keras is imported (`keras_dyndp.keras_glue.registration`).
"""

import importlib
import warnings

from keras_dyndp.accounting import GdpCltAccountant
from keras_dyndp.accounting import make_accountant
from keras_dyndp.backend import keras_backend
from keras_dyndp.core.adaptive_clipping import AdaptiveClipping
from keras_dyndp.core.batch_sizes import SamplingWarning
from keras_dyndp.core.noise_seed import NoiseSeedWarning
from keras_dyndp.data.sampling import poisson_batches
from keras_dyndp.keras_glue import registration as _registration
from keras_dyndp.keras_glue.restarts import ScheduleRestartWarning
from keras_dyndp.optimizer_base import BudgetExhaustedError
from keras_dyndp.optimizer_base import DegenerateNoiseWarning
from keras_dyndp.privacy_report import run_summary
from keras_dyndp.rules import layer_rules
from keras_dyndp.rules.layer_rules import register_per_example_layer
from keras_dyndp.rules.registry import LayerRule
from keras_dyndp.rules.registry import register_layer_rule
from keras_dyndp.schedules import CalibrationError
from keras_dyndp.schedules import DPSchedule
from keras_dyndp.schedules import GdpCltUnderstatementWarning
from keras_dyndp.schedules import calibrate
from keras_dyndp.schedules import calibrate_shape
from keras_dyndp.schedules import sampling_from_epochs
from keras_dyndp.version import __version__

_TF, _JAX = "keras_dyndp.tf_backend", "keras_dyndp.jax_backend"
_CALLBACKS = ("keras_dyndp.callbacks", "keras_dyndp.callbacks")

# The Keras-based names: (module on TensorFlow, module on JAX or None where the name is TensorFlow's only).
_LAZY = {
    "DynamicDPKerasSGD": (_TF, _JAX),
    "DynamicDPKerasAdam": (_TF, _JAX),
    "DynamicDPKerasAdagrad": (_TF, _JAX),
    "DynamicDPKerasRMSprop": (_TF, _JAX),
    "make_dynamic_dp_optimizer_class": (_TF, _JAX),
    "make_private": (_TF, _JAX),
    "check_model": (f"{_TF}.model_checks", _JAX),
    "BudgetStop": _CALLBACKS,
    "PrivacyLogger": _CALLBACKS,
    "shuffled_batches": (f"{_TF}.data", None),
}

# Modules moved into subpackages: their former path (keras_dyndp.<module>) still resolves, with a DeprecationWarning,
# until the next release.
_MOVED = {
    **dict.fromkeys(("batch_sizes", "mechanism", "noise_seed", "refusals", "step_checks", "validation"), "core"),
    **dict.fromkeys(("dense_attention", "einsum_equation", "einsum_lora", "ghost_cost", "sublayers"), "rules"),
    **dict.fromkeys(("sampling", "sources"), "data"),
    **dict.fromkeys(("entry_points", "epoch_logs", "private_model", "registration"), "keras_glue"),
}

__all__ = [
    "AdaptiveClipping",
    "BudgetExhaustedError",
    "CalibrationError",
    "DPSchedule",
    "DegenerateNoiseWarning",
    "GdpCltAccountant",
    "GdpCltUnderstatementWarning",
    "LayerRule",
    "NoiseSeedWarning",
    "SamplingWarning",
    "ScheduleRestartWarning",
    "__version__",
    "calibrate",
    "calibrate_shape",
    "keras_backend",
    "layer_rules",
    "make_accountant",
    "poisson_batches",
    "register_layer_rule",
    "register_per_example_layer",
    "run_summary",
    "sampling_from_epochs",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _MOVED:
        moved = f"keras_dyndp.{_MOVED[name]}.{name}"
        warnings.warn(
            f"keras_dyndp.{name} is now {moved}; the former path goes in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(moved)
    modules = _LAZY.get(name)
    if modules is None:
        raise AttributeError(f"module 'keras_dyndp' has no attribute {name!r}")
    module = modules[1] if keras_backend() == "jax" else modules[0]
    try:
        if module is None:  # TensorFlow's only, and Keras runs on JAX.
            raise ModuleNotFoundError(name="tensorflow")
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:
        if error.name != "tensorflow":
            raise
        raise ImportError(
            f"keras_dyndp.{name} needs TensorFlow (pip install 'keras_dyndp[tensorflow]', KERAS_BACKEND unset). Keras "
            f"runs on {keras_backend()!r} here; with KERAS_BACKEND=jax and 'keras_dyndp[jax]' installed, keras_dyndp "
            f"provides {', '.join(sorted(n for n, m in _LAZY.items() if m[1]))} and the backend-neutral names."
        ) from None if module is None else error


def __dir__():
    return sorted(__all__)


# Last: load_model finds the DP optimizers in a process that only imported keras_dyndp and Keras.
_registration.register_with_keras()

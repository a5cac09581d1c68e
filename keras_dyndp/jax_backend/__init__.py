"""keras_dyndp on Keras 3's JAX backend (``KERAS_BACKEND=jax``): the DP optimizers and ``make_private``.
``keras_dyndp.DynamicDPKerasSGD`` (and Adam, Adagrad, RMSprop), ``make_private``, ``check_model`` and
``poisson_batches`` resolve to this package's when Keras runs on JAX, so the same user code trains on either backend
(docs/jax.md). What is JAX's own, module by module: docs/architecture.md, "The two backends, file by file".
``keras_dyndp[jax]`` pulls no TensorFlow."""

from keras_dyndp.core.batch_sizes import SamplingWarning
from keras_dyndp.jax_backend.data import PoissonBatches
from keras_dyndp.jax_backend.model_checks import check_model
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasAdagrad
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasAdam
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasRMSprop
from keras_dyndp.jax_backend.optimizer import DynamicDPKerasSGD
from keras_dyndp.jax_backend.optimizer import JaxDPOptimizerMixin
from keras_dyndp.jax_backend.optimizer import make_dynamic_dp_optimizer_class
from keras_dyndp.jax_backend.per_example import lora  # noqa: F401  (registers the LoRA layers' ghost rules)
from keras_dyndp.jax_backend.train_step import make_private
from keras_dyndp.rules.layer_rules import register_per_example_layer
from keras_dyndp.rules.registry import LayerRule
from keras_dyndp.rules.registry import register_layer_rule

__all__ = [
    "DynamicDPKerasAdagrad",
    "DynamicDPKerasAdam",
    "DynamicDPKerasRMSprop",
    "DynamicDPKerasSGD",
    "JaxDPOptimizerMixin",
    "LayerRule",
    "PoissonBatches",
    "SamplingWarning",
    "check_model",
    "make_dynamic_dp_optimizer_class",
    "make_private",
    "register_layer_rule",
    "register_per_example_layer",
]

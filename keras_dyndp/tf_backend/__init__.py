"""keras_dyndp on TensorFlow (Keras 2, tf_keras or Keras 3 on TensorFlow): the DP optimizers and `make_private`. What is
TensorFlow's own, module by module: docs/architecture.md, "The two backends, file by file"; the arguments, schedules,
accounting, sampler arguments and callbacks are the backend-neutral ones."""

from keras_dyndp.tf_backend.noise_source import NoiseSeedWarning
from keras_dyndp.tf_backend.ops import add_gaussian_noise
from keras_dyndp.tf_backend.ops import clip_by_global_norm_per_example
from keras_dyndp.tf_backend.ops import clip_factors
from keras_dyndp.tf_backend.ops import per_example_global_norms
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasAdagrad
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasAdam
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasRMSprop
from keras_dyndp.tf_backend.optimizer import DynamicDPKerasSGD
from keras_dyndp.tf_backend.optimizer import DynamicDPOptimizerMixin
from keras_dyndp.tf_backend.optimizer import make_dynamic_dp_optimizer_class
from keras_dyndp.tf_backend.sampling_check import SamplingWarning
from keras_dyndp.tf_backend.train_step import make_private

__all__ = [
    "DynamicDPKerasAdagrad",
    "DynamicDPKerasAdam",
    "DynamicDPKerasRMSprop",
    "DynamicDPKerasSGD",
    "DynamicDPOptimizerMixin",
    "NoiseSeedWarning",
    "SamplingWarning",
    "add_gaussian_noise",
    "clip_by_global_norm_per_example",
    "clip_factors",
    "make_dynamic_dp_optimizer_class",
    "make_private",
    "per_example_global_norms",
]

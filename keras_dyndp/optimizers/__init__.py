"""Dynamic DP-SGD Keras optimizers (see `dp_optimizer`; `DynamicDPOptimizerMixin` is their common base), the
pure-TF clip/noise mechanism they share, and the warnings they give (`NoiseSeedWarning`, `SamplingWarning`)."""

from keras_dyndp.optimizers.clip_and_noise import add_gaussian_noise
from keras_dyndp.optimizers.clip_and_noise import clip_by_global_norm_per_example
from keras_dyndp.optimizers.clip_and_noise import clip_factors
from keras_dyndp.optimizers.clip_and_noise import per_example_global_norms
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasAdagrad
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasAdam
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasRMSprop
from keras_dyndp.optimizers.dp_optimizer import DynamicDPKerasSGD
from keras_dyndp.optimizers.dp_optimizer import DynamicDPOptimizerMixin
from keras_dyndp.optimizers.dp_optimizer import make_dynamic_dp_optimizer_class
from keras_dyndp.optimizers.noise_source import NoiseSeedWarning
from keras_dyndp.optimizers.sampling_check import SamplingWarning

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
    "per_example_global_norms",
]

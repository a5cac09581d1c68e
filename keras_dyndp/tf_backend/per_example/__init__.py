"""Per-example clipped gradient sums for DP-SGD without the O(B^2) jacobian: ``clipped_gradient_sum`` (`clipped_sum`)
takes ``'vectorized'`` (`vectorized`, any model) or ``'ghost'`` (`ghost`: one batched pass, the layer rules of the
one registry, for models whose every layer is known to act per example, `per_example_layers`)."""

from keras_dyndp.rules.layer_rules import register_per_example_layer
from keras_dyndp.rules.registry import LayerRule
from keras_dyndp.rules.registry import register_layer_rule
from keras_dyndp.tf_backend.per_example import rules  # noqa: F401  (registers the built-in rules)
from keras_dyndp.tf_backend.per_example.clipped_sum import METHODS
from keras_dyndp.tf_backend.per_example.clipped_sum import clipped_gradient_sum
from keras_dyndp.tf_backend.per_example.clipped_sum import clipped_gradient_sum_with_outputs
from keras_dyndp.tf_backend.per_example.ghost import supported as ghost_supported
from keras_dyndp.tf_backend.per_example.losses import per_example_loss
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap

__all__ = [
    "METHODS",
    "GhostGradient",
    "LayerRule",
    "Tap",
    "clipped_gradient_sum",
    "clipped_gradient_sum_with_outputs",
    "ghost_supported",
    "per_example_loss",
    "register_layer_rule",
    "register_per_example_layer",
]


def __getattr__(name: str):
    """``make_private``, from `keras_dyndp.tf_backend.train_step` (which imports this package) on first use."""
    if name == "make_private":
        from keras_dyndp.tf_backend.train_step import make_private  # pylint: disable=import-outside-toplevel

        return make_private
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

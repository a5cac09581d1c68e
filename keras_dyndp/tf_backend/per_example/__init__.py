"""Per-example clipped gradient sums for DP-SGD without the O(B^2) jacobian, and the model's private train step.

DP-SGD needs, at every step, the sum over the batch of each example's gradient clipped to L2 norm C_t:
``sum_i min(1, C_t / ||g_i||) g_i``. Taking ``tape.jacobian`` of the per-example loss vector back-propagates
each of the B rows through the whole batched graph (O(B^2) work). This package offers two O(B) ways, chosen by
``clipped_gradient_sum`` (`clipped_sum`):

* ``'vectorized'`` (`vectorized`): ``tf.vectorized_map`` over single-example forward and backward passes. Any
  model (each example runs alone); materialises the B per-example gradients.
* ``'ghost'`` (`ghost`), for models whose every layer is known to act per example (`per_example_layers`;
  ``register_per_example_layer`` declares a custom one): one batched forward and backward pass records each layer's
  inputs and output gradients, and the layer's rule turns them into per-example norms and the clipped sum. The
  rules live in one registry
  (`rules`): built in for Dense, Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D, Embedding, LSTM and GRU
  (`dense`, `conv1d`, `conv2d`, `depthwise`, `embedding`, `lstm`, `gru`, with the shared algebra in `norms`),
  ``TimeDistributed`` folds handled (`time_distributed`), and ``register_layer_rule`` adds one for a
  custom layer. The same rules serve Keras 2 and Keras 3 (`keras_dyndp.tf_backend.keras_compat` names what differs).

``make_private(model)`` (`train_step`) gives a compiled model the train step that uses them with the model's
keras_dyndp DP optimizer, which adds the noise.
"""

from keras_dyndp.tf_backend.per_example.clipped_sum import METHODS
from keras_dyndp.tf_backend.per_example.clipped_sum import clipped_gradient_sum
from keras_dyndp.tf_backend.per_example.clipped_sum import clipped_gradient_sum_with_outputs
from keras_dyndp.tf_backend.per_example.ghost import supported as ghost_supported
from keras_dyndp.tf_backend.per_example.losses import per_example_loss
from keras_dyndp.tf_backend.per_example.per_example_layers import register_per_example_layer
from keras_dyndp.tf_backend.per_example.rules import LayerRule
from keras_dyndp.tf_backend.per_example.rules import register_layer_rule
from keras_dyndp.tf_backend.per_example.taps import GhostGradient
from keras_dyndp.tf_backend.per_example.taps import Tap
from keras_dyndp.tf_backend.per_example.train_step import make_private

__all__ = [
    "METHODS",
    "GhostGradient",
    "LayerRule",
    "Tap",
    "clipped_gradient_sum",
    "clipped_gradient_sum_with_outputs",
    "ghost_supported",
    "make_private",
    "per_example_loss",
    "register_layer_rule",
    "register_per_example_layer",
]

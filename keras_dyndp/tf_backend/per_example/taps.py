"""The objects of one tapped forward pass: the rows each tensor must have, the taps that layer rules fill in.

Ghost clipping (`ghost`) assumes that row i of every tapped tensor belongs to example i,
or to consecutive rows of example i where ``TimeDistributed`` folded time steps into the batch. `Rows` says which
rows a tensor must have where it is, `Tapping` checks them (``guard``) and holds the pass's taps, and a `Tap` is
what a layer rule (`keras_dyndp.tf_backend.per_example.rules`) records during one layer call. `UnsupportedModel` sends
the model to the vectorized path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras


class UnsupportedModel(Exception):
    """Raised while tracing the ghost path when the model needs the vectorized path instead."""


class Rows:
    """The rows a tapped tensor must have: one per example, or per (example, time step) inside TimeDistributed.

    ``count`` (int32 scalar tensor) and ``static`` (its value when known while tracing) are the number of rows;
    ``fold`` is the number of consecutive rows per example (1 outside TimeDistributed; None when the time axis
    is not known while tracing) and ``batch`` (int32 scalar tensor) the number of examples.
    """

    def __init__(self, count: tf.Tensor, static: int | None, fold: int | None, batch: tf.Tensor):
        self.count = count
        self.static = static
        self.fold = fold
        self.batch = batch

    @classmethod
    def of_batch(cls, x: Any) -> Rows:
        first = tf.nest.flatten(x)[0]
        batch = tf.shape(first)[0]
        return cls(batch, first.shape[0], 1, batch)

    def times(self, steps: tf.Tensor, steps_static: int | None) -> Rows:
        """The rows after folding a time axis of ``steps`` into these rows, example-major (as TimeDistributed)."""

        def product(a, b):
            return None if a is None or b is None else a * b

        return Rows(
            self.count * steps, product(self.static, steps_static), product(self.fold, steps_static), self.batch
        )


class Tapping:
    """One tapped forward pass: its taps, the rows expected where it is now, and whether each check was static.

    Every supported layer's input (and every TimeDistributed input) goes through ``guard``, which makes sure its
    leading dimension is the expected rows: compared while tracing when both are known (a mismatch means the
    layer does not see one row per example: ``UnsupportedModel``), else by a reshape to exactly that many rows,
    which raises at run time (also under XLA) instead of letting a folded tensor be clipped row by row.
    ``proven`` stays True while every check was static. ``tape`` (if any) watches each recorded pre-activation:
    the layers' variables are read through ``tf.stop_gradient``, so nothing else would make the tape record the
    rest of the forward pass.
    """

    def __init__(self, rows: Rows, tape: tf.GradientTape | None):
        self.taps: list[Tap] = []
        self.rows = [rows]
        self.proven = True
        self.tape = tape

    def guard(self, tensor: tf.Tensor, what: str) -> tf.Tensor:
        rows = self.rows[-1]
        actual = tensor.shape[0]
        if actual is not None and rows.static is not None:
            if actual != rows.static:
                raise UnsupportedModel(
                    f"{what} does not have one row per example (or per example and step): {actual} rows, "
                    f"{rows.static} expected"
                )
            return tensor
        self.proven = False
        checked = tf.reshape(tensor, tf.concat([[rows.count], tf.shape(tensor)[1:]], axis=0))
        checked.set_shape(tf.TensorShape([rows.static]).concatenate(tensor.shape[1:]))
        return checked


class Tap:
    """One tapped layer call: what its rule's call replacement records and its norms-and-sums function reads.

    A rule's call replacement computes the layer's output from ``guard(inputs)`` and ``weight(variable)`` and
    calls ``record(inputs, preactivation)`` once, where ``preactivation`` is the tensor whose gradient the
    norms-and-sums function receives (a Dense layer's output before its activation). The gradient of the summed
    loss reaches the variables only through ``preactivation``, so the rule gets per-example information and the
    batch's weight gradients are never computed.

    Attributes:
        layer: the layer.
        rows: the rows of the recorded tensors (`Rows`), set by ``record``.
        inputs: the recorded (guarded) inputs, rows first.
        preactivation: the recorded pre-activation, rows first.
        saved: any other tensors the rule keeps for its norms (e.g. LSTM's previous hidden states).
    """

    def __init__(self, layer: keras.layers.Layer, tapping: Tapping):
        self.layer = layer
        self.tapping = tapping
        self.rows: Rows | None = None
        self.inputs: tf.Tensor | None = None
        self.preactivation: tf.Tensor | None = None
        self.saved: dict[str, tf.Tensor] = {}

    def guard(self, inputs: tf.Tensor) -> tf.Tensor:
        """``inputs`` with their leading dimension checked against the rows expected here (see `Tapping`)."""
        return self.tapping.guard(inputs, f"the input of {type(self.layer).__name__} {self.layer.name!r}")

    def weight(self, variable: tf.Variable) -> tf.Tensor:
        """The variable's value without a gradient path: a gradient that still reaches the variable then comes
        from a use outside this tapped call (tied weights), which the ghost driver detects."""
        return tf.stop_gradient(variable)

    def record(self, inputs: tf.Tensor, preactivation: tf.Tensor) -> None:
        """Records the layer's input and pre-activation of this call (a second call of the layer is refused)."""
        if self.inputs is not None:
            raise UnsupportedModel(f"layer {self.layer.name!r} is called more than once per forward pass")
        self.rows = self.tapping.rows[-1]
        self.inputs = inputs
        self.preactivation = preactivation
        if self.tapping.tape is not None:
            self.tapping.tape.watch(preactivation)


class GhostGradient(NamedTuple):
    """One variable's per-example gradients, as a rule's norms-and-sums function returns them.

    Attributes:
        variable: the layer's variable.
        squared_norms: float [B], the squared L2 norm of each example's gradient of this variable.
        clipped_sum: a function from the clipping factors f [B] to sum_i f_i g_i, shaped like ``variable``.
    """

    variable: tf.Variable
    squared_norms: tf.Tensor
    clipped_sum: Callable[[tf.Tensor], tf.Tensor]

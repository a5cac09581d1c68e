"""The objects of one tapped forward pass (`ghost`): the rows each tensor must have (`Rows`), their check and the
pass's taps (`Tapping`), what a layer rule records in one call (`Tap`) and returns (`GhostGradient`).
`UnsupportedModel` sends the model to the vectorized path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from typing import NamedTuple

import tensorflow as tf

from keras_dyndp.tf_backend.keras_compat import keras


class UnsupportedModel(Exception):
    """Raised while tracing the ghost path when the model needs the vectorized path instead."""


class Rows(NamedTuple):
    """The rows a tapped tensor must have: ``count`` (int32; ``static`` when known while tracing), ``fold`` per
    example (1 outside TimeDistributed; None for an unknown time axis), ``batch`` (int32) examples."""

    count: tf.Tensor
    static: int | None
    fold: int | None
    batch: tf.Tensor

    @classmethod
    def of_batch(cls, x: Any) -> Rows:
        first = tf.nest.flatten(x)[0]
        batch = tf.shape(first)[0]
        return cls(batch, first.shape[0], 1, batch)

    def times(self, steps: tf.Tensor, steps_static: int | None) -> Rows:
        """The rows after folding a time axis of ``steps`` into these rows, example-major (as TimeDistributed)."""
        times = lambda rows: None if rows is None or steps_static is None else rows * steps_static  # noqa: E731
        return Rows(self.count * steps, times(self.static), times(self.fold), self.batch)


class Tapping:
    """One tapped pass: its taps, the rows expected where it is, ``proven`` (every check static so far) and the
    ``tape`` that watches each recorded pre-activation. ``guard`` checks a leading dimension while tracing (mismatch:
    ``UnsupportedModel``), else by a reshape to exactly that many rows that fails at run time (also under XLA)."""

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
    """One tapped layer call. The rule's call computes the output from ``guard(inputs)`` and ``weight(variable)``
    and calls ``record(inputs, preactivation)`` once; the norms-and-sums function gets the gradient of the loss with
    respect to ``preactivation`` (e.g. Dense's output before its activation), and may read ``rows``, ``inputs`` and
    ``saved`` (other tensors the rule keeps, e.g. LSTM's previous hidden states)."""

    def __init__(self, layer: keras.layers.Layer, tapping: Tapping):
        self.layer = layer
        self.tapping = tapping
        self.rows = self.inputs = self.preactivation = None  # Set by ``record``.
        self.gradient = None  # The loss's gradient at ``preactivation``, set by `ghost` before any rule runs.
        self.saved: dict[str, tf.Tensor] = {}

    def guard(self, inputs: tf.Tensor) -> tf.Tensor:
        """``inputs`` with their leading dimension checked against the rows expected here (see `Tapping`)."""
        return self.tapping.guard(inputs, f"the input of {type(self.layer).__name__} {self.layer.name!r}")

    def weight(self, variable: tf.Variable) -> tf.Tensor:
        """The variable's value without a gradient path (a gradient that still reaches it reveals tied weights)."""
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
    """One variable's per-example gradients: their squared L2 norms [B] and a function from the clipping factors
    f [B] to sum_i f_i g_i, shaped like ``variable``."""

    variable: tf.Variable
    squared_norms: tf.Tensor
    clipped_sum: Callable[[tf.Tensor], tf.Tensor]

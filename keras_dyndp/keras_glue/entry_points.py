"""Which data each Keras 3 entry point hands a made-private model, for the checks of its sampling (both backends):
`DataSeen` records it where Keras 3 hands it to the model's ``_symbolic_build`` (JAX) or ``_maybe_symbolic_build``
(TensorFlow), also when the entry point is called unbound, for the next ``make_train_function`` to check; nothing seen
(`UNSEEN_BATCHES`) is warned. docs/privacy.md, "Which entry points are covered, and how"."""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

UNSEEN_BATCHES = (
    "keras_dyndp cannot see the batches of this training step (a custom training loop or train step, or "
    "model.train_function called directly)"
)
"""The `keras_dyndp.core.batch_sizes.SamplingWarning`'s problem when no entry point showed the data."""

FIT = "model.fit"
TRAIN_ON_BATCH = "model.train_on_batch"


def _x_of(data: Any) -> Any:
    """``x`` of Keras's ``(x, y, sample_weight)`` packing (a tuple of 1 to 3, or ``x`` alone)."""
    return data[0] if isinstance(data, (list, tuple)) else data


def _fit_input(adapter: Any) -> Any:
    """The ``x`` that ``fit`` received, from its Keras 3 data adapter (the adapter itself where it is not held)."""
    for name in ("py_dataset", "generator"):  # PyDatasetAdapter, GeneratorDataAdapter
        if hasattr(adapter, name):
            return getattr(adapter, name)
    inputs = getattr(adapter, "_inputs", None)  # ArrayDataAdapter: (x, y, sample_weight) packed
    if inputs is not None:
        return _x_of(inputs)
    return getattr(adapter, "_dataset", adapter)  # TFDatasetAdapter: the tf.data.Dataset (without class weights)


class DataSeen:
    """The data the last Keras entry point showed one model, until its next ``make_train_function`` takes it."""

    def __init__(self):
        self._pending: tuple[str, Any] | None = None
        self._fit: tuple[str, Any] | None = None
        self._yields_batches_of: Callable[[Any, Any], bool] = operator.is_

    def record(self, iterator: Any = None, data_batch: Any = None) -> None:
        """What ``_symbolic_build(iterator=..., data_batch=...)`` received: ``fit``'s (or ``evaluate``'s) epoch
        iterator, or ``train_on_batch``'s (or ``test_on_batch``'s) batch, unless make_private's own
        ``train_on_batch`` recorded the batch as the user gave it (`record_call`; JAX converts it first)."""
        if iterator is not None and hasattr(iterator, "data_adapter"):
            self._pending = self._checked_as(_fit_input(iterator.data_adapter))
        elif data_batch is not None and (self._pending is None or self._pending[0] != TRAIN_ON_BATCH):
            self._pending = (TRAIN_ON_BATCH, _x_of(data_batch))

    def record_call(self, caller: str, x: Any) -> None:
        """What make_private's own ``fit`` or ``train_on_batch`` (``caller``) received (Keras 2 shows it nowhere)."""
        self._pending = (caller, x)

    @contextlib.contextmanager
    def fit_call(self, x: Any, yields_batches_of: Callable[[Any, Any], bool] | None = None) -> Iterator[None]:
        """Within make_private's own ``fit``, which received ``x``: ``x`` is what its checks see where the data
        Keras's ``fit`` then receives yields ``x``'s batches one for one (``yields_batches_of(received, x)``; default:
        it is ``x``), as when the model's class maps a preprocessing over them (KerasHub's task models); data the
        model's class re-cut, filtered, shuffled or repeated is checked itself (`received_by_fit`)."""
        record = self._pending = self._fit = (FIT, x)
        self._yields_batches_of = yields_batches_of or operator.is_
        try:
            yield
        finally:  # A fit that failed before its train function was made leaves nothing for a later entry point.
            self._fit, self._yields_batches_of = None, operator.is_
            if self._pending is record:
                self._pending = None

    def received_by_fit(self, received: Any) -> tuple[str, Any]:
        """``(FIT, x)``: what the checks see of ``received``, the data Keras's own ``fit`` received (Keras 2 shows it
        only in that call's frame): make_private's own ``fit``'s ``x`` where ``received`` yields its batches one for
        one (`fit_call`), else ``received``. Clears what was recorded."""
        self._pending = None
        return self._checked_as(received)

    def _checked_as(self, received: Any) -> tuple[str, Any]:
        if self._fit is not None and self._yields_batches_of(received, self._fit[1]):
            return self._fit
        return FIT, received

    def take(self) -> tuple[str, Any] | None:
        """``(caller, x)`` recorded since the last call, or None when no entry point showed the data."""
        pending, self._pending = self._pending, None
        return pending

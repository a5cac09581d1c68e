"""Registers the DP optimizers with Keras (for ``load_model`` in a process that only imported keras and keras_dyndp) as
soon as Keras is imported, without importing TensorFlow at ``import keras_dyndp`` (the accounting and ``dyndp-privacy``
do without); only TensorFlow and JAX register. Also the lookups Keras gives no hook for, read from the call stack
(`keras_model_calling`, `keras_entry_data`; why: docs/architecture.md, "Where each check lives")."""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import inspect
import sys
from collections.abc import Iterator
from typing import Any

from keras_dyndp import backend

_KERAS_MODULES = ("keras", "tf_keras", "tensorflow")  # Whose import makes Keras usable.


def register_with_keras() -> None:
    """Registers the DP optimizers now if Keras or TensorFlow is imported, else once the first of them has been and no
    import of them is in progress (each imports the other): a hook on ``sys.meta_path``."""
    if any(name in sys.modules for name in _KERAS_MODULES):
        _register()
    elif not any(isinstance(finder, _RegisterAfterKerasImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterAfterKerasImport())


def _register() -> None:
    if backend.implementation_name() is not None:  # the backend's optimizers register on import
        backend.implementation("optimizer")


class _RegisterAfterKerasImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loaders of `_KERAS_MODULES` to register once their imports have finished."""

    def __init__(self):
        self._searching: set[str] = set()
        self._importing: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        del path, target
        if fullname not in _KERAS_MODULES or fullname in self._searching:
            return None
        self._searching.add(fullname)  # The search below must not come back here.
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RegisteringLoader(spec.loader, self, fullname)
        return spec

    @contextlib.contextmanager
    def executing(self, fullname: str) -> Iterator[None]:
        """Around the loader's execution of `fullname` (a find_spec alone imports nothing): registers (once) after it
        succeeds when no import of a Keras module is in progress."""
        self._importing.add(fullname)
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            self._importing.discard(fullname)
            if succeeded and not self._importing and self in sys.meta_path:
                sys.meta_path.remove(self)
                if not _inside_keras_dyndp_import():
                    _register()


def _inside_keras_dyndp_import() -> bool:
    """Whether a keras_dyndp module is executing its imports (the optimizers could meet it half-initialised)."""
    return any(
        frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__", "").startswith("keras_dyndp.")
        for frame in _callers()
    )


# Deep enough for Keras's fit -> tf.function tracing -> distribution -> train_step -> optimizer chain (~40 frames).
_MAX_FRAMES = 200


def keras_model_calling(optimizer: Any, model_class: type, caller: str | None = None) -> Any:
    """The nearest ``model_class`` instance on the call stack whose ``optimizer`` (or its ``inner_optimizer``, under
    mixed precision) is `optimizer`, or None (a custom training loop); with `caller`, found in a frame of a method of
    that name only (``'compile_from_config'``: ``load_model`` is building it). Reads no data and keeps no frame."""
    for depth, frame in enumerate(_callers()):
        if depth == _MAX_FRAMES:
            return None
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, model_class) and caller in (None, frame.f_code.co_name):
            if compiled_with(candidate, optimizer):
                return candidate
    return None


def compiled_with(model: Any, optimizer: Any) -> bool:
    """Whether ``model`` is compiled with ``optimizer`` (or with a loss-scale wrapper of it)."""
    compiled = getattr(model, "optimizer", None)
    return compiled is not None and optimizer in (compiled, getattr(compiled, "inner_optimizer", compiled))


def keras_entry_data(model: Any, entries: dict[Any, str]) -> tuple[str, Any] | None:
    """``(entry, x)``: the data of the Keras entry point that called into keras_dyndp here (the first frame outside
    the package, as Keras 2's ``fit`` calls the model's ``make_train_function``), where that frame runs one of
    ``entries`` (code object -> entry name, ``'model.fit'``) on ``model``; None otherwise. Keras 2's entry points show
    their data to no call on the model. Reads that frame's ``x`` only and keeps no frame."""
    for frame in _callers():
        if frame.f_globals.get("__name__", "").startswith("keras_dyndp."):
            continue
        entry = entries.get(frame.f_code)
        if entry is None or frame.f_locals.get("self") is not model:
            return None
        return entry, frame.f_locals.get("x")
    return None


def _callers() -> Iterator[Any]:
    """The frames from the one iterating over this generator outward, innermost first."""
    frame = inspect.currentframe().f_back
    try:
        while frame is not None:
            yield frame
            frame = frame.f_back
    finally:
        del frame


class _RegisteringLoader(importlib.abc.Loader):
    """The loader of a Keras module, telling the finder when the module has been executed."""

    def __init__(self, loader, finder: _RegisterAfterKerasImport, fullname: str):
        self._loader, self._finder, self._fullname = loader, finder, fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        with self._finder.executing(self._fullname):
            self._loader.exec_module(module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the wrapped loader's.
        return getattr(self._loader, name)

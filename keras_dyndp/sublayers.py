"""The layers a Keras layer holds, on every Keras (3, and Keras 2 / tf_keras): the one place the package walks them."""

from __future__ import annotations

from typing import Any


def layers(layer: Any, include_self: bool = True, recursive: bool = True) -> list:
    """The layers of ``layer`` (a model, a wrapper or a layer): itself (``include_self``), its sublayers and theirs
    (``recursive``), however they are held (attributes, lists, dicts)."""
    # Layer._flatten_layers (Keras 3, Keras 2 and tf_keras alike): no public API walks the sublayers a layer holds in
    # its attributes (Model.layers lists a model's top level only).
    return list(layer._flatten_layers(include_self=include_self, recursive=recursive))  # noqa: SLF001

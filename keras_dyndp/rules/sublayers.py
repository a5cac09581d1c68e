"""The layers a Keras layer holds and the calls Keras recorded of it, on every Keras: the one place they are read."""

from __future__ import annotations

from typing import Any


def layers(layer: Any, include_self: bool = True, recursive: bool = True) -> list:
    """The layers of ``layer`` (a model, a wrapper or a layer): itself (``include_self``), its sublayers and theirs
    (``recursive``), however they are held (attributes, lists, dicts)."""
    # Layer._flatten_layers (Keras 3, Keras 2 and tf_keras alike): no public API walks the sublayers a layer holds in
    # its attributes (Model.layers lists a model's top level only).
    return list(layer._flatten_layers(include_self=include_self, recursive=recursive))  # noqa: SLF001


def recorded_calls(layer: Any) -> list[tuple[Any, Any]]:
    """``(args, kwargs)`` of each call of ``layer`` (a layer or an operation) recorded in a functional model."""
    calls = []
    # Layer._inbound_nodes: no public API lists the calls a functional model recorded of a layer.
    for node in getattr(layer, "_inbound_nodes", ()):
        arguments = getattr(node, "arguments", None)  # Keras 3's; Keras 2's node holds them itself
        calls.append((node.call_args, node.call_kwargs) if arguments is None else (arguments.args, arguments.kwargs))
    return calls

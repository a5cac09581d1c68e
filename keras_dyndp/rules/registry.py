"""The one registry of ghost-clipping rules, for both backends: for each layer class (exactly, not its subclasses)
its `LayerRule` (the contract of `keras_dyndp.rules.layer_rules`), or the declaration that it acts per example. The
backend Keras runs on fills it with its built-in rules before the first lookup or registration, by importing its
rules module once; rules for the classes of optional packages (KerasHub's, `keras_hub_rules`) are named by module and
qualified name and registered at the first lookup after their module is imported, never importing it
(docs/architecture.md, "The ghost-rule registry")."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import types
from collections.abc import Callable
from typing import Any

from keras_dyndp import backend
from keras_dyndp.core import validation


@dataclasses.dataclass(frozen=True)
class LayerRule:
    """How ghost clipping handles one layer class: `register_layer_rule`'s parts.

    Attributes:
      variables: ``variables(layer)``: the trainable variables the rule covers (its sublayers' too); None with
        ``call``.
      norms_and_sums: ``norms_and_sums(layer, a, g)``, a the layer's input and g the loss's gradient at its
        pre-activation, each [B, rows, ...]: the per-example squared norms [B] of the covered variables' gradients
        together and a function ``factors -> [clipped weighted sum per variable]``. With ``call``, the tapped form
        ``norms_and_sums(tap, g)``: one ``GhostGradient`` per trainable variable.
      supports: ``supports(layer)``: whether the rule covers this layer's configuration; None: always.
      call: TensorFlow's built-in rules' override of the tapping, under the same contract: ``call(tap)`` returns
        the layer's call for the tapped pass (`keras_dyndp.tf_backend.per_example.taps.Tap`). None (every other
        rule): the backend taps the layer's own call.
    """

    variables: Callable[[Any], list] | None
    norms_and_sums: Callable
    supports: Callable[[Any], bool] | None = None
    call: Callable | None = None


@dataclasses.dataclass(frozen=True)
class Hooks:
    """What the backend Keras runs on adds to the registry, installed once by its rules module (`install`): its
    ``name`` for messages, ``layer_base`` (rules are registered for its subclasses), ``keep`` (a ``norms_and_sums`` as
    stored: on TensorFlow, run without AutoGraph, which would convert it at each first trace) and ``tapped_sublayer``
    (`sublayer_norms_and_sums` for a rule with ``call``; None where ``call=`` is refused) and ``overrides``: its own
    form of a `register_by_name` rule, by the rule function's module and qualified name (TensorFlow's
    ``ReversibleEmbedding``, whose tapped form also covers the reverse call)."""

    name: str
    layer_base: type
    keep: Callable[[Callable], Callable] = lambda function: function
    tapped_sublayer: Callable | None = None
    overrides: dict[str, Callable[[], dict]] = dataclasses.field(default_factory=dict)


_RULES: dict[type, LayerRule] = {}
_PER_EXAMPLE: dict[type, Callable[[Any], bool] | None] = {}
_BACKEND = types.SimpleNamespace(hooks=None, named=False)
# Rules by the class's (module, qualified name), not yet registered: `register_by_name`.
_BY_NAME: dict[tuple[str, str], Callable[[], dict]] = {}


def install(hooks: Hooks) -> None:
    """Installs the backend's `Hooks`: its rules module calls this on import, before it registers its rules."""
    _BACKEND.hooks = hooks


def _hooks() -> Hooks:
    """The backend's `Hooks`, its built-in rules registered (its rules module imported on first use)."""
    if _BACKEND.hooks is None:
        backend.implementation("per_example.rules")
    if not _BACKEND.named:  # the backend's package may have imported its rules module itself
        _BACKEND.named = True
        importlib.import_module("keras_dyndp.rules.keras_hub_rules")  # its rules by class name
    if _BY_NAME:
        _register_imported(_BACKEND.hooks)
    return _BACKEND.hooks


def register_by_name(module: str, qualname: str, rule: Callable[[], dict]) -> None:
    """Registers ``rule()`` (`register_layer_rule`'s keyword arguments) for the class ``qualname`` of ``module`` at
    the first lookup after that module is imported, unless a rule or declaration is registered for the class by then
    (a user's stays); nothing imports the module: for the layers of optional packages (KerasHub).

    Args:
      module: the class's ``__module__``, e.g. ``'keras_hub.src.models.llama.llama_layernorm'``.
      qualname: the class's ``__qualname__`` in it, e.g. ``'LlamaLayerNorm'``.
      rule: returns the rule's ``register_layer_rule`` keyword arguments (``variables``, ``norms_and_sums``,
        ``supports``; or ``per_example=True``).
    """
    _BY_NAME[(module, qualname)] = rule


def _register_imported(hooks: Hooks) -> None:
    """Registers the `register_by_name` rules whose module is imported (and defines the class by now)."""
    for key in [key for key in _BY_NAME if key[0] in sys.modules]:
        qualname = key[1]
        found = functools.reduce(
            lambda owner, name: getattr(owner, name, None), qualname.split("."), sys.modules[key[0]]
        )
        if not isinstance(found, type):  # the module is still being imported
            continue
        rule = _BY_NAME.pop(key)
        rule = hooks.overrides.get(f"{rule.__module__}.{rule.__qualname__}", rule)
        if issubclass(found, hooks.layer_base) and found not in _RULES and found not in _PER_EXAMPLE:
            _store(hooks, found, **rule())


def register_layer_rule(
    layer_class: type,
    *,
    variables: Callable[[Any], list] | None = None,
    norms_and_sums: Callable | None = None,
    supports: Callable[[Any], bool] | None = None,
    per_example: bool = False,
    call: Callable | None = None,
) -> None:
    """Registers (or replaces) the ghost-clipping rule of exactly ``layer_class`` (the contract of
    `keras_dyndp.rules.layer_rules`; docs/usage.md), or declares that it acts per example. The same on both backends.

    A wrong rule breaks privacy silently: check it against ``make_private(model, method='vectorized')``.

    Args:
      layer_class: the Keras layer class the rule covers (not its subclasses).
      variables: ``variables(layer)``: the trainable variables the rule covers (`LayerRule.variables`).
      norms_and_sums: ``norms_and_sums(layer, a, g)``: the per-example squared norms [B] and the weighted-sum
        function (`LayerRule.norms_and_sums`). On TensorFlow it runs without AutoGraph (control flow on tensors
        needs ``tf.cond`` / ``tf.while_loop``).
      supports: ``supports(layer)``: whether the rule (or declaration) covers this layer's configuration; None
        (default): always.
      per_example: instead of a rule, declares that the class's own call acts on each example alone (row i of its
        output depends on row i of its inputs alone: no batch statistics, mixing of rows, use of a row's position
        or random draws) and reads no variable of its sublayers, which need rules of their own.
      call: TensorFlow's tapped form (its built-in rules'), instead of ``variables``: ``call(tap)`` returns the
        layer's tapped call and ``norms_and_sums(tap, g)`` one ``GhostGradient`` per variable (`LayerRule.call`).

    Raises:
      TypeError: if ``layer_class`` is not a Keras layer class, a part is not callable, a rule's parts come with
        ``per_example=True``, or ``call`` is given on a backend without the tapped form (JAX).
    """
    _store(_hooks(), layer_class, variables, norms_and_sums, supports, per_example, call)


def _store(
    hooks: Hooks,
    layer_class: type,
    variables: Callable | None = None,
    norms_and_sums: Callable | None = None,
    supports: Callable | None = None,
    per_example: bool = False,
    call: Callable | None = None,
) -> None:
    """`register_layer_rule` with the backend's ``hooks`` given (checked, then stored)."""
    if call is not None and hooks.tapped_sublayer is None:
        raise TypeError(
            f"`call` is TensorFlow's tapped form of its built-in rules; Keras runs on {hooks.name} here: give the rule "
            f"as `variables` and `norms_and_sums(layer, a, g)`. Received: call={call!r}."
        )
    check_registration(layer_class, hooks.layer_base, variables, norms_and_sums, supports, per_example, call)
    if per_example:
        _PER_EXAMPLE[layer_class] = supports
    else:
        _RULES[layer_class] = LayerRule(variables, hooks.keep(norms_and_sums), supports, call)


def check_registration(
    layer_class: Any,
    layer_base: type,
    variables: Any,
    norms_and_sums: Any,
    supports: Any,
    per_example: bool,
    call: Any = None,
) -> None:
    """`register_layer_rule`'s arguments: TypeError unless ``layer_class`` subclasses ``layer_base`` and, for a rule,
    ``norms_and_sums`` and either ``variables`` or ``call`` are callable; for ``per_example=True``, none is given
    (``supports``, optional, is callable either way)."""
    parts = {"variables": variables, "norms_and_sums": norms_and_sums, "supports": supports}
    if call is not None:
        if variables is not None or per_example:
            raise TypeError(
                "`call` (the tapped form) takes neither `variables` nor `per_example=True`: leave them out. "
                f"Received: variables={variables!r}, per_example={per_example!r}."
            )
        parts = {"call": call, "norms_and_sums": norms_and_sums, "supports": supports}
    elif per_example:
        given = [name for name in ("variables", "norms_and_sums") if parts.pop(name) is not None]
        if given:
            raise TypeError(
                f"`per_example=True` declares a layer without a rule of its own: leave out {', '.join(given)}. "
                f"Received: per_example={per_example!r}."
            )
    validation.check_layer_rule(layer_class, layer_base, parts, optional=("supports",))


def registered() -> dict[type, LayerRule]:
    """The registry itself (layer class -> its rule), with the backend's built-in rules."""
    _hooks()
    return _RULES


def rule_for(layer: Any, layer_class: type | None = None) -> LayerRule | None:
    """The rule that covers ``layer`` (its exact class, or ``layer_class``'s rule applied to it, and its
    configuration), or None."""
    rule = registered().get(type(layer) if layer_class is None else layer_class)
    if rule is None or (rule.supports is not None and not rule.supports(layer)):
        return None
    return rule


def acts_per_example(layer: Any) -> bool:
    """Whether ``layer``'s exact class is declared to act per example, in a configuration its condition covers."""
    _hooks()
    if type(layer) not in _PER_EXAMPLE:
        return False
    condition = _PER_EXAMPLE[type(layer)]
    return condition is None or bool(condition(layer))


def sublayer_norms_and_sums(layer: Any, a: Any, g: Any, layer_class: type | None = None) -> tuple[list, Any, Callable]:
    """`keras_dyndp.rules.layer_rules.sublayer_norms_and_sums`: ``(variables, squared norms, sums)`` by the rule of
    ``layer``'s class (or ``layer_class``'s); ValueError where none supports it."""
    rule = rule_for(layer, layer_class)
    if rule is None:
        raise ValueError(f"no ghost rule supports layer {layer.name!r} ({type(layer).__name__})")
    if rule.call is not None:
        return _hooks().tapped_sublayer(rule, layer, a, g)
    return (rule.variables(layer), *rule.norms_and_sums(layer, a, g))

"""keras_dyndp.rules.registry, on the backend Keras runs on (every stack): one `LayerRule` type and one
`register_layer_rule` signature on both backends, the built-in rules covering the same Keras layer classes on both
but for the gaps stated here, TensorFlow's tapped form (``call=``) refused on JAX, and the built-ins registered
before the first lookup."""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import subprocess
import sys

import pytest

import keras_dyndp
from keras_dyndp import backend
from keras_dyndp.rules import registry

PACKAGE = pathlib.Path(registry.__file__).resolve().parents[1]

# The Keras layer classes with a built-in rule (those this Keras has: RMSNormalization is Keras 3.9's).
BUILT_IN = {
    "Dense",
    "EinsumDense",
    "Conv1D",
    "Conv2D",
    "DepthwiseConv2D",
    "SeparableConv2D",
    "Embedding",
    "LSTM",
    "GRU",
    "LayerNormalization",
    "GroupNormalization",
    "RMSNormalization",
    "Attention",
    "AdditiveAttention",
    "ReversibleEmbedding",  # Keras 3.12's, by name (keras_dyndp.rules.keras_hub_rules)
}
# The classes one backend has no rule for yet (a model with one keeps the per-example path there). A rule added or
# removed on one backend changes this set: update it, and docs/architecture.md's table of the rules.
GAPS = {"tensorflow": set(), "jax": {"LSTM", "GRU"}}
# The backend's package that re-exports the registry's names.
BACKEND_PACKAGES = {"tensorflow": "keras_dyndp.tf_backend.per_example", "jax": "keras_dyndp.jax_backend"}


def _layers():
    return backend.keras_module().layers


def test_built_in_rules_cover_the_known_keras_layers_but_the_stated_gaps():
    layers = _layers()
    keras_classes = {value for value in vars(layers).values() if isinstance(value, type)}
    registered = {cls.__name__ for cls in registry.registered() if cls in keras_classes}
    expected = {name for name in BUILT_IN if hasattr(layers, name)} - GAPS[backend.keras_backend()]
    assert registered == expected


def test_one_register_layer_rule_with_one_signature_on_every_backend():
    assert list(inspect.signature(registry.register_layer_rule).parameters) == [
        "layer_class",
        "variables",
        "norms_and_sums",
        "supports",
        "per_example",
        "call",
    ]
    parameters = list(inspect.signature(registry.register_layer_rule).parameters.values())
    assert all(parameter.kind is inspect.Parameter.KEYWORD_ONLY for parameter in parameters[1:])
    package = importlib.import_module(BACKEND_PACKAGES[backend.keras_backend()])
    assert keras_dyndp.register_layer_rule is registry.register_layer_rule is package.register_layer_rule
    assert keras_dyndp.LayerRule is registry.LayerRule is package.LayerRule


def _defined(name: str) -> list[str]:
    """The modules of the package that define a function or class ``name``."""
    return sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name
    )


@pytest.mark.parametrize("name", ["LayerRule", "register_layer_rule", "rule_for", "acts_per_example"])
def test_the_registry_is_defined_once_for_both_backends(name):
    assert _defined(name) == ["rules/registry.py"]


def test_every_rule_is_a_layer_rule():
    assert registry.registered()
    assert all(isinstance(rule, registry.LayerRule) for rule in registry.registered().values())


def test_the_tapped_form_is_tensorflows_only():
    class Tapped(_layers().Layer):
        """A layer registered in the tapped form."""

    def tapped_call(tap):
        return tap.layer.call

    def norms_and_sums(tap, g):
        return []

    if backend.keras_backend() == "jax":
        with pytest.raises(TypeError, match="`call` is TensorFlow's tapped form .* Received: call="):
            keras_dyndp.register_layer_rule(Tapped, call=tapped_call, norms_and_sums=norms_and_sums)
        assert Tapped not in registry.registered()
        return
    try:
        keras_dyndp.register_layer_rule(Tapped, call=tapped_call, norms_and_sums=norms_and_sums)
        rule = registry.rule_for(Tapped())
        assert rule.call is tapped_call and rule.variables is None
    finally:
        registry.registered().pop(Tapped, None)
    with pytest.raises(TypeError, match="takes neither `variables`"):
        keras_dyndp.register_layer_rule(Tapped, call=tapped_call, norms_and_sums=norms_and_sums, variables=list)


def test_per_example_declarations_take_no_rule_parts():
    class Wiring(_layers().Layer):
        """A layer declared to act per example."""

    with pytest.raises(TypeError, match="leave out variables"):
        keras_dyndp.register_layer_rule(Wiring, per_example=True, variables=lambda layer: [])
    with pytest.raises(TypeError, match="`layer_class` must be a Keras layer class"):
        keras_dyndp.register_layer_rule(object, per_example=True)
    assert not registry.acts_per_example(Wiring())


def _printed_by_a_fresh_process(code: str) -> str:
    """The last line ``code`` prints, run by a new Python process (nothing imported or registered before)."""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return result.stdout.strip().splitlines()[-1]


def test_the_first_lookup_finds_the_built_in_rules():
    code = (
        "from keras_dyndp import backend; from keras_dyndp.rules import registry; "
        "print(registry.rule_for(backend.keras_module().layers.Dense(2)) is not None)"
    )
    assert _printed_by_a_fresh_process(code) == "True"


class _Named(backend.keras_module().layers.Layer):
    """A layer class given a rule by name."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")


class _NamedAndRegistered(_Named):
    """A layer class given a rule by name after its user registered one."""


def test_a_rule_by_name_is_registered_at_the_first_lookup_unless_one_is_registered_already():
    from keras_dyndp.rules import layer_rules  # pylint: disable=import-outside-toplevel

    users = layer_rules.rms_normalization()
    keras_dyndp.register_layer_rule(_NamedAndRegistered, **users)
    try:
        for cls in (_Named, _NamedAndRegistered):
            registry.register_by_name(cls.__module__, cls.__qualname__, layer_rules.rms_normalization)
        assert _Named in registry.registered()
        assert registry.registered()[_NamedAndRegistered].variables is users["variables"]
        assert registry.rule_for(_Named()) is None  # unbuilt: no scale yet
        layer = _Named()
        layer.build((None, 3))
        assert registry.rule_for(layer).variables(layer) == [layer.scale]
    finally:
        for cls in (_Named, _NamedAndRegistered):
            registry.registered().pop(cls, None)


def test_the_keras_hub_rules_import_no_keras_hub():
    code = (
        "import sys; from keras_dyndp.rules import registry; registry.registered(); "
        "print('keras_hub' in sys.modules, 'keras_dyndp.rules.keras_hub_rules' in sys.modules)"
    )
    assert _printed_by_a_fresh_process(code) == "False True"

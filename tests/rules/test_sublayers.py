"""Tests for keras_dyndp/rules/sublayers.py: the walk of a layer's sublayers, on the backend Keras runs on."""

from __future__ import annotations

from keras_dyndp import backend
from keras_dyndp.rules import sublayers


def _keras():
    if backend.keras_backend() == "jax":
        import keras  # pylint: disable=import-outside-toplevel

        return keras
    from keras_dyndp.tf_backend.keras_compat import keras  # pylint: disable=import-outside-toplevel

    return keras


def test_layers_finds_nested_sublayers_held_in_attributes_and_lists():
    keras = _keras()

    class Block(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.inner = keras.layers.Dense(3)
            self.stack = [keras.layers.Dense(2), keras.layers.Dense(1)]

        def call(self, inputs):
            return self.stack[1](self.stack[0](self.inner(inputs)))

    block = Block()
    model = keras.Sequential([keras.Input((4,)), block])
    found = sublayers.layers(model)
    assert model in found and block in found and block.inner in found and all(d in found for d in block.stack)
    assert model not in sublayers.layers(model, include_self=False)
    assert block.inner not in sublayers.layers(model, recursive=False)


def test_recorded_calls_gives_each_call_of_a_layer_in_a_functional_model():
    keras = _keras()
    shared = keras.layers.Dense(2)
    first, second = keras.Input((3,)), keras.Input((3,))
    keras.Model([first, second], keras.layers.Add()([shared(first), shared(second)]))
    calls = sublayers.recorded_calls(shared)
    assert [len(args) for args, _ in calls] == [1, 1]
    assert calls[0][0][0] is first and calls[1][0][0] is second
    assert sublayers.recorded_calls(keras.layers.Dense(2)) == []  # never called: nothing recorded

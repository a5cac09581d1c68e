"""Tests for keras_dyndp.jax_backend.embedding_taps: norms and clipped sums from row gradients, and which layers."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

from keras_dyndp.jax_backend import embedding_taps  # noqa: E402


def _dense_gradients(ids, deltas, vocabulary):
    """Per-example table gradients [B, V, D] by scatter-add: the reference."""
    grads = np.zeros((ids.shape[0], vocabulary, deltas.shape[-1]))
    for example in range(ids.shape[0]):
        np.add.at(grads[example], ids[example], deltas[example])
    return grads


def test_norms_and_clipped_sum_equal_the_dense_per_example_gradients():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, size=(5, 9))  # 9 tokens from 6 ids: repeats in every row
    deltas = rng.normal(size=(5, 9, 3))
    factors = rng.uniform(size=5)
    dense = _dense_gradients(ids, deltas, 6)
    np.testing.assert_allclose(
        embedding_taps.squared_norms(jax.numpy.asarray(ids), jax.numpy.asarray(deltas, "float32")),
        np.sum(dense**2, axis=(1, 2)),
        rtol=1e-5,
    )
    np.testing.assert_allclose(
        embedding_taps.clipped_sum((6, 3), jax.numpy.asarray(ids), jax.numpy.asarray(deltas, "float32"), factors),
        np.tensordot(factors, dense, axes=1),
        rtol=1e-5,
        atol=1e-6,
    )


def test_candidates_are_trainable_embeddings_whose_table_no_other_layer_holds():
    own = keras.layers.Embedding(10, 4)
    frozen = keras.layers.Embedding(10, 4)
    frozen.trainable = False
    inputs = keras.Input((3,), dtype="int32")
    pooled = [keras.layers.GlobalAveragePooling1D()(layer(inputs)) for layer in (own, frozen)]
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Concatenate()(pooled)))
    found = embedding_taps.candidates(model)
    assert list(found) == [id(own)] and found[id(own)][1] == 0
    assert own._keras_dyndp_tapped and not getattr(frozen, "_keras_dyndp_tapped", False)
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(own(ids), np.asarray(own.embeddings)[ids])  # no session: the original call


def test_an_embedding_inside_a_subclassed_model_is_not_tapped():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.embedding = keras.layers.Embedding(10, 4)

        def call(self, inputs):
            return keras.ops.mean(self.embedding(inputs), axis=1) @ keras.ops.transpose(self.embedding.embeddings)

    model = Subclassed()
    model(np.zeros((1, 3), "int32"))
    assert embedding_taps.candidates(model) == {}
    wrapped = keras.Sequential([keras.Input((3,), dtype="int32"), model])  # a wiring model above does not help
    assert embedding_taps.candidates(wrapped) == {}


def _values(model):
    return [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]


def test_a_table_read_outside_its_layers_call_is_not_tapped():
    """Tied weights in a functional model (the table also the output projection, through a Lambda here): the taps
    would miss that read's gradient (issue 25: relative error 0.563), so the table keeps the vmap path."""
    inputs = keras.Input((3,), dtype="int32")
    tied, untied = keras.layers.Embedding(10, 4), keras.layers.Embedding(10, 4)
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Add()([tied(inputs), untied(inputs)]))
    output = keras.layers.Lambda(lambda h: keras.ops.matmul(h, keras.ops.transpose(tied.embeddings)))(pooled)
    model = keras.Model(inputs, output)
    x = np.zeros((2, 3), "int32")
    assert set(embedding_taps.candidates(model)) == {id(tied), id(untied)}  # one owner each
    untied_index = next(i for i, v in enumerate(model.trainable_variables) if v is untied.embeddings)
    assert embedding_taps.tappable(model, *_values(model), x) == {id(untied): (untied_index, (2, 3, 4))}

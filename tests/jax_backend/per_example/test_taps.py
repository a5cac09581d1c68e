"""Tests for keras_dyndp.jax_backend.per_example.taps: which layers are tapped."""

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

from keras_dyndp.jax_backend.per_example import taps  # noqa: E402


def test_candidates_are_trainable_embeddings_whose_table_no_other_layer_holds():
    own = keras.layers.Embedding(10, 4)
    frozen = keras.layers.Embedding(10, 4)
    frozen.trainable = False
    inputs = keras.Input((3,), dtype="int32")
    pooled = [keras.layers.GlobalAveragePooling1D()(layer(inputs)) for layer in (own, frozen)]
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Concatenate()(pooled)))
    found = taps.candidates(model, (keras.layers.Embedding,))
    assert list(found) == [id(own)] and found[id(own)][1] == (0,)
    assert own in taps._TAPPED and frozen not in taps._TAPPED  # pylint: disable=protected-access
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(own(ids), np.asarray(own.embeddings)[ids])  # no session: the original call


class _Subclassed(keras.Model):
    def __init__(self, tied):
        super().__init__()
        self.embedding = keras.layers.Embedding(10, 4)
        self.tied = tied
        self.dense = None if tied else keras.layers.Dense(10)

    def call(self, inputs, training=False):
        del training  # Unused.
        pooled = keras.ops.mean(self.embedding(inputs), axis=1)
        return pooled @ keras.ops.transpose(self.embedding.embeddings) if self.tied else self.dense(pooled)


@pytest.mark.parametrize("wrapped", [False, True])
def test_an_embedding_inside_a_subclassed_model_is_tapped_unless_its_table_is_read_outside_its_call(wrapped):
    """No declaration of the subclassed model is needed (the step runs it on one example at a time); its own call's
    read of the table (tied weights) is another use, which the probe finds."""
    x = np.zeros((2, 3), "int32")
    found = {}
    for tied in (False, True):
        model = _Subclassed(tied)
        model(x[:1])
        if wrapped:  # a wiring model above changes nothing
            model = keras.Sequential([keras.Input((3,), dtype="int32"), model])
        layer = model.layers[-1].embedding if wrapped else model.embedding
        assert id(layer) in taps.candidates(model)
        found[tied] = id(layer) in taps.tappable(model, *_values(model), x)
    assert found == {False: True, True: False}


def _values(model):
    return [v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables]


def test_a_table_read_outside_its_layers_call_is_not_tapped():
    """Tied weights in a functional model (the table also the output projection, through a Lambda here): the taps
    would miss that read's gradient (once a relative error of 0.563), so the table keeps the vmap path."""
    inputs = keras.Input((3,), dtype="int32")
    tied, untied = keras.layers.Embedding(10, 4), keras.layers.Embedding(10, 4)
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Add()([tied(inputs), untied(inputs)]))
    output = keras.layers.Lambda(lambda h: keras.ops.matmul(h, keras.ops.transpose(tied.embeddings)))(pooled)
    model = keras.Model(inputs, output)
    x = np.zeros((2, 3), "int32")
    assert set(taps.candidates(model)) == {id(tied), id(untied)}  # one owner each
    untied_index = next(i for i, v in enumerate(model.trainable_variables) if v is untied.embeddings)
    assert taps.tappable(model, *_values(model), x) == {id(untied): (untied, (untied_index,), (1, 3, 4))}


def test_a_dense_layer_called_twice_or_whose_kernel_a_lambda_reads_keeps_the_vmap_path():
    shared, read, own = keras.layers.Dense(4), keras.layers.Dense(4), keras.layers.Dense(4, activation="relu")
    inputs = keras.Input((4,))
    h = shared(shared(inputs))
    h = keras.layers.Lambda(lambda v: keras.ops.matmul(v, read.kernel))(read(h))
    model = keras.Model(inputs, own(h))
    found = taps.tappable(model, *_values(model), np.zeros((2, 4), "float32"))
    assert list(found) == [id(own)] and found[id(own)][2] == (1, 4)
    assert taps.tappable(model, *_values(model), np.zeros((2, 4), "float32"), (keras.layers.Embedding,)) == {}


def test_normalisations_are_tapped_unless_one_of_their_variables_is_read_elsewhere():
    """Every variable a rule covers (a normalisation's gamma and beta) is checked: a Lambda reading only the beta of
    one GroupNormalization keeps that layer on the vmap path; a LayerNormalization without variables is no
    candidate."""
    inputs = keras.Input((4, 6))
    norm, read, bare = (
        keras.layers.LayerNormalization(),
        keras.layers.GroupNormalization(2),
        keras.layers.LayerNormalization(center=False, scale=False),
    )
    h = keras.layers.Lambda(lambda v: v + read.beta)(read(norm(inputs)))
    model = keras.Model(inputs, bare(h))
    assert set(taps.candidates(model)) == {id(norm), id(read)}
    trainable = model.trainable_variables
    indices = tuple(next(i for i, v in enumerate(trainable) if v is w) for w in (norm.gamma, norm.beta))
    assert taps.tappable(model, *_values(model), np.zeros((2, 4, 6), "float32")) == {
        id(norm): (norm, indices, (1, 4, 6))
    }

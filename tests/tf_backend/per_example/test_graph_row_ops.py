"""graph_row_ops: elementwise ops, reductions, products, attention and random draws keep each example in its own row
where they can, and every way they could bring two examples together (or lay data along the batch by position) is
refused, on graphs traced with an unknown batch size."""

import numpy as np
import pytest
import tensorflow as tf

from keras_dyndp.tf_backend.per_example import graph_rows
from keras_dyndp.tf_backend.per_example.graph_row_ops import NotProven

W = np.ones((8, 3), np.float32)


def why_not(function, *shapes) -> str | None:
    """None where the graph of ``function`` on inputs [None, *shape] keeps the examples apart; else the reason."""
    specs = [tf.TensorSpec([None, *shape]) for shape in shapes]
    try:
        graph_rows.follow(tf.function(function, autograph=False).get_concrete_function(*specs))
    except NotProven as reason:
        return str(reason)
    return None


@pytest.mark.parametrize(
    "function",
    [
        lambda h: tf.nn.relu(h) * 2.0 + h - tf.ones([8]),  # Elementwise, a constant broadcast over other axes.
        lambda h: h - tf.reduce_mean(h, axis=1, keepdims=True),  # Reduces within an example.
        lambda h: tf.reduce_max(h, axis=-1),
        lambda h: tf.matmul(h, W),
        lambda h: tf.transpose(tf.matmul(W, h, transpose_a=True, transpose_b=True)),  # Examples on axis 1, then 0.
        lambda h: tf.where(h > 0, h, tf.zeros_like(h)),
        lambda h: tf.nn.softmax(h, axis=-1),
        lambda h: tf.clip_by_value(h, -1.0, 1.0),
        lambda h: h * tf.cast(tf.shape(h)[1], tf.float32),  # A size that is not the batch's.
        lambda h: h + tf.random.stateless_uniform([1, 8], seed=[1, 2]),  # One draw for all rows.
    ],
)
def test_ops_that_keep_examples_apart_are_proven(function):
    assert why_not(function, [8]) is None


@pytest.mark.parametrize(
    "function",
    [
        lambda q, k: tf.nn.softmax(tf.einsum("bqhd,bkhd->bhqk", q, k), axis=-1),
        lambda q, k: tf.matmul(tf.transpose(q, [0, 2, 1, 3]), tf.transpose(k, [0, 2, 3, 1])),
        lambda q, k: tf.einsum("bqhd,hd->bqh", q, tf.ones([2, 4])),
    ],
)
def test_attention_within_each_example_is_proven(function):
    assert why_not(function, [5, 2, 4], [5, 2, 4]) is None


@pytest.mark.parametrize(
    "function,reason",
    [
        (lambda h: h - tf.reduce_mean(h, axis=0), "reduces across the batch axis"),
        (lambda h: h * tf.reduce_sum(h), "reduces across the batch axis"),
        (lambda h: tf.matmul(h, h, transpose_a=True), "two batch tensors"),  # A Gram matrix across examples.
        (lambda h: tf.einsum("bd,cd->bc", h, h), "joins two batch axes"),
        (lambda h: tf.nn.softmax(h, axis=0), "(Transpose)"),  # Moves axis 0 last by a computed permutation.
        (lambda h: h * tf.cast(tf.shape(h)[0], tf.float32), "with its size"),  # The batch size as data.
        (lambda h: h + tf.cast(tf.range(tf.shape(h)[0]), tf.float32)[:, None], "by the batch"),  # By position.
        (lambda h: h + tf.random.stateless_uniform(tf.shape(h), seed=[1, 2]), "by the batch"),  # Row by row.
        (lambda h: h + tf.ones([4, 8]), "batch-free tensor along the batch axis"),  # Rows of its own, by position.
        (lambda h: tf.while_loop(lambda i, a: i < 2, lambda i, a: (i + 1, a * 2.0), [0, h])[1], "not known"),
        (lambda h: tf.reverse(h, [0]), "not known"),
    ],
)
def test_ops_that_could_mix_examples_are_refused(function, reason):
    found = why_not(function, [8])
    assert found is not None and reason in found, found


def test_a_write_of_batch_data_to_a_variable_is_refused():
    variable = tf.Variable(tf.zeros([8]))

    def remember(h):
        variable.assign(h[0])  # Example 0 kept for the next step: outside the released update.
        return h

    def count(h):
        variable.assign_add(tf.ones([8]))  # A counter, as Keras's seed generators keep.
        return h

    assert "slices the batch axis" in why_not(remember, [8])
    assert why_not(count, [8]) is None

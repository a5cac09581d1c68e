"""graph_row_layout: reshapes (folding the batch with another axis, as a Dense on [B, T, d] does through
``tensordot``), transposes, slices, joins, gathers, shapes and fills keep each example in its own row where they can;
those that cross the batch axis, or select rows by position, are refused."""

import numpy as np
import pytest
import tensorflow as tf
from test_graph_row_ops import why_not

TABLE = np.ones((10, 4), np.float32)


@pytest.mark.parametrize(
    "function",
    [
        lambda h: tf.reshape(tf.reshape(h, [-1, 8]) * 2.0, tf.shape(h)),  # [B, 5, 8] -> [5B, 8] -> back.
        lambda h: tf.reshape(tf.reshape(h, [tf.shape(h)[0] * 5, 8]) @ np.ones((8, 8), np.float32), [-1, 5, 8]),
        lambda h: tf.reshape(tf.reshape(h, [-1, 40]), [-1, 5, 2, 4]),
        lambda h: tf.tensordot(h, np.ones((8, 3), np.float32), axes=1),
        lambda h: tf.squeeze(tf.expand_dims(tf.transpose(h, [0, 2, 1]), 1), axis=1),
        lambda h: tf.concat([h, h * 2.0], axis=1),
        lambda h: tf.stack([h, h], axis=1),
        lambda h: tf.split(h, 5, axis=1)[2],
        lambda h: tf.unstack(h, axis=1)[0],
        lambda h: h[:, 0, :4] + h[:, 1:3, ::2][:, 0, :4] + h[..., 0:4][:, 0] + h[:, None, 0][:, 0, :4],
        lambda h: tf.slice(h, [0, 1, 0], [-1, 2, -1]),
        lambda h: tf.gather(h, [4, 0], axis=1),
        lambda h: tf.zeros(tf.shape(h)) + tf.broadcast_to(tf.ones([8]), tf.shape(h)) * h,
        lambda h: tf.tile(h, [1, 2, 1]),
        lambda h: tf.pad(h, [[0, 0], [1, 1], [0, 0]]),
    ],
)
def test_layouts_that_keep_examples_apart_are_proven(function):
    assert why_not(function, [5, 8]) is None


def test_an_embedding_lookup_by_token_ids_is_proven():
    assert why_not(lambda ids: tf.gather(TABLE, tf.cast(ids, tf.int32)), [5]) is None


@pytest.mark.parametrize(
    "function,reason",
    [
        (lambda h: tf.reshape(tf.reshape(h, [-1, 2, 5, 8])[:, ::-1], tf.shape(h)), "across the batch axis"),  # Pairs.
        (lambda h: tf.reshape(h, [5, -1, 8]), "across the batch axis"),  # [B, 5] read as [5, B].
        (lambda h: tf.reshape(h, [tf.shape(h)[0] * 5, 8]), "does not hold one example per row"),  # 5B rows out.
        (lambda h: tf.concat([h[1:], h[:1]], axis=0), "slices the batch axis"),  # A roll of the batch.
        (lambda h: h[::-1], "slices the batch axis"),
        (lambda h: h - h[0], "slices the batch axis"),
        (lambda h: tf.concat([h, h], axis=0)[:, 0], "joins along the batch axis"),
        (lambda h: tf.gather(h, [0, 0]), "gathers along the batch axis"),
        (lambda h: tf.tile(h, [2, 1, 1]), "tiles along the batch axis"),
        (lambda h: tf.pad(h, [[1, 0], [0, 0], [0, 0]]), "pads the batch axis"),
        (lambda h: tf.split(h, 2, axis=0)[0], "splits along the batch axis"),
        (lambda h: tf.zeros([tf.shape(h)[0] * 2, 5, 8]), "does not hold one example per row"),  # 2B rows.
        (lambda h: tf.reshape(tf.range(tf.cast(tf.size(h), tf.float32)), tf.shape(h)), "by the batch"),
    ],
)
def test_layouts_that_cross_the_batch_axis_are_refused(function, reason):
    found = why_not(function, [5, 8])
    assert found is not None and reason in found, found

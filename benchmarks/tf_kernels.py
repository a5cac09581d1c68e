"""The TensorFlow CPU kernels that keras_dyndp's fast path leans on, timed alone (plain TensorFlow ops).

Where the Keras 3 / Keras 2 gap of the fast path comes from: run this under each stack's Python (and with
``TF_ENABLE_ONEDNN_OPTS=1`` or ``0``) and compare. The shapes are those of the benchmark models at batch 256: the
LSTM's per-example kernel gradients (a batched matmul a_i^T g_i, in both orders), the embedding rule's grouping of
(example, id) pairs (``tf.unique``, ``tf.math.unsorted_segment_sum``) and clipped sum
(``tf.tensor_scatter_nd_add``; for comparison, a variable's ``scatter_add``, the sparse update that Keras's
optimizers make in a non-private step), and a plain matmul of the LSTM's recurrence for scale.

Usage: [TF_ENABLE_ONEDNN_OPTS=0|1] python benchmarks/tf_kernels.py [--calls 20 --repeats 9]
"""

from __future__ import annotations

import interleaved  # benchmarks/interleaved.py (this script's directory is on sys.path)
import models
import numpy as np
import tensorflow as tf
from absl import app
from absl import flags

from keras_dyndp.tf_backend.per_example import conv2d  # onednn_enabled

FLAGS = flags.FLAGS
flags.DEFINE_integer("calls", 20, "Timed calls per repetition.")
flags.DEFINE_integer("repeats", 9, "Interleaved repetitions; the median is reported.")

BATCH, STEPS, UNITS, FEATURES = 256, models.LSTM_LENGTH, 32, 32  # The lstm model: Embedding(., 32), LSTM(32).
TEXT_LENGTH, VOCABULARY, WIDTH = models.TEXT_LENGTH, models.TEXT_VOCAB, 16  # The text model: Embedding(., 16).


def kernels() -> dict:
    """Name -> a no-argument call of one kernel on fixed random inputs of the benchmark models' shapes."""
    rng = np.random.default_rng(0)
    a = tf.constant(rng.normal(size=(BATCH, STEPS, FEATURES)).astype("float32"))
    g = tf.constant(rng.normal(size=(BATCH, STEPS, 4 * UNITS)).astype("float32"))
    h = tf.constant(rng.normal(size=(BATCH, UNITS)).astype("float32"))
    recurrent_kernel = tf.constant(rng.normal(size=(UNITS, 4 * UNITS)).astype("float32"))
    ids = rng.integers(0, VOCABULARY, (BATCH, TEXT_LENGTH))
    pairs = tf.constant((np.arange(BATCH)[:, None] * VOCABULARY + ids).reshape(-1), tf.int64)
    rows = tf.constant(rng.normal(size=(BATCH * TEXT_LENGTH, WIDTH)).astype("float32"))
    table = tf.zeros([VOCABULARY, WIDTH])
    buffer = tf.Variable(table)
    index = tf.unique(pairs)[1]
    num_pairs = int(tf.reduce_max(index)) + 1
    flat_ids = tf.constant(ids.reshape(-1, 1), tf.int32)
    return {
        "batched matmul a^T g [B, 32, 128]": lambda: tf.matmul(a, g, transpose_a=True),
        "batched matmul g^T a [B, 128, 32]": lambda: tf.matmul(g, a, transpose_a=True),
        "unique of B*T (example, id) pairs": lambda: tf.unique(pairs)[1],
        "unsorted_segment_sum of B*T rows": lambda: tf.math.unsorted_segment_sum(rows, index, num_pairs),
        "tensor_scatter_nd_add into the table": lambda: tf.tensor_scatter_nd_add(table, flat_ids, rows),
        "scatter_add into a variable (the optimizer's sparse update)": lambda: buffer.scatter_add(
            tf.IndexedSlices(rows, flat_ids[:, 0])
        ),
        "gather of B*T table rows": lambda: tf.gather(table, flat_ids[:, 0]),
        "matmul h U, 40 times (the recurrence)": lambda: [tf.matmul(h, recurrent_kernel) for _ in range(STEPS)][-1],
    }


def main(argv):
    del argv  # Unused.
    functions = {name: tf.function(kernel) for name, kernel in kernels().items()}
    medians = interleaved.median_milliseconds(functions, FLAGS.calls, FLAGS.repeats)
    print(f"TensorFlow {tf.__version__}, oneDNN {'on' if conv2d.onednn_enabled() else 'off'}")
    print("| kernel | ms (median) |")
    print("|---|---|")
    for name, median in medians.items():
        print(f"| {name} | {median:.3f} |")


if __name__ == "__main__":
    app.run(main)

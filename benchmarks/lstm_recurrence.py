"""The ghost LSTM rule's recurrence alone, in plain TensorFlow: forward and backward of ``tf.scan`` variants.

Where does the Keras 3 / Keras 2 gap of the LSTM fast path come from? This times the recurrence that
`keras_dyndp.tf_backend.per_example.recurrent` runs (the gate pre-activations' scan, B x T x 4U inputs) on whichever
TensorFlow runs it, without Keras: ``tf.scan`` with ``parallel_iterations`` 10 (TF's default, what the rule uses), 1 and
32, and a hand-written ``tf.while_loop`` over a ``TensorArray``. Run it under each stack's Python and compare.

Usage: python benchmarks/lstm_recurrence.py [--batch_size 256 --steps 40 --units 32 --calls 10 --repeats 7]
"""

from __future__ import annotations

import interleaved  # benchmarks/interleaved.py (this script's directory is on sys.path)
import numpy as np
import tensorflow as tf
from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch_size", 256, "B.")
flags.DEFINE_integer("steps", 40, "T, the sequence length.")
flags.DEFINE_integer("units", 32, "U, the LSTM's units.")
flags.DEFINE_integer("calls", 10, "Timed calls per repetition.")
flags.DEFINE_integer("repeats", 7, "Interleaved repetitions; the median is reported.")


def main(argv):
    del argv  # Unused.
    batch, steps, units = FLAGS.batch_size, FLAGS.steps, FLAGS.units
    rng = np.random.default_rng(0)
    projections = tf.constant(rng.normal(size=(batch, steps, 4 * units)).astype("float32"))
    recurrent_kernel = tf.Variable(rng.normal(size=(units, 4 * units)).astype("float32") * 0.1)

    def cell(carry, projection):
        h, c = carry
        z_i, z_f, z_c, z_o = tf.split(projection + tf.matmul(h, recurrent_kernel), 4, axis=1)
        c = tf.sigmoid(z_f) * c + tf.sigmoid(z_i) * tf.tanh(z_c)
        return tf.sigmoid(z_o) * tf.tanh(c), c

    def scan(parallel_iterations):
        zeros = tf.zeros([batch, units])
        time_major = tf.transpose(projections, [1, 0, 2])
        return tf.scan(cell, time_major, initializer=(zeros, zeros), parallel_iterations=parallel_iterations)[0]

    def while_loop():
        zeros = tf.zeros([batch, units])
        time_major = tf.transpose(projections, [1, 0, 2])

        def body(t, h, c, outputs):
            h, c = cell((h, c), time_major[t])
            return t + 1, h, c, outputs.write(t, h)

        initial = (0, zeros, zeros, tf.TensorArray(tf.float32, size=steps))
        return tf.while_loop(lambda t, *_: t < steps, body, initial)[3].stack()

    def timed(recurrence):
        @tf.function
        def step():
            with tf.GradientTape() as tape:
                tape.watch(projections)
                loss = tf.reduce_sum(recurrence() ** 2)
            return tape.gradient(loss, [projections, recurrent_kernel])

        return step

    variants = {
        "tf.scan, parallel_iterations 10 (the rule's)": timed(lambda: scan(10)),
        "tf.scan, parallel_iterations 1": timed(lambda: scan(1)),
        "tf.scan, parallel_iterations 32": timed(lambda: scan(32)),
        "tf.while_loop + TensorArray": timed(while_loop),
    }
    medians = interleaved.median_milliseconds(
        variants, FLAGS.calls, FLAGS.repeats, wait=lambda gradients: gradients[0].numpy()
    )
    print(f"TensorFlow {tf.__version__}, B={batch} T={steps} U={units}, forward + backward, medians:")
    for name, median in medians.items():
        print(f"  {name}: {median:.1f} ms")


if __name__ == "__main__":
    app.run(main)

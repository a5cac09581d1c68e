"""One DP step of a small transformer at batch 32 by ``make_private(model, METHOD)``, run as its own process by
test_vectorized.py: a crash under ``tf.vectorized_map`` kills this process, not the test run. Prints one line:
``trained <the update's L2 norm>`` or ``refused <the error, on one line>``."""

import sys
import warnings

import numpy as np
import tensorflow as tf

import keras_dyndp
from keras_dyndp.schedules import DPSchedule
from keras_dyndp.tf_backend.keras_compat import keras

warnings.simplefilter("ignore")
METHOD = sys.argv[1]
BATCH, LENGTH, WIDTH = 32, 16, 32
layers = keras.layers
keras.utils.set_random_seed(0)
inputs = keras.Input((LENGTH,), dtype="int32")
h = layers.Embedding(100, WIDTH)(inputs)
h = layers.LayerNormalization()(layers.Add()([h, layers.MultiHeadAttention(4, WIDTH // 4, dropout=0.1)(h, h)]))
h = layers.Add()([h, layers.EinsumDense("abc,cd->abd", output_shape=(None, WIDTH))(h)])
model = keras.Model(inputs, layers.Dense(2)(layers.GlobalAveragePooling1D()(h)))
model = keras_dyndp.make_private(model, METHOD)
schedule = DPSchedule(np.full(4, 1.0), np.full(4, 0.0), 0.5)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        schedule=schedule, expected_batch_size=BATCH / 2, learning_rate=1.0, allow_degenerate_noise=True, noise_seed=0
    )
model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"))
rng = np.random.default_rng(0)
x = rng.integers(0, 100, (BATCH, LENGTH)).astype("int32")
y = rng.integers(0, 2, BATCH).astype("int32")
before = [np.asarray(w, np.float64) for w in model.get_weights()]
try:
    model.fit(tf.data.Dataset.from_tensors((x, y)), verbose=0)
except (ValueError, tf.errors.InvalidArgumentError) as error:
    print("refused", " ".join(str(error).split())[:3000])
    sys.exit(0)
update = np.sqrt(sum(np.sum((np.asarray(w, np.float64) - b) ** 2) for w, b in zip(model.get_weights(), before)))
print("trained", update)

"""Run as a script (a process of its own, 2 CPU devices): make_private's step under keras.distribution.

Prints one JSON object per case, which test_train_step checks: the largest deviation of the update from the
per-example loop, whether every device holds the same variables, and the noise's std against the schedule's (one
key, one draw per step: independent draws on 2 devices would add sqrt(2) times the std). On CPU even where an
accelerator is present.
"""

import json
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax_brute_force as brute_force  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")


def _distribution(kind):
    if kind == "data":
        return keras.distribution.DataParallel(devices=jax.devices())
    mesh = keras.distribution.DeviceMesh((1, 2), ["batch", "model"], devices=jax.devices())
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["hidden.*kernel"] = (None, "model")
    return keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")


def _model(width):
    keras.utils.set_random_seed(0)
    tokens = keras.Input((6,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(20, 4)(tokens))
    hidden = keras.layers.Dense(4, activation="tanh", name="hidden")(pooled)
    return make_private(keras.Model(tokens, keras.layers.Dense(width)(hidden)))


def _dp_sgd(clip_norm, noise_stddev):
    schedule = schedules.DPSchedule(np.full(2, clip_norm), np.full(2, noise_stddev), 0.5)
    return DynamicDPKerasSGD(schedule=schedule, public_batch_size=True, learning_rate=1.0, allow_degenerate_noise=True)


def _case(x, y):
    model = _model(3)
    optimizer = _dp_sgd(0.05, 0.0)
    model.compile(optimizer=optimizer, loss=LOSS)
    before = [np.asarray(v.value, np.float64) for v in model.trainable_variables]
    expected = brute_force.clipped_sum(model, LOSS, x, y, 0.05)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, shuffle=False)
    after = [np.asarray(v.value, np.float64) for v in model.trainable_variables]
    result = {
        "max_deviation": max(float(np.max(np.abs(a - (b - e / len(x))))) for a, b, e in zip(after, before, expected)),
        "sharded_variables": sum(any(v.value.sharding.spec) for v in model.trainable_variables),
    }
    noisy = _model(1000)
    noisy.compile(optimizer=_dp_sgd(1e-6, 5.0), loss=keras.losses.MeanSquaredError(reduction="none"))
    kernel = noisy.trainable_variables[-2]  # 4 x 1000, replicated on both devices
    before = np.asarray(kernel.value)
    noisy.fit(x, np.zeros((len(x), 1000), "float32"), batch_size=len(x), epochs=1, verbose=0)
    shards = [np.asarray(shard.data) for shard in kernel.value.addressable_shards]
    result["noise_std_ratio"] = float(np.std(np.asarray(kernel.value) - before) / (5.0 / len(x)))
    result["replicas"] = len(shards)
    result["replicas_equal"] = all(np.array_equal(shards[0], shard) for shard in shards)
    return result


def main():
    results = {"devices": len(jax.devices())}
    x = np.random.default_rng(1).integers(0, 20, size=(8, 6)).astype("int32")
    x[:, 3:] = x[:, :3]  # repeated tokens: the embedding taps sum their rows
    y = np.arange(8, dtype="int32") % 3
    for kind in ("data", "model"):
        keras.distribution.set_distribution(_distribution(kind))
        results[kind] = _case(x, y)
        keras.distribution.set_distribution(None)
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()

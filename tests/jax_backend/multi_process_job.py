"""One of 2 ``jax.distributed`` processes on localhost (CPU, one device each), run by test_distribution: make_private's
step under ``keras.distribution.DataParallel`` over both processes' devices.

Usage: multi_process_job.py PROCESS_ID PORT OUT_DIR. Writes OUT_DIR/process<ID>.npz, which the test compares across
the processes: the agreed keys and sampler states, this process's share of the global Poisson batch and the global
batch, the update against the per-example loop's on the global batch, the noisy kernel, and the refusals' messages
(among them of optimizers that differ between the processes); from a memmap on disk (one copy per process), the
rows each process read through a counting source and a step trained on it; the clip norm adaptive clipping reached.
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

PROCESS_ID, PORT, OUT_DIR = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(f"localhost:{PORT}", num_processes=2, process_id=PROCESS_ID)

import jax_brute_force as brute_force  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from counting_source import CountingSource  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

import keras_dyndp  # noqa: E402
from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402

N, P = 40, 0.25
LOSS = keras.losses.MeanSquaredError(reduction="none")


def _model(width, clip_norm, noise_stddev, steps=3, learning_rate=1.0, adaptive_clipping=None):
    keras.utils.set_random_seed(0)
    model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(width, activation="tanh")]))
    schedule = schedules.DPSchedule(np.full(steps, clip_norm), np.full(steps, noise_stddev), P)
    optimizer = DynamicDPKerasSGD(
        schedule=schedule,
        expected_batch_size=P * N,
        learning_rate=learning_rate,
        allow_degenerate_noise=True,
        adaptive_clipping=adaptive_clipping,
    )
    model.compile(optimizer=optimizer, loss=LOSS)
    return model


def _values(model):
    return [np.asarray(v.value, np.float64) for v in model.trainable_variables]


def _refusal(call):
    try:
        call()
    except (ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return "not refused"


def _on_demand(y):
    """Reads of 3 batches from a memmap through `CountingSource`, the seed, and a step trained on the memmap."""
    path = os.path.join(OUT_DIR, f"rows{PROCESS_ID}.npy")
    np.save(path, np.arange(1, N + 1, dtype="float32")[:, None].repeat(4, 1))
    source = CountingSource(np.load(path, mmap_mode="r"), y)
    batches = keras_dyndp.poisson_batches(source, sampling_probability=P, steps_per_epoch=3)
    source.reads.clear()  # The first example and the rows compared across processes.
    steps, reads = [], []
    for step in range(3):
        batch_x, _, weights = batches[step]
        read = source.reads.pop() if source.reads else []  # An empty share reads nothing.
        assert sorted(batch_x[weights != 0, 0].astype(int) - 1) == sorted(read)
        steps, reads = steps + [step] * len(read), reads + read
    model = _model(2, 0.1, 0.0)
    model.fit(keras_dyndp.poisson_batches(source.x, y, sampling_probability=P, steps_per_epoch=1), verbose=0)
    return {
        "source_seed": np.asarray(str(batches.draws.seed)),
        "source_cap": batches.max_batch_size,
        "source_steps": np.asarray(steps, np.int64),
        "source_reads": np.asarray(reads, np.int64),
        "memmap_steps": int(model.optimizer.dp_step.numpy()),
    }


def main():
    distribution = keras.distribution.DataParallel(devices=jax.devices(), auto_shard_dataset=False)
    keras.distribution.set_distribution(distribution)
    rng = np.random.default_rng(1)  # The same data on both processes, as each holds the whole dataset.
    x, y = rng.normal(size=(N, 4)).astype("float32"), rng.normal(size=(N, 2)).astype("float32")
    result = {}

    model = _model(2, 0.1, 0.0)
    batches = keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=1)
    result["base_key"] = model.optimizer._noise_source.base_key  # pylint: disable=protected-access
    result["sampler_state"] = np.asarray(str(batches._rng.bit_generator.state["state"]))  # pylint: disable=protected-access
    before = _values(model)
    fed = []  # Keras reads the first batch once more than it trains: the step's batch is the last one read.
    read = type(batches).__getitem__
    type(batches).__getitem__ = lambda self, index: fed.append(read(self, index)) or fed[-1]
    model.fit(batches, verbose=0)
    type(batches).__getitem__ = read
    local_x, local_y, local_weights = local = fed[-1]
    global_x, global_y, weights = (multihost_utils.process_allgather(v, tiled=True) for v in local)
    chosen = weights != 0
    after = _values(model)
    for variable, value in zip(model.trainable_variables, before):  # The loop differentiates at the old weights.
        variable.assign(value.astype("float32"))
    expected = brute_force.clipped_sum(model, LOSS, global_x[chosen], global_y[chosen], 0.1)
    result["max_deviation"] = max(
        float(np.max(np.abs(a - (b - e / (P * N))))) for a, b, e in zip(after, before, expected)
    )
    result.update(local_x=local_x, local_weights=local_weights, global_x=global_x, global_weights=weights)
    result["steps"] = int(model.optimizer.dp_step.numpy())

    noisy = _model(500, 1e-6, 5.0)
    kernel = noisy.trainable_variables[0]
    kernel_before = np.asarray(kernel.value)
    noisy.fit(
        keras_dyndp.poisson_batches(x, y[:, :1].repeat(500, 1), sampling_probability=P, steps_per_epoch=1), verbose=0
    )
    result["noise"] = np.asarray(kernel.value) - kernel_before
    result["noise_std_ratio"] = float(np.std(result["noise"]) / (5.0 / (P * N)))

    spent = _model(2, 0.1, 1.0, steps=1)
    result["budget"] = _refusal(
        lambda: spent.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=2), verbose=0)
    )
    result["budget_steps"] = int(spent.optimizer.dp_step.numpy())

    adaptive = {"target_quantile": 0.3, "learning_rate": 0.5, "count_stddev": 1e-6}
    adapted = _model(2, 0.1, 0.0, adaptive_clipping=adaptive)
    adapted.fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P, steps_per_epoch=2), verbose=0)
    result["adaptive_clip_norm"] = float(np.asarray(adapted.optimizer.adaptive_clip_norm))

    def fit_other(**other):  # Process 1's optimizer differs from process 0's in ``other``.
        arguments = {"clip_norm": 0.1, "noise_stddev": 1.0, "learning_rate": 1.0, **(other if PROCESS_ID else {})}
        _model(2, **arguments).fit(keras_dyndp.poisson_batches(x, y, sampling_probability=P), verbose=0)

    result["other_noise"] = _refusal(lambda: fit_other(noise_stddev=0.5))
    result["other_learning_rate"] = _refusal(lambda: fit_other(learning_rate=0.5))
    result["other_adaptive_clipping"] = _refusal(
        lambda: fit_other(adaptive_clipping={"target_quantile": 0.75, "count_stddev": 100.0})
    )
    result["other_data"] = _refusal(lambda: keras_dyndp.poisson_batches(x + PROCESS_ID, y, sampling_probability=P))
    result.update(_on_demand(y))
    result["arrays"] = _refusal(lambda: model.fit(x, y, batch_size=10, verbose=0))
    result["train_on_batch"] = _refusal(lambda: model.train_on_batch(x[:10], y[:10]))
    keras.distribution.set_distribution(None)
    result["no_distribution"] = _refusal(lambda: _model(2, 0.1, 1.0).fit(batches, verbose=0))
    np.savez(os.path.join(OUT_DIR, f"process{PROCESS_ID}.npz"), **result)


if __name__ == "__main__":
    main()

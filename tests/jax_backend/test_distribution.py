"""Tests for keras_dyndp.jax_backend.distribution: 2 jax.distributed processes on localhost (`multi_process_job.py`,
one CPU device each) release the one-device step of the global Poisson batch, with one agreed noise key and sampler;
the refusals; the checks with a patched process count."""

import os
import socket
import subprocess
import sys

import pytest

jax = pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

import numpy as np  # noqa: E402

from keras_dyndp.data import sources  # noqa: E402
from keras_dyndp.jax_backend import PoissonBatches  # noqa: E402
from keras_dyndp.jax_backend import distribution  # noqa: E402

JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_process_job.py")
TIMEOUT_S = 300
N, P = 40, 0.25  # multi_process_job's


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("processes"))
    port = str(_free_port())
    tests = [os.path.dirname(JOB), os.path.dirname(os.path.dirname(JOB))]  # the job and tests/counting_source.py
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*tests, *sys.path]), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("XLA_FLAGS", None)
    logs = [open(os.path.join(out_dir, f"process{index}.log"), "w") for index in range(2)]  # noqa: SIM115
    jobs = [
        subprocess.Popen([sys.executable, JOB, str(index), port, out_dir], env=env, stdout=log, stderr=log)
        for index, log in enumerate(logs)
    ]
    try:
        for job in jobs:
            job.wait(timeout=TIMEOUT_S)
    finally:
        for job, log in zip(jobs, logs):
            if job.poll() is None:
                job.kill()
                job.wait()
            log.close()
    for index, job in enumerate(jobs):
        if job.returncode != 0:
            with open(os.path.join(out_dir, f"process{index}.log")) as handle:
                pytest.fail(f"process {index} exited with {job.returncode}:\n{handle.read()[-4000:]}")
    return [dict(np.load(os.path.join(out_dir, f"process{index}.npz"))) for index in range(2)]


def test_the_processes_agree_on_the_noise_key_and_the_sampler(runs):
    first, second = runs
    np.testing.assert_array_equal(first["base_key"], second["base_key"])
    assert str(first["sampler_state"]) == str(second["sampler_state"])


def test_each_process_feeds_its_share_of_one_global_poisson_batch(runs):
    first, second = runs
    np.testing.assert_array_equal(first["global_x"], second["global_x"])
    for index, run in enumerate(runs):
        rows = len(run["local_x"])
        np.testing.assert_array_equal(run["local_x"], run["global_x"][index * rows : (index + 1) * rows])
    weights = first["global_weights"]
    chosen = int(np.sum(weights != 0))
    assert 0 < chosen < len(weights) and np.all(weights[:chosen] != 0) and np.all(weights[chosen:] == 0)
    assert len(np.unique(first["global_x"][:chosen], axis=0)) == chosen  # no example in both shares


def test_from_a_memmap_each_process_reads_only_its_share_of_one_global_sample(runs):
    first, second = runs
    assert str(first["source_seed"]) == str(second["source_seed"])
    seed, cap = int(str(first["source_seed"])), int(first["source_cap"])
    for step in range(3):
        _, chosen = sources.draw(np.random.default_rng([seed, step]), N, P, cap)
        shares = [run["source_reads"][run["source_steps"] == step] for run in runs]
        assert sorted(np.concatenate(shares)) == sorted(chosen)  # the global sample, no row read twice
        for index, share in enumerate(shares):
            assert sorted(share) == sorted(chosen[index * cap // 2 : (index + 1) * cap // 2])
    assert [int(run["memmap_steps"]) for run in runs] == [1, 1]


def test_the_step_is_the_one_device_step_of_the_global_batch(runs):
    for run in runs:
        assert int(run["steps"]) == 1
        assert float(run["max_deviation"]) < 1e-6


def test_one_noise_draw_of_the_schedules_std_the_same_on_both_processes(runs):
    first, second = runs
    np.testing.assert_array_equal(first["noise"], second["noise"])
    assert float(first["noise_std_ratio"]) == pytest.approx(1.0, abs=0.1)


def test_the_budget_and_unsupported_inputs_are_refused_on_every_process(runs):
    for run in runs:
        assert str(run["budget"]).startswith("BudgetExhaustedError") and int(run["budget_steps"]) == 1
        assert "processes [1] hold other data than process 0" in str(run["other_data"])  # a shard per process
        assert "takes only keras_dyndp.poisson_batches" in str(run["arrays"])
        assert "model.train_on_batch in 2 processes" in str(run["train_on_batch"])
        assert "DataParallel(devices=jax.devices()" in str(run["no_distribution"])


def test_the_processes_agree_on_one_adapted_clip_norm(runs):
    """Adaptive clipping: one count over the global batch, one noise, so one C_t on every process, and it moved."""
    first, second = runs
    assert float(first["adaptive_clip_norm"]) == float(second["adaptive_clip_norm"]) != pytest.approx(0.1)


def test_processes_with_other_schedules_or_learning_rates_refuse_before_any_step(runs):
    for run in runs:  # Process 1's noise 0.5 (or learning rate 0.5) against process 0's 1.0: both refuse, at build.
        keys = (("other_noise", "schedule"), ("other_learning_rate", "learning_rate"))
        for key, differing in (*keys, ("other_adaptive_clipping", "adaptive_clipping")):
            assert str(run[key]).startswith("ValueError: The DP optimizers of the 2 processes")
            assert f"(process 1: {differing})" in str(run[key])


@pytest.fixture
def two_processes(monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    monkeypatch.setattr(jax, "device_count", lambda: 4)
    monkeypatch.setattr(distribution, "check_same_data", lambda arrays: None)  # a collective: see `runs`


def test_rows_split_evenly_over_the_devices_of_several_processes(two_processes):
    del two_processes  # Used for its patch.
    assert distribution.rows_multiple() == 4
    distribution.check_rows("max_batch_size", 8)
    with pytest.raises(ValueError, match=r"`max_batch_size` must be a multiple of the 4 devices.*use 12"):
        distribution.check_rows("max_batch_size", 10)
    np.testing.assert_array_equal(distribution.local_rows(np.arange(8)), [4, 5, 6, 7])
    x = np.arange(1, N + 1, dtype="float32")[:, None]
    assert PoissonBatches(x, x, sampling_probability=P, seed=0).max_batch_size % 4 == 0
    with pytest.raises(ValueError, match="`pad_to_multiple` must be a multiple"):
        PoissonBatches(x, x, sampling_probability=P, pad_to_multiple=6, seed=0)


def test_one_process_is_unchanged():
    assert not distribution.several() and distribution.rows_multiple() == 1
    value = np.arange(5, dtype=np.uint32)
    assert distribution.agreed(value) is value and distribution.local_rows(value) is value
    distribution.check_distribution()
    distribution.check_data(np.zeros(3), "model.train_on_batch", PoissonBatches)


def test_several_processes_refuse_other_distributions_and_data(two_processes):
    del two_processes  # Used for its patch.
    with pytest.raises(ValueError, match="Received: None. Without a distribution each process trains its own model"):
        distribution.check_distribution()
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()[:1]))
    try:
        distribution.check_distribution()  # patched: the one local device stands for all of them
    finally:
        keras.distribution.set_distribution(None)
    with pytest.raises(ValueError, match="count each example 2 times"):
        distribution.check_data(np.zeros(3), "model.fit", PoissonBatches)

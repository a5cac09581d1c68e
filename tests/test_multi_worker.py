"""MultiWorkerMirroredStrategy with 2 local worker processes over localhost (tests/multi_worker_job.py): the DP step of
2 workers is the one-device step of the global batch, with one noise of std sigma_t and one counter."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from keras_dyndp.tf_backend import keras_compat

pytestmark = [
    pytest.mark.skipif(
        keras_compat.KERAS_MAJOR_VERSION >= 3,
        reason="Keras 3's model.fit fails under MultiWorkerMirroredStrategy before any step, with or without "
        "keras_dyndp (keras-team/keras#20585, tensorflow/tensorflow#72388); tested on Keras 2 and tf_keras",
    ),
    pytest.mark.xdist_group("multi_worker"),  # its module fixture runs once (tests/conftest.py)
]
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multi_worker_job.py")
TIMEOUT_S = 300
BATCH, LEARNING_RATE = 8, 0.5


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    out_dir = str(tmp_path_factory.mktemp("multi_worker"))
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    repository = os.path.dirname(os.path.dirname(JOB))
    processes = []
    for index in range(2):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        env["PYTHONPATH"] = os.pathsep.join([repository, env.get("PYTHONPATH", "")])
        env["CUDA_VISIBLE_DEVICES"] = ""
        log = open(os.path.join(out_dir, f"worker{index}.log"), "w")  # noqa: SIM115  (closed below)
        processes.append((subprocess.Popen([sys.executable, JOB, out_dir], env=env, stdout=log, stderr=log), log))
    try:
        for process, _ in processes:
            process.wait(timeout=TIMEOUT_S)
    finally:
        for process, log in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            log.close()
    for index, (process, _) in enumerate(processes):
        if process.returncode != 0:
            with open(os.path.join(out_dir, f"worker{index}.log")) as handle:
                pytest.fail(f"worker {index} exited with {process.returncode}:\n{handle.read()[-4000:]}")
    return [dict(np.load(os.path.join(out_dir, f"worker{index}.npz"))) for index in range(2)]


def test_noiseless_update_equals_the_one_device_update_on_every_worker(workers):
    for results in workers:
        assert int(results["steps"]) == 3
        np.testing.assert_allclose(results["noiseless"], results["reference"], atol=1e-5)
        np.testing.assert_allclose(results["noiseless_accumulated_2"], results["reference"], atol=1e-5)


def test_checkpoint_and_resume_continue_the_schedule(workers):
    for results in workers:
        assert int(results["resumed_steps"]) == 3
        np.testing.assert_allclose(results["resumed"], results["reference"], atol=1e-5)


def test_noise_is_one_draw_of_std_sigma_and_the_same_on_both_workers(workers):
    noise = workers[0]["noise"]
    np.testing.assert_allclose(workers[1]["noise"], noise, atol=1e-6)  # The model stays in sync.
    assert np.std(noise) == pytest.approx(4.0 * LEARNING_RATE / BATCH, rel=0.05)


def test_workers_sample_the_same_poisson_batches(workers):
    np.testing.assert_array_equal(workers[0]["poisson_rows"], workers[1]["poisson_rows"])


@pytest.mark.parametrize("name", ["source", "padded_source"])  # a static batch size, and pad_to_multiple's
def test_from_a_memmap_each_worker_reads_only_its_share_of_one_global_sample(workers, name):
    samples, rows = workers[0][f"{name}_samples"], workers[0][f"{name}_rows"]
    np.testing.assert_array_equal(workers[1][f"{name}_samples"], samples)
    # One replica a worker: worker j feeds the j-th half of each batch.
    shares = [
        np.concatenate([sample[j * size // 2 : (j + 1) * size // 2] for sample, size in zip(samples, rows)])
        for j in range(2)
    ]
    for results, share in zip(workers, shares):
        share = share[share >= 0]
        assert sorted(results[f"{name}_reads"]) == sorted(share)  # no row read twice, no other worker's row read
        assert sorted(results[f"{name}_fed"]) == sorted(share)
    union = np.concatenate([results[f"{name}_reads"] for results in workers])
    assert sorted(union) == sorted(samples[samples >= 0])  # the global samples, whole

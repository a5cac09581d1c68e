"""Shared pytest setup.

* absl flags are marked parsed, since pytest does not parse them (examples read FLAGS).
* The CPU is split into 2 logical devices before TensorFlow starts, so that ``MirroredStrategy`` tests run two
  replicas on this CPU-only machine (ops without a device still run on the first, as with one device).
* ``@pytest.mark.keras2_only(reason=...)`` marks a test of a Keras 2 feature (e.g. the optimizer's own per-example
  jacobian path, which Keras 3's train step cannot reach): it is skipped, with its reason, on Keras 3.
* ``example_server``: runs ``python -m <trainer of examples/ or research/> <flags>`` from the repository root as a
  child forked from one server per pytest process (tests/forked_runs.py), which imported TensorFlow and the library
  once; the child prints and returns what a fresh process would.
* Under pytest-xdist the default ``--dist load`` becomes ``loadgroup``: the tests of a module marked
  ``xdist_group`` (one whose module fixtures run trainings) run on one worker, which computes its fixtures once
  instead of both workers each computing them (the largest groups start first); every other test is handed out one
  at a time, so the workers finish together.
* The JAX stack (``keras_dyndp[jax,test]``, no TensorFlow): Keras runs on JAX (``KERAS_BACKEND=jax`` unless set)
  and the suite is tests/jax_backend, tests/conformance (the DP invariants every backend keeps) and the modules in
  `BACKEND_NEUTRAL` (they import neither TensorFlow nor JAX, or run on the backend Keras runs on). Where JAX is not
  installed, tests/jax_backend is not collected.
"""

import importlib.util
import os
import pathlib

import forked_runs
import pytest
from absl import flags

HAS_TENSORFLOW = importlib.util.find_spec("tensorflow") is not None
HAS_JAX = importlib.util.find_spec("jax") is not None
if HAS_JAX and not HAS_TENSORFLOW:
    os.environ.setdefault("KERAS_BACKEND", "jax")

BACKEND_NEUTRAL = frozenset(
    {
        "datasets/test_infinite_mnist.py",
        "datasets/test_mnist_loader.py",
        "datasets/test_names_loader.py",
        "examples/test_hub_finetune_example.py",
        "examples/test_imdb_transformer_example.py",
        "examples/test_jax_digits.py",
        "examples/test_mnist_on_disk_example.py",
        "examples/test_models.py",
        "examples/test_trainer_command_lines.py",
        "test_cli.py",
        "test_architecture.py",
        "test_backend.py",
        "core/test_adaptive_clipping.py",
        "core/test_batch_sizes.py",
        "test_callbacks.py",
        "test_docstrings.py",
        "test_doc_numbers.py",
        "test_install_numbers.py",
        "test_keras_hub.py",
        "keras_glue/test_entry_points.py",
        "rules/test_ghost_cost.py",
        "rules/test_keras_hub_rules.py",
        "rules/test_ready_made_rules.py",
        "rules/test_rule_registry.py",
        "data/test_sampling.py",
        "keras_glue/test_epoch_logs.py",
        "core/test_mechanism.py",
        "core/test_noise_seed.py",
        "test_optimizer_base.py",
        "keras_glue/test_private_model.py",
        "test_privacy_report.py",
        "core/test_refusals.py",
        "keras_glue/test_registration.py",
        "keras_glue/test_restarts.py",
        "keras_glue/test_saved_state.py",
        "schedules/test_budget.py",
        "schedules/test_calibration.py",
        "schedules/test_schedule.py",
        "data/test_sources.py",
        "core/test_step_checks.py",
        "rules/test_sublayers.py",
        "core/test_validation.py",
        "audit/test_bounds.py",
        "audit/test_white_box.py",
        "audit/test_black_box.py",
        "accounting/test_adaptive_accounting.py",
        "accounting/test_cdp.py",
        "accounting/test_fast_pld.py",
        "accounting/test_fast_rdp.py",
        "accounting/test_gdp.py",
        "accounting/test_noise_range.py",
        "accounting/test_registry.py",
        "accounting/test_scale_search.py",
    }
)
_TESTS = pathlib.Path(__file__).parent

NUM_LOGICAL_CPUS = 2


def _split_the_cpu() -> None:
    # The example trainers' quiet TensorFlow import: no C++ start-up lines ("E0000 ... failed call to cuInit") at the
    # top of the test run, where a user would read them as a failure.
    importlib.import_module("examples")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    (cpu,) = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS)


@pytest.fixture(name="example_server", scope="session")
def fixture_example_server():
    """The forked-runs server the trainers' runs fork from (started on the first run)."""
    server = forked_runs.Server(forked_runs.trainers_start_up(), cwd=_TESTS.parent)
    yield server
    server.close()


def pytest_ignore_collect(collection_path, config):
    del config  # Unused.
    path = pathlib.Path(collection_path)
    if not path.is_relative_to(_TESTS):
        return None
    relative = path.relative_to(_TESTS).as_posix()
    if relative.startswith("jax_backend"):
        return True if not HAS_JAX else None
    if relative.startswith("conformance"):
        return None  # Every stack runs it, through the backend it has.
    if not HAS_TENSORFLOW and collection_path.suffix == ".py" and relative not in BACKEND_NEUTRAL:
        return True
    return None


def pytest_configure(config):
    flags.FLAGS.mark_as_parsed()
    if getattr(config.option, "dist", "no") == "load":  # the controller, before it starts the workers
        config.option.dist = "loadgroup"
    if getattr(config, "workerinput", {}).get("loadgroup"):  # a worker: suffix the grouped tests' ids with the group
        config.option.loadgroup = True
    if HAS_TENSORFLOW:
        _split_the_cpu()
    config.addinivalue_line("markers", "keras2_only(reason): the test needs Keras 2; skipped on Keras 3.")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """pytest-xdist's controller tells each worker its ``--dist``, which a worker reads from its arguments only."""
    node.workerinput["loadgroup"] = node.config.option.dist == "loadgroup"


def pytest_collection_modifyitems(config, items):
    del config  # Unused.
    marked = [item for item in items if item.get_closest_marker("keras2_only")]
    if not marked:
        return
    from keras_dyndp.tf_backend import keras_compat  # pylint: disable=import-outside-toplevel  (imports TensorFlow)

    if keras_compat.KERAS_MAJOR_VERSION == 2:
        return
    for item in marked:
        reason = item.get_closest_marker("keras2_only").kwargs.get("reason", "needs Keras 2")
        item.add_marker(pytest.mark.skip(reason=f"Keras 2 only: {reason}"))

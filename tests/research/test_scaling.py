"""research.trainer under tf.distribute (--strategy, on the 2 logical CPUs of conftest) and with
--accumulation_steps: same steps and privacy report as one device, checkpoints resume, conflicting options refused."""

import types

import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver

from keras_dyndp import cli
from keras_dyndp.core import batch_sizes
from keras_dyndp.tf_backend import data as dp_data
from research import batches
from research import digits
from research import distribute
from research import results
from research import run_config
from research import run_flags
from research import trainer

# The trainers run with --seed here, for reproducible tests; a seeded run's noise seed is known, which warns by design.
pytestmark = pytest.mark.filterwarnings("ignore::keras_dyndp.core.noise_seed.NoiseSeedWarning")

FLAGS = flags.FLAGS


def _train(**overrides) -> results.RunResult:
    # pad_to_multiple=0: one batch shape, one trace of the train step (each new shape retraces it under a strategy).
    settings = dict(seed=0, verbose=0, epochs=2.0, batch_size=64, max_steps=3, pad_to_multiple=0)
    settings.update(overrides)
    return trainer.train(digits.make_task(), run_config.RunConfig(**settings))


def test_mirrored_run_with_accumulation_reports_what_one_device_reports(tmp_path, capsys):
    model_dir = str(tmp_path / "run")
    mirrored = _train(strategy="mirrored", accumulation_steps=2, model_dir=model_dir)
    out = capsys.readouterr().out
    assert "Strategy: mirrored, 2 replica(s) in sync; each batch clipped in 2 physical batches" in out
    single = _train()
    assert "Strategy: default, 1 replica(s) in sync" in capsys.readouterr().out
    # The ledger counts global (logical) steps: the same schedule, steps and epsilons as one device.
    assert mirrored.steps == single.steps == 3 and mirrored.total_steps == single.total_steps == 45
    assert mirrored.epsilon_gdp_clt == single.epsilon_gdp_clt
    assert mirrored.epsilon_rigorous == single.epsilon_rigorous
    assert mirrored.config.strategy == "mirrored" and mirrored.config.accumulation_steps == 2
    schedule, _, _ = trainer.make_schedule(mirrored.config, 1437)
    assert trainer.make_optimizer(mirrored.config, schedule, schedule.num_steps).accumulation_steps == 2
    # A checkpoint written under the strategy resumes under it, its counter continuing the schedule.
    resumed = _train(strategy="mirrored", accumulation_steps=2, model_dir=model_dir, max_steps=4)
    assert resumed.steps == 4 and f"Resumed from {model_dir} at step 3 of 45." in capsys.readouterr().out


@pytest.mark.parametrize("pad_to_multiple", [0, 32, 5])
def test_poisson_batches_split_evenly_across_the_replicas(pad_to_multiple):
    data = digits.load_data()
    config = run_config.RunConfig(sampling="poisson", pad_to_multiple=pad_to_multiple)
    p = 64 / data.num_train
    default_cap = batch_sizes.default_max_batch_size(data.num_train, p)
    strategies = [distribute.make_strategy("default"), distribute.make_strategy("mirrored")]
    assert [strategy.num_replicas_in_sync for strategy in strategies] == [1, 2]  # conftest's 2 logical CPUs
    for strategy in strategies:
        num_replicas = strategy.num_replicas_in_sync
        with strategy.scope():  # as research.trainer builds them: keras_dyndp.poisson_batches reads the replicas
            dataset = batches.train_batches(config, data, p, seed=0, num_steps=20)
        sampling = dp_data.poisson_sampling(dataset)
        assert sampling.max_batch_size % num_replicas == 0
        assert default_cap <= sampling.max_batch_size < default_cap + num_replicas
        rows = [len(weights) for _, _, weights in dataset]
        assert all(row % num_replicas == 0 for row in rows)
        if pad_to_multiple:
            assert sampling.pad_to_multiple % pad_to_multiple == 0
            assert max(rows) < sampling.max_batch_size  # about 64 +- 8 examples: below the cap of about 110
        else:
            assert set(rows) == {sampling.max_batch_size}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(per_example="jacobian", accumulation_steps=2), "--accumulation_steps > 1 needs --per_example=fast"),
        (dict(method="nonprivate", accumulation_steps=2), "--accumulation_steps applies to the DP methods"),
        (dict(strategy="multi_worker", model_dir="/tmp/x"), "--strategy=multi_worker takes no --model_dir"),
    ],
)
def test_conflicting_options_are_flag_errors_before_training(overrides, message):
    # Refused before any strategy exists (a MultiWorkerMirroredStrategy could not be made in this process).
    with pytest.raises(run_config.FlagError, match=message):
        _train(**overrides)


@pytest.mark.parametrize(
    "arguments, named",
    [
        (["--accumulation_steps=0"], "flag --accumulation_steps=0: --accumulation_steps must be > 0."),
        (["--strategy=multi_worker", "--model_dir=/tmp/x"], "takes no --model_dir"),
        (["--strategy=gpus"], "flag --strategy=gpus"),
        (
            ["--per_example=jacobian", "--accumulation_steps=2"],
            "flags method=dynamic, per_example=jacobian, accumulation_steps=2: --accumulation_steps > 1 needs "
            "--per_example=fast",
        ),
    ],
)
def test_bad_scaling_flags_exit_2_with_one_line(arguments, named, capsys):
    with flagsaver.flagsaver():
        with pytest.raises(SystemExit) as exit_info:
            cli.parse_flags(["digits.py"] + arguments)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("digits.py: error: ") and named in err[0]


def test_scaling_flags_are_read_into_the_config():
    with flagsaver.flagsaver():
        cli.parse_flags(["digits.py", "--strategy=multi_worker", "--seed=3", "--accumulation_steps=4"])
        config = run_flags.config_from_flags()
    assert (config.strategy, config.accumulation_steps, config.seed) == ("multi_worker", 4, 3)
    assert (run_config.RunConfig().strategy, run_config.RunConfig().accumulation_steps) == ("default", 1)


def _strategy_with(cluster: dict, task_type: str | None, task_id: int | None) -> types.SimpleNamespace:
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), task_type=task_type, task_id=task_id
    )
    return types.SimpleNamespace(cluster_resolver=resolver)


def test_only_the_chief_writes():
    workers = {"worker": ["localhost:1", "localhost:2"]}
    assert distribute.is_chief(tf.distribute.get_strategy())
    assert distribute.is_chief(_strategy_with({}, None, None))
    assert distribute.is_chief(_strategy_with(workers, "worker", 0))
    assert not distribute.is_chief(_strategy_with(workers, "worker", 1))
    with_chief = {"chief": ["localhost:0"], **workers}
    assert distribute.is_chief(_strategy_with(with_chief, "chief", 0))
    assert not distribute.is_chief(_strategy_with(with_chief, "worker", 0))


def test_mirrored_strategy_spans_the_logical_cpus():
    assert distribute.make_strategy("mirrored").num_replicas_in_sync == len(tf.config.list_logical_devices("CPU")) == 2
    assert distribute.make_strategy("default") is tf.distribute.get_strategy()

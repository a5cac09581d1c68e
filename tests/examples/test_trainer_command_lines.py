"""Every trainer of examples/ and research/ keeps one command-line convention (`keras_dyndp.cli`): ``--help`` exits 0
and lists the trainer's flags; missing data is one ``<program>: error:`` line on stderr naming the path and how to get
the data, exit status 2. Each run exits before training. The module's command lines run in one process
(tests/forked_runs.py: each in a child forked after the start-up they share, with what a fresh
``python -m`` process would print and return)."""

import importlib.util
import itertools
import os
import pathlib

import forked_runs
import pytest
from idx_files import write_idx_folder

pytestmark = pytest.mark.xdist_group("trainer_command_lines")  # its module fixtures run once (tests/conftest.py)

REPO = pathlib.Path(__file__).resolve().parents[2]
_HAS_JAX = importlib.util.find_spec("jax") is not None
_HAS_KERAS_HUB = importlib.util.find_spec("keras_hub") is not None

# Trainer module -> flags its --help must list.
HELP_FLAGS = {
    "examples.digits": ["--epsilon", "--method", "--epochs", "--model_dir"],
    "examples.mnist": ["--idx_dir", "--data_dir", "--initial_clip", "--epsilon"],
    "examples.mnist_on_disk": ["--idx_dir", "--memmap_dir", "--initial_clip", "--epsilon"],
    "examples.fashion_mnist": ["--idx_dir", "--data_dir", "--initial_clip", "--epsilon"],
    "examples.imdb": ["--imdb_dir", "--data_dir", "--epsilon"],
    "examples.imdb_transformer": ["--imdb_dir", "--finetune", "--lora_rank", "--public_fraction", "--epsilon"],
    "examples.hub_finetune": ["--imdb_dir", "--preset", "--finetune", "--lora_rank", "--epsilon"],
    "examples.names": ["--names_dir", "--epsilon"],
    "examples.chest_xray": ["--chest_xray_dir", "--image_size", "--vgg_width"],
    "examples.federated_mnist": ["--num_clients", "--deformation_seed", "--epsilon"],
    "examples.audit": ["--epsilons", "--num_canaries", "--plot"],
    "examples.jax_digits": ["--epsilon", "--training_metrics"],
    "research.digits": ["--method", "--accountant", "--model_dir", "--results_csv"],
    "research.mnist": ["--idx_dir", "--method", "--seed"],
    "research.fashion_mnist": ["--idx_dir", "--method"],
    "research.imdb": ["--imdb_dir", "--vocabulary_file", "--method"],
    "research.names": ["--names_dir", "--method"],
    "research.chest_xray": ["--chest_xray_dir", "--method"],
    "research.federated_mnist": ["--num_clients", "--method"],
    "research.sweep": ["--task", "--sweep_dir", "--methods"],
    "research.study": ["--task", "--study_dir", "--contenders"],
}

# Trainer, arguments pointing at absent data -> the path its error line must name.
MISSING = "/nonexistent/keras_dyndp_data"
MISSING_DATA = [
    (f"{folder}.{task}", [f"--{flag}={MISSING}"])
    for folder in ("examples", "research")
    for task, flag in (
        ("mnist", "idx_dir"),
        ("fashion_mnist", "idx_dir"),
        ("imdb", "imdb_dir"),
        ("names", "names_dir"),
        ("chest_xray", "chest_xray_dir"),
    )
] + [("examples.mnist_on_disk", [f"--idx_dir={MISSING}"]), ("examples.imdb_transformer", [f"--imdb_dir={MISSING}"])]

# Trainers that must refuse --epochs=-1.
BAD_FLAG = ["examples.digits", "research.digits", "examples.imdb_transformer", "examples.hub_finetune"]

# Every trainer of examples/, a value absl accepts but the library refuses (its calibration and optimizer checks)
# -> the argument its error line names. "{idx}", "{imdb}", "{names}", "{xray}", "{tmp}": tiny data the fixture
# writes, so that each run reaches the refusal (before any training) in a second or so.
BAD_VALUES = [
    ("examples.digits", ("--epsilon=-1",), "target_epsilon"),
    ("examples.digits", ("--batch_size=5000",), "batch_size"),
    ("examples.jax_digits", ("--epsilon=-1",), "target_epsilon"),
    ("examples.audit", ("--delta=2",), "target_delta"),
    ("examples.federated_mnist", ("--num_clients=40", "--batch_size=50"), "batch_size"),
    ("examples.mnist", ("--idx_dir={idx}", "--batch_size=2", "--epsilon=-1"), "target_epsilon"),
    ("examples.fashion_mnist", ("--idx_dir={idx}", "--batch_size=500"), "batch_size"),
    (
        "examples.mnist_on_disk",
        ("--idx_dir={idx}", "--memmap_dir={tmp}/memmaps", "--batch_size=2", "--epsilon=0"),
        "target_epsilon",
    ),
    ("examples.imdb", ("--imdb_dir={imdb}", "--batch_size=2", "--epsilon=-1"), "target_epsilon"),
    ("examples.imdb_transformer", ("--imdb_dir={imdb}", "--batch_size=2", "--epsilon=-1"), "target_epsilon"),
    ("examples.names", ("--names_dir={names}", "--batch_size=2", "--epsilon=-1"), "target_epsilon"),
    (
        "examples.chest_xray",
        ("--chest_xray_dir={xray}", "--image_size=32", "--batch_size=2", "--epsilon=-1"),
        "target_epsilon",
    ),
]

# The KerasHub example (the [hub] extra) refuses a bad value where KerasHub is installed; elsewhere it says, in one
# error line, to install the extra.
if _HAS_KERAS_HUB:
    BAD_VALUES.append(
        ("examples.hub_finetune", ("--imdb_dir={imdb}", "--batch_size=2", "--epsilon=-1"), "target_epsilon")
    )
NO_KERAS_HUB = [] if _HAS_KERAS_HUB else [("examples.hub_finetune", ("--imdb_dir={imdb}",))]


def _write_tiny_data(folder: pathlib.Path) -> dict[str, str]:
    """The tiny data folders of `BAD_VALUES` under ``folder``, by placeholder."""
    (folder / "idx").mkdir()
    write_idx_folder(folder / "idx", num_train=60)
    for split, label in itertools.product(("train", "test"), ("pos", "neg")):
        (folder / "imdb" / split / label).mkdir(parents=True)
        for i in range(4):
            (folder / "imdb" / split / label / f"{i}_7.txt").write_text(f"A {label} movie {i}", encoding="utf-8")
    (folder / "names").mkdir()
    for language in ("English", "Italian"):
        (folder / "names" / f"{language}.txt").write_text("\n".join(f"{language}{i}" for i in range(6)) + "\n")
    for split, label in itertools.product(("train", "test"), ("NORMAL", "PNEUMONIA")):
        (folder / "xray" / split / label).mkdir(parents=True)
        for i in range(2):  # a 2x2 grey PNG: no TensorFlow needed to write it
            (folder / "xray" / split / label / f"im{i}.png").write_bytes(_TINY_PNG)
    return {name: str(folder / name) for name in ("idx", "imdb", "names", "xray")} | {"tmp": str(folder)}


_TINY_PNG = bytes.fromhex(  # 2x2 8-bit greyscale
    "89504e470d0a1a0a0000000d494844520000000200000002080000000057dd52f80000000e49444154789c6368686068680000060602012c"
    "c150d70000000049454e44ae426082"
)


def _runs_here(module: str) -> bool:
    """research/ and the TensorFlow examples need TensorFlow; jax_digits needs JAX; mnist_on_disk and
    imdb_transformer and hub_finetune run on either."""
    if module == "examples.jax_digits":
        return _HAS_JAX
    if module in ("examples.mnist_on_disk", "examples.imdb_transformer", "examples.hub_finetune"):
        return True
    return importlib.util.find_spec("tensorflow") is not None and os.environ.get("KERAS_BACKEND", "tensorflow") in (
        "tensorflow",
        "",
    )


@pytest.fixture(name="run", scope="module")
def fixture_run(tmp_path_factory, worker_id):
    """``run(module, *arguments)`` -> the ``CompletedProcess`` of ``python -m module arguments``: every command line
    of this module that runs on this stack, run at once (once per session) by tests/forked_runs.py."""
    command_lines = [(module, ["--help"]) for module in HELP_FLAGS] + MISSING_DATA
    command_lines += [(module, ["--epochs=-1"]) for module in BAD_FLAG]
    data = _write_tiny_data(tmp_path_factory.mktemp("tiny_data"))
    command_lines += [(module, list(arguments)) for module, arguments, _ in BAD_VALUES]
    command_lines += [(module, list(arguments)) for module, arguments in NO_KERAS_HUB]
    command_lines = [(module, arguments) for module, arguments in command_lines if _runs_here(module)]
    keys = [(module, tuple(arguments)) for module, arguments in command_lines]
    command_lines = [(module, [part.format(**data) for part in arguments]) for module, arguments in command_lines]
    completed = forked_runs.run_once(
        tmp_path_factory,
        worker_id,
        "trainer_command_lines",
        forked_runs.trainers_start_up(),
        command_lines,
        cwd=REPO,
        timeout=180 + 60 * len(command_lines),
    )
    outcomes = dict(zip(keys, completed))
    return lambda module, *arguments: outcomes[(module, arguments)]


@pytest.mark.parametrize("module", sorted(HELP_FLAGS))
def test_help_exits_0_and_lists_the_trainers_flags(run, module):
    if not _runs_here(module):
        pytest.skip(f"{module} does not run on this stack")
    result = run(module, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    missing = [flag for flag in HELP_FLAGS[module] if flag not in result.stdout]
    assert not missing, result.stdout[-3000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("module, arguments", MISSING_DATA)
def test_missing_data_is_one_error_line_naming_the_path_and_the_remedy_with_status_2(run, module, arguments):
    if not _runs_here(module):
        pytest.skip(f"{module} does not run on this stack")
    result = run(module, *arguments)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr[-3000:]
    program = module.split(".")[1] + ".py"
    assert lines[0].startswith(f"{program}: error: "), lines[0]
    assert MISSING in lines[0] and "Get it" in lines[0], lines[0]


@pytest.mark.parametrize("module", BAD_FLAG)
def test_a_bad_flag_value_is_one_error_line_with_status_2(run, module):
    if not _runs_here(module):
        pytest.skip(f"{module} does not run on this stack")
    result = run(module, "--epochs=-1")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    program = module.split(".")[1] + ".py"
    assert len(lines) == 1 and lines[0].startswith(f"{program}: error: ") and "epochs" in lines[0], result.stderr


@pytest.mark.parametrize("module, arguments, argument", BAD_VALUES)
def test_a_value_the_library_refuses_is_one_error_line_with_status_2_before_training(run, module, arguments, argument):
    if not _runs_here(module):
        pytest.skip(f"{module} does not run on this stack")
    result = run(module, *arguments)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    program = module.split(".")[1] + ".py"
    assert len(lines) == 1 and lines[0].startswith(f"{program}: error: `{argument}` must be"), result.stderr[-3000:]
    assert "Epoch 1" not in result.stdout and "Test accuracy" not in result.stdout  # refused before training


@pytest.mark.skipif(not NO_KERAS_HUB, reason="KerasHub is installed")
def test_the_keras_hub_example_without_keras_hub_is_one_error_line_naming_the_extra(run):
    result = run(*NO_KERAS_HUB[0][:1], *NO_KERAS_HUB[0][1])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("hub_finetune.py: error: needs KerasHub") and "pip install -e '.[hub]'" in lines[0]

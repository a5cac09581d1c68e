"""The command-line conventions of the package's programs: ``dyndp-privacy``, the trainers of examples/ and research/.

* ``--help`` (and ``--helpshort``, ``--helpfull``, ``--helpxml``) prints the usage and exits 0: absl's own exit 1,
  which a shell or CI step reads as a failure.
* A usage error (a bad flag value, an unexpected argument, options that cannot go together), a value the library
  refuses (a ValueError keras_dyndp raises, such as a target epsilon <= 0 or a batch size above N, from the optimizer
  the trainers build from their flags before training: `refused_by_the_library`) or missing data
  (`keras_dyndp.datasets.DataNotFoundError`) ends the program with ONE line on stderr,
  ``<program>: error: <what is wrong and how to fix it>``, and exit status 2 (argparse's convention), no traceback.
* absl's log verbosity is WARNING unless ``--verbosity`` is given: INFO lines (JAX's probing of absent TPU and proxy
  platforms, `PrivacyLogger`'s per-epoch line that repeats the progress bar) are not shown. Python warnings (every
  privacy warning among them) and errors are.
* `define_training_flags` defines the flags every trainer of examples/ has.
"""

from __future__ import annotations

import os
import pathlib
import sys
from collections.abc import Callable
from typing import NoReturn

from absl import app
from absl import flags
from absl import logging

from keras_dyndp.datasets import DataNotFoundError

__all__ = [
    "EXIT_USAGE",
    "UsageError",
    "define_training_flags",
    "fail",
    "main_for",
    "parse_flags",
    "refused_by_the_library",
    "run",
]

EXIT_USAGE = 2

flags.disclaim_key_flags()  # The flags define_training_flags defines are the calling trainer's: its --help lists them.


class UsageError(Exception):
    """A command-line value that cannot work, found after parsing (e.g. a batch size larger than the data): `run`
    prints its message as the one error line and exits with `EXIT_USAGE`."""


def _program_name(argv: list[str] | None = None) -> str:
    argv = sys.argv if argv is None else argv
    return os.path.basename(argv[0]) if argv and argv[0] else "keras_dyndp"


def fail(message: str, program: str | None = None) -> NoReturn:
    """Prints ``<program>: error: <first line of message>`` on stderr and exits with status `EXIT_USAGE` (2).

    Args:
      message: what is wrong and how to fix it; only its first line is printed.
      program: the program's name; default the file name of ``sys.argv[0]``.
    """
    first_line = str(message).strip().splitlines()[0] if str(message).strip() else "failed"
    print(f"{program or _program_name()}: error: {first_line}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS, program: str | None = None) -> list[str]:
    """absl's flag parsing with the conventions above: help exits 0, a bad value or a positional argument fails in
    one line (`fail`), and the log verbosity drops to WARNING unless ``--verbosity`` was given.

    Args:
      argv: the command line, program name first.
      flag_values: the registry to parse into (absl's global one by default).
      program: the program's name in an error line (`fail`); default the file name of ``argv[0]``.

    Returns:
      ``[argv[0]]``: no positional argument is accepted.
    """
    program = program or _program_name(argv)
    try:
        remaining = flag_values(argv)
    except flags.Error as error:
        fail(str(error), program)
    except SystemExit as help_exit:  # Only absl's help flags exit while parsing, with status 1.
        sys.exit(0 if help_exit.code == 1 else help_exit.code)
    if len(remaining) > 1:
        fail(f"unexpected arguments {remaining[1:]}", program)
    if "verbosity" in flag_values and not flag_values["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    return remaining


METHODS = ["vanilla", "growing_mu", "sensitivity_decay", "dynamic", "adaptive"]
"""``--method``'s values: the paper's schedules (`schedules.METHODS`; no accounting import here) and 'adaptive'."""

METHOD_HELP = (
    "DP schedule: the paper's four, or 'adaptive' (vanilla noise with the clip norm adapted to the median per-example "
    "gradient norm from a noised count: Andrew et al. 2021, keras_dyndp.AdaptiveClipping; --initial_clip is C_0)."
)


def schedule_arguments(method: str) -> dict:
    """The optimizer's arguments for a trainer's ``--method``: ``{'method': method}`` for a schedule of the paper;
    for 'adaptive', the vanilla schedule with ``adaptive_clipping=True`` (`keras_dyndp.AdaptiveClipping`'s
    defaults: the median, learning rate 0.2, the count's noise std n / 20).

    Args:
      method: one of `METHODS`.
    """
    return {"method": "vanilla", "adaptive_clipping": True} if method == "adaptive" else {"method": method}


def define_training_flags(
    *,
    epsilon: float,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    unit: str = "example",
    optimizer: str = "SGD",
    model_dir: bool = True,
    flag_values: flags.FlagValues = flags.FLAGS,
) -> None:
    """Defines the flags every trainer of examples/ has, with its task's defaults: ``--method`` (`METHODS`),
    ``--epsilon`` (PLD, delta = 1 / (10 N)), ``--epochs``, ``--batch_size`` (expected, Poisson), ``--learning_rate``,
    ``--model_dir`` and ``--verbose`` (Keras ``fit``'s). They are the caller's key flags: its ``--help`` lists them.

    Args:
      epsilon: the default target epsilon, > 0.
      epochs: the default number of epochs, an int >= 1.
      batch_size: the default expected batch size p N, an int >= 1.
      learning_rate: the default learning rate of the optimizer.
      unit: what one of the N training examples is, in the help (e.g. 'image', 'client').
      optimizer: the base optimizer's name in the help ('SGD', 'Adam').
      model_dir: whether to define ``--model_dir``, where the trainer writes its weights and TensorBoard logs.
      flag_values: the registry to define them in (absl's global one by default).
    """
    define = {"flag_values": flag_values}
    flags.DEFINE_enum("method", "dynamic", METHODS, METHOD_HELP, **define)
    flags.DEFINE_float(
        "epsilon", epsilon, "Target epsilon of the whole run (PLD accountant, delta = 1 / (10 N)).", **define
    )
    flags.DEFINE_integer("epochs", epochs, "Epochs: T = ceil(epochs N / batch_size) DP steps.", lower_bound=1, **define)
    batch_help = f"Expected batch size: each {unit} joins a step with p = batch_size / N."
    flags.DEFINE_integer("batch_size", batch_size, batch_help, lower_bound=1, **define)
    flags.DEFINE_float("learning_rate", learning_rate, f"{optimizer} learning rate.", **define)
    if model_dir:
        flags.DEFINE_string(
            "model_dir", None, "Where to write the trained weights and the TensorBoard privacy logs.", **define
        )
    flags.DEFINE_integer("verbose", 2, "Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch.", **define)


# The package's folder: a ValueError raised by code in it is `refused_by_the_library`.
_PACKAGE = pathlib.Path(__file__).resolve().parent


def refused_by_the_library(error: BaseException) -> bool:
    """Whether ``error`` is a ValueError raised by keras_dyndp's own code (the innermost frame of its traceback is in
    the package), whose message names the argument, its range and what to do: the whole story. A ValueError raised
    elsewhere (numpy, TensorFlow, JAX, a trainer's own code) may be a bug's: it keeps its traceback."""
    if not isinstance(error, ValueError) or error.__traceback__ is None:
        return False
    innermost = error.__traceback__
    while innermost.tb_next is not None:
        innermost = innermost.tb_next
    return pathlib.Path(innermost.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


def main_for(main: Callable[[], None], expected_errors: tuple[type[Exception], ...] = ()) -> Callable[[list], None]:
    """The absl ``main(argv)`` that runs `main` (no arguments; it reads its flags) and turns `UsageError`,
    `DataNotFoundError`, a ValueError `refused_by_the_library` and `expected_errors` (exception types whose message
    is the whole story) into one error line naming ``argv[0]`` and exit status 2 (`fail`), without a traceback."""
    caught = (UsageError, DataNotFoundError, *expected_errors)

    def absl_main(argv: list[str]) -> None:
        try:
            main()
        except caught as error:
            fail(str(error), _program_name(argv))
        except ValueError as error:
            if not refused_by_the_library(error):
                raise
            fail(str(error), _program_name(argv))

    return absl_main


def run(main: Callable[[], None], *, expected_errors: tuple[type[Exception], ...] = ()) -> None:
    """Runs `main` (no arguments; it reads its flags) as an absl program with the conventions above (`parse_flags`,
    `main_for`).

    Args:
      main: the program's body.
      expected_errors: exception types besides `UsageError` and `DataNotFoundError` whose message is the whole
        story (no traceback): one line, exit status 2.
    """
    app.run(main_for(main, expected_errors), flags_parser=parse_flags)

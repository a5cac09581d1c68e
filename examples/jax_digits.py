"""Dynamic DP-SGD on Keras 3's JAX backend, without TensorFlow: scikit-learn's digits, as examples.digits.

The same task, model, budget and schedule as `examples.digits` (epsilon 3, delta 1 / (10 N), expected batch 128,
30 epochs, the paper's dynamic schedule with 1/rho_mu = 0.8 and 1/rho_c = 0.3), written with the public API a JAX
user calls: a DP optimizer calibrated from the budget, ``make_private``, `PoissonBatches` at the schedule's rate,
``PrivacyLogger`` and ``BudgetStop``. It sets ``KERAS_BACKEND=jax`` itself and needs ``pip install -e '.[jax]'``
and scikit-learn (``.[examples]``); without JAX it says so in one line and exits with status 2.

The run's T steps take ``--epochs`` Keras epochs (the first T mod epochs of them one step longer), as in the
shared trainer. Only the noised updates leave a training batch: loss and accuracy of the training batches are
computed (without noise, outside the DP guarantee) only with ``--training_metrics``, weighted so that the
weight-0 padding rows of the Poisson batches do not count.

    python -m examples.jax_digits                       # dynamic DP-SGD, epsilon 3
    python examples/jax_digits.py --method=vanilla      # constant clip and noise, same budget
"""

import importlib.util
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"
if importlib.util.find_spec("jax") is None:
    print(
        f"{os.path.basename(sys.argv[0])}: error: this example runs Keras on JAX, which this Python "
        f"({sys.executable}) lacks: install the [jax] extra (pip install -e '.[jax,examples]', in a venv of its "
        "own such as the README's .venv-jax) or run it with the Python of such a venv.",
        file=sys.stderr,
    )
    sys.exit(2)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

if __package__ in (None, ""):  # Run as `python examples/NAME.py`: make the package `examples` importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import datasets  # noqa: E402
from examples import digits_cnn  # noqa: E402
from keras_dyndp import jax_backend  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_float("epsilon", 3.0, "Target epsilon, met under the PLD accountant.")
flags.DEFINE_enum("method", "dynamic", ["vanilla", "growing_mu", "sensitivity_decay", "dynamic"], "Schedule.")
flags.DEFINE_integer(
    "epochs", 30, "Epochs: the schedule takes T = ceil(epochs N / batch_size) steps, in this many Keras epochs."
)
flags.DEFINE_integer("batch_size", 128, "Expected batch size p N.")
flags.DEFINE_float("learning_rate", 1.0, "SGD learning rate.")
flags.DEFINE_float("initial_clip", 1.0, "C_0.")
flags.DEFINE_float("rho_mu", 1 / 0.8, "Growth of mu over the run (dynamic, growing_mu).")
flags.DEFINE_float("rho_c", 1 / 0.3, "Decay of C over the run (dynamic, sensitivity_decay).")
flags.DEFINE_bool(
    "training_metrics",
    False,
    "Compute and show loss and accuracy of the training batches. They are computed on the private batches without "
    "noise, outside the DP guarantee; off, only the noised updates leave a batch.",
)
flags.DEFINE_integer("verbose", 2, "Keras fit verbosity.")

TRAINING_METRICS_NOTE = (
    "NOTE: --training_metrics: the training loss and accuracy shown were computed on the private batches without "
    "noise; they are OUTSIDE the DP guarantee. Do not publish them."
)


class RunProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar numbering epochs out of the run's total across several ``fit`` calls (a first call of 7
    epochs would show "Epoch 1/7"; this bar shows "Epoch 1/30"), as `keras_dyndp.keras_compat.RunProgressBar` does
    on TensorFlow."""

    def __init__(self, total_epochs: int):
        super().__init__()
        self.total_epochs = total_epochs

    def set_params(self, params: dict) -> None:
        super().set_params({**params, "epochs": self.total_epochs})


def build_model(data: datasets.TaskData) -> keras.Model:
    """The small CNN of examples.digits (`examples.digits_cnn`); logits."""
    return digits_cnn.build(keras, data.x_train.shape[1:], data.num_classes)


def compile_model(model: keras.Model, optimizer: keras.optimizers.Optimizer, training_metrics: bool) -> keras.Model:
    """``make_private`` (computing training loss and accuracy only if `training_metrics`) and ``compile``.

    The accuracy is a weighted metric: `PoissonBatches` pads every batch with weight-0 rows, which plain ``metrics``
    would count (examples.training does the same).
    """
    model = keras_dyndp.make_private(model, training_metrics=training_metrics)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        weighted_metrics=["accuracy"],
    )
    return model


def epoch_segments(num_steps: int, epochs: int) -> list[tuple[int, int, int]]:
    """The ``fit`` calls ``(initial_epoch, epochs, steps per epoch)`` that take `num_steps` steps in `epochs` Keras
    epochs: T = ceil(epochs N / batch_size) is rarely a multiple of the epochs, so the first T mod epochs epochs
    take one step more."""
    epochs = min(epochs, num_steps)
    shorter, longer = divmod(num_steps, epochs)
    segments = ((0, longer, shorter + 1), (longer, epochs, shorter))
    return [(start, end, steps) for start, end, steps in segments if end > start]


def train(data: datasets.TaskData) -> dict:
    """Trains with the flags' settings; returns the test accuracy and the accountants' epsilons of the run."""
    num_examples = len(data.y_train)
    delta = 1 / (10 * num_examples)
    uses_mu = FLAGS.method in ("growing_mu", "dynamic")
    uses_c = FLAGS.method in ("sensitivity_decay", "dynamic")
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=num_examples,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        method=FLAGS.method,
        initial_clip=FLAGS.initial_clip,
        rho_mu=FLAGS.rho_mu if uses_mu else 1.0,
        rho_c=FLAGS.rho_c if uses_c else 1.0,
        learning_rate=FLAGS.learning_rate,
    )
    schedule = optimizer.schedule
    model = compile_model(build_model(data), optimizer, FLAGS.training_metrics)
    segments = epoch_segments(schedule.num_steps, FLAGS.epochs)
    callbacks = [keras_dyndp.PrivacyLogger(delta=delta), keras_dyndp.BudgetStop()]
    if FLAGS.verbose:
        callbacks.append(RunProgressBar(segments[-1][1]))
    for initial_epoch, epochs, steps_per_epoch in segments:
        batches = jax_backend.PoissonBatches(
            data.x_train,
            data.y_train,
            sampling_probability=schedule.sampling_probability,
            steps_per_epoch=steps_per_epoch,
        )
        history = model.fit(
            batches, initial_epoch=initial_epoch, epochs=epochs, verbose=FLAGS.verbose, callbacks=callbacks
        )
    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    steps = int(optimizer.dp_step.numpy())
    return {
        "test_accuracy": float(accuracy),
        "steps": steps,
        "num_steps": schedule.num_steps,
        "delta": delta,
        "epsilon_pld": float(history.history["epsilon_pld"][-1]),
        "epsilon_gdp_clt": float(history.history["epsilon_gdp_clt"][-1]),
        "epsilon_rdp": float(schedule.epsilon(delta, accountant="rdp", steps=steps)),
    }


def main(argv: list[str]) -> None:
    del argv  # Unused.
    data = datasets.load_digits()
    print(data.description)
    result = train(data)
    print(
        f"{FLAGS.method}: test accuracy {result['test_accuracy']:.4f} after {result['steps']} of "
        f"{result['num_steps']} DP steps; epsilon at delta={result['delta']:.3g}: PLD {result['epsilon_pld']:.3f}, "
        f"RDP {result['epsilon_rdp']:.3f}, GDP-CLT {result['epsilon_gdp_clt']:.3f} (Keras {keras.__version__} on "
        f"{keras.backend.backend()})"
    )
    if FLAGS.training_metrics:
        print(TRAINING_METRICS_NOTE)


if __name__ == "__main__":
    app.run(main)

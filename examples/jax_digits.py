"""Dynamic DP-SGD on Keras 3's JAX backend, without TensorFlow: scikit-learn's digits, as examples.digits.

The same task, model, budget and schedule as `examples.digits` (epsilon 3, delta 1 / (10 N), expected batch 128,
30 epochs, the paper's dynamic schedule with 1/rho_mu = 0.8 and 1/rho_c = 0.3), written with the public API a JAX
user calls: a DP optimizer calibrated from the budget, ``make_private``, `poisson_batches` at the schedule's rate,
``PrivacyLogger`` and ``BudgetStop``. It sets ``KERAS_BACKEND=jax`` itself and needs what the README's JAX command
installs, ``pip install -e '.[jax,test]'`` (JAX, and scikit-learn for the digits); without JAX it says so in one line
and exits with status 2.

The run's T steps take ``--epochs`` Keras epochs (the first T mod epochs of them one step longer). Training-batch
loss and accuracy (no noise: outside the DP guarantee) are computed only with ``--training_metrics``.

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
        f"({sys.executable}) lacks: install the [jax] extra (pip install -e '.[jax,test]', in a venv of its "
        "own such as the README's .venv-jax) or run it with the Python of such a venv.",
        file=sys.stderr,
    )
    sys.exit(2)

from absl import flags  # noqa: E402

if __package__ in (None, ""):  # Run as `python examples/jax_digits.py`: make the repository importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402

FLAGS = flags.FLAGS
cli.define_training_flags(epsilon=3.0, epochs=30, batch_size=128, learning_rate=1.0, model_dir=False)
flags.DEFINE_bool("training_metrics", False, "Show training-batch loss and accuracy (outside the DP guarantee).")


class RunProgressBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar numbering epochs out of the run's total across several ``fit`` calls ("Epoch 1/30")."""

    def __init__(self, total_epochs: int):
        super().__init__()
        self.total_epochs = total_epochs

    def set_params(self, params: dict) -> None:
        super().set_params({**params, "epochs": self.total_epochs})


def epoch_segments(num_steps: int, epochs: int) -> list[tuple[int, int, int]]:
    """The ``fit`` calls ``(initial_epoch, epochs, steps per epoch)`` that take `num_steps` steps in `epochs` Keras
    epochs: T = ceil(epochs N / batch_size) is rarely a multiple of the epochs, so the first T mod epochs epochs
    take one step more."""
    epochs = min(epochs, num_steps)
    shorter, longer = divmod(num_steps, epochs)
    segments = ((0, longer, shorter + 1), (longer, epochs, shorter))
    return [(start, end, steps) for start, end, steps in segments if end > start]


def main() -> None:
    data = datasets.load_digits()
    # int32 labels: JAX holds no int64 without jax_enable_x64 (it would truncate them, with a warning).
    data.y_train, data.y_test = data.y_train.astype("int32"), data.y_test.astype("int32")
    print(data.description)
    delta = 1 / (10 * data.num_train)
    optimizer = keras_dyndp.DynamicDPKerasSGD(
        target_epsilon=FLAGS.epsilon,
        target_delta=delta,
        num_examples=data.num_train,
        batch_size=FLAGS.batch_size,
        epochs=FLAGS.epochs,
        **cli.schedule_arguments(FLAGS.method),
        initial_clip=1.0,
        rho_mu=1 / 0.8,  # the paper's 1/rho_mu = 0.8 and 1/rho_c = 0.3, each used by the methods it shapes
        rho_c=1 / 0.3,
        learning_rate=FLAGS.learning_rate,
    )
    schedule = optimizer.schedule
    model = models.digits_cnn(data.x_train.shape[1:], data.num_classes)
    model = keras_dyndp.make_private(model, training_metrics=FLAGS.training_metrics)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),  # per example
        weighted_metrics=["accuracy"],  # padding rows of the Poisson batches have weight 0
    )
    segments = epoch_segments(schedule.num_steps, FLAGS.epochs)
    callbacks = [keras_dyndp.PrivacyLogger(delta=delta), keras_dyndp.BudgetStop()]
    if FLAGS.verbose:
        callbacks.append(RunProgressBar(segments[-1][1]))
    for initial_epoch, epochs, steps_per_epoch in segments:
        batches = keras_dyndp.poisson_batches(
            data.x_train,
            data.y_train,
            sampling_probability=schedule.sampling_probability,
            steps_per_epoch=steps_per_epoch,
        )
        model.fit(batches, initial_epoch=initial_epoch, epochs=epochs, verbose=FLAGS.verbose, callbacks=callbacks)
    _, accuracy = model.evaluate(data.x_test, data.y_test, verbose=0)
    steps = optimizer.released_steps
    print(
        f"Test accuracy: {accuracy:.4f} ({len(data.y_test)} test images; Keras {keras.__version__} on "
        f"{keras.backend.backend()})"
    )
    print(
        keras_dyndp.run_summary(
            schedule,
            delta,
            steps,
            method=FLAGS.method,
            overflow_probability=optimizer.overflow_probability,
            privacy_unit="training image",
            training_metrics=FLAGS.training_metrics,
        )
    )


if __name__ == "__main__":
    cli.run(main)

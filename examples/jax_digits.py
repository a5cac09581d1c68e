"""Dynamic DP-SGD on Keras 3's JAX backend, without TensorFlow: scikit-learn's digits, as examples.digits.

The same task, model, budget and schedule as `examples.digits` (epsilon 3, delta 1 / (10 N), expected batch 128,
30 epochs, the paper's dynamic schedule with 1/rho_mu = 0.8 and 1/rho_c = 0.3), written with the public API a JAX
user calls: a DP optimizer calibrated from the budget, ``make_private``, `PoissonBatches` at the schedule's rate,
``PrivacyLogger`` and ``BudgetStop``. It sets ``KERAS_BACKEND=jax`` itself and needs ``pip install -e '.[jax]'``
and scikit-learn (``.[examples]``).

    python -m examples.jax_digits                       # dynamic DP-SGD, epsilon 3
    python examples/jax_digits.py --method=vanilla      # constant clip and noise, same budget
"""

import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

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
flags.DEFINE_integer("epochs", 30, "Epochs (each 1/p Poisson batches).")
flags.DEFINE_integer("batch_size", 128, "Expected batch size p N.")
flags.DEFINE_float("learning_rate", 1.0, "SGD learning rate.")
flags.DEFINE_float("initial_clip", 1.0, "C_0.")
flags.DEFINE_float("rho_mu", 1 / 0.8, "Growth of mu over the run (dynamic, growing_mu).")
flags.DEFINE_float("rho_c", 1 / 0.3, "Decay of C over the run (dynamic, sensitivity_decay).")
flags.DEFINE_integer("verbose", 2, "Keras fit verbosity.")


def build_model(data: datasets.TaskData) -> keras.Model:
    """The small CNN of examples.digits (`examples.digits_cnn`); logits."""
    return digits_cnn.build(keras, data.x_train.shape[1:], data.num_classes)


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
    model = keras_dyndp.make_private(build_model(data))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"),
        metrics=["accuracy"],
    )
    batches = jax_backend.PoissonBatches(data.x_train, data.y_train, sampling_probability=schedule.sampling_probability)
    epochs = -(-schedule.num_steps // len(batches))  # the last epoch ends at the budget (BudgetStop)
    history = model.fit(
        batches,
        epochs=epochs,
        verbose=FLAGS.verbose,
        callbacks=[keras_dyndp.PrivacyLogger(delta=delta), keras_dyndp.BudgetStop()],
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


if __name__ == "__main__":
    app.run(main)

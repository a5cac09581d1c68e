"""Empirical privacy audit in one run: a calibrated dynamic schedule, white-box and black-box, beside its claim.

For each claimed epsilon (``--epsilons``, PLD accountant, delta ``--delta``) the script calibrates the paper's
dynamic schedule (1/rho_mu = 0.8, 1/rho_c = 0.3) and audits it twice, each in ONE training run with canaries that
each join the training set with probability 1/2:

* white-box (`keras_dyndp.audit.white_box_audit`): ``--num_canaries`` Dirac gradient canaries, every one
  in every step (p = 1, ``--white_box_steps`` steps), scored from every intermediate model: the strongest attack;
* black-box (`keras_dyndp.audit.black_box_audit`): ``--black_box_canaries`` mislabeled digits added to
  scikit-learn's bundled digits (1437 training images), a small CNN trained with `DynamicDPKerasSGD` from the budget
  (expected batch 128, ``--epochs``), scored by the final model's loss: a weak attack, far below the claim.

It prints one row per setting: the claimed epsilon, the one-run (Steinke et al. 2023) and f-DP (Mahloujifar et al.
2024) lower bounds at ``--confidence``, m, the guesses and the correct ones. A lower bound is not a guarantee: only a
bound ABOVE the claim is evidence of a leak (docs/audit.md).

    python -m examples.audit                                  # epsilon 2 and 8, about a minute on 2 cores
    python examples/audit.py --epsilons=8 --num_canaries=5000 --plot=/tmp/audit.png
"""

import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/audit.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import examples  # noqa: F401,E402  (quiets TensorFlow's start-up logs: import it first)

# isort: split
import tensorflow as tf  # noqa: E402

import keras_dyndp  # noqa: E402
from examples import models  # noqa: E402
from keras_dyndp import cli  # noqa: E402
from keras_dyndp import datasets  # noqa: E402
from keras_dyndp.audit import black_box_audit  # noqa: E402
from keras_dyndp.audit import white_box_audit  # noqa: E402

keras = tf.keras  # Keras 3, or Keras 2 on TensorFlow 2.15 and with TF_USE_LEGACY_KERAS=1.

flags.DEFINE_list("epsilons", ["2", "8"], "Claimed epsilons (PLD accountant) to calibrate and audit.")
_BAD = "--epsilons must be a comma-separated list of numbers > 0, e.g. --epsilons=2,8."
flags.register_validator("epsilons", lambda eps: all(e.replace(".", "", 1).isdigit() and float(e) for e in eps), _BAD)
flags.DEFINE_float("delta", 1e-5, "Delta of the claims and of the lower bounds.")
flags.DEFINE_float("confidence", 0.95, "Confidence of the lower bounds.")
flags.DEFINE_integer("num_canaries", 1000, "White-box canaries m.")
flags.DEFINE_integer("white_box_steps", 20, "White-box steps T (full batch: every canary in every step).")
flags.DEFINE_integer("black_box_canaries", 200, "Black-box canaries m (mislabeled training digits).")
flags.DEFINE_integer("epochs", 30, "Black-box training epochs (expected batch 128), as examples.digits.")
flags.DEFINE_string("plot", None, "Path of a PNG: claimed epsilon vs both lower bounds, per setting.")
FLAGS = flags.FLAGS

RHO_MU, RHO_C = 1 / 0.8, 1 / 0.3
HEADER = "setting            claimed eps (PLD) one-run bound f-DP bound     m guesses correct confidence"


def audit(epsilon: float, data) -> list[tuple[str, keras_dyndp.audit.CanaryAuditReport]]:
    schedule = keras_dyndp.calibrate(
        "dynamic",
        target_epsilon=epsilon,
        target_delta=FLAGS.delta,
        sampling_probability=1.0,
        num_steps=FLAGS.white_box_steps,
        initial_clip=1.0,
        rho_mu=RHO_MU,
        rho_c=RHO_C,
    )
    kwargs = {"delta": FLAGS.delta, "confidence": FLAGS.confidence}
    white = white_box_audit(schedule, num_canaries=FLAGS.num_canaries, **kwargs)

    def optimizer_fn(num_examples: int) -> keras_dyndp.DynamicDPKerasSGD:
        return keras_dyndp.DynamicDPKerasSGD(
            target_epsilon=epsilon,
            target_delta=FLAGS.delta,
            num_examples=num_examples,
            batch_size=128,
            epochs=FLAGS.epochs,
            method="dynamic",
            initial_clip=1.0,
            rho_mu=RHO_MU,
            rho_c=RHO_C,
            learning_rate=1.0,
        )

    black = black_box_audit(
        data.x_train,
        data.y_train,
        model_fn=models.digits_cnn,
        optimizer_fn=optimizer_fn,
        num_canaries=FLAGS.black_box_canaries,
        epochs=FLAGS.epochs,
        pad_to_multiple=32,
        **kwargs,
    )
    return [(f"white-box/eps={epsilon:g}", white), (f"black-box/eps={epsilon:g}", black)]


def plot(rows, path: str) -> None:
    from matplotlib.figure import Figure  # pylint: disable=import-outside-toplevel  (no pyplot: no display)

    figure = Figure(figsize=(7, 3.5), dpi=100)
    axes = figure.subplots()
    bars = {"claimed (PLD)": "claimed_epsilon", "one-run bound": "epsilon_one_run", "f-DP bound": "epsilon_fdp"}
    for i, (label, field) in enumerate(bars.items()):
        positions = [j + (i - 1) * 0.27 for j in range(len(rows))]
        axes.bar(positions, [getattr(r, field) for _, r in rows], 0.27, label=label)
    axes.set_xticks(range(len(rows)), [name for name, _ in rows], fontsize=8)
    axes.set_ylabel(f"epsilon at delta = {FLAGS.delta:g}")
    axes.set_title(f"One-run audit: lower bounds at {FLAGS.confidence:g} confidence vs the claim", fontsize=10)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    print(f"Plot in {path}")


def main() -> None:
    data = datasets.load_digits()
    print(data.description)
    rows = [row for epsilon in FLAGS.epsilons for row in audit(float(epsilon), data)]
    print(HEADER)
    for name, report in rows:
        r = report.result
        print(
            f"{name:<18} {report.claimed_epsilon:>17.2f} {r.epsilon_one_run:>13.2f} {r.epsilon_fdp:>10.2f} "
            f"{r.num_canaries:>5} {r.num_guesses:>7} {r.num_correct:>7} {r.confidence:>10g}"
        )
    if FLAGS.plot:
        plot(rows, FLAGS.plot)


if __name__ == "__main__":
    cli.run(main)

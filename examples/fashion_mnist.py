"""Dynamic DP-SGD on Fashion-MNIST: examples.mnist with ``--dataset=fashion_mnist`` and the paper's C_0 = 4 (Table 1).

Same CNN and settings as MNIST (learning rate 0.15, p = 250 / N, 20 epochs, epsilon 1.2). Data, nothing
downloaded: ``--idx_dir``, tfds under ``--data_dir``, /usr/share/datasets/fashion-mnist (Debian's ``apt-get install
dataset-fashion-mnist``) or ~/.keras/datasets/fashion-mnist.

    python -m examples.fashion_mnist --epsilon=2

The paper's full runs: examples/README.md says where.
"""

import os
import sys

from absl import flags

if __package__ in (None, ""):  # Run as `python examples/fashion_mnist.py`: make the repository's packages importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples import mnist  # noqa: E402  (its flags and trainer)
from keras_dyndp import cli  # noqa: E402

flags.adopt_module_key_flags(mnist)  # --help lists examples.mnist's flags: they are this trainer's.

if __name__ == "__main__":
    flags.FLAGS.set_default("dataset", "fashion_mnist")
    flags.FLAGS.set_default("initial_clip", 4.0)
    cli.run(mnist.main)

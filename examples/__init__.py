"""Example trainers for keras_dyndp: one absl script per task of the paper, over `examples.training`.

Run them as modules from the repository root, e.g. ``python -m examples.digits``.
"""

import os

# TensorFlow's C++ start-up chatter (CUDA probing, cuDNN "factory" errors, oneDNN notices) buries the scripts'
# own messages; Python exceptions still surface. Users can still set TF_CPP_MIN_LOG_LEVEL themselves.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

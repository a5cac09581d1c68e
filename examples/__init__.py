"""Example trainers for keras_dyndp: one absl script per task of the paper, over the public package only.

Run them as modules from the repository root, e.g. ``python -m examples.digits``.

Importing this package quiets TensorFlow's C++ start-up chatter (CUDA probing, "failed call to cuInit" on machines
without a GPU, oneDNN notices, printed twice per process), which buries the scripts' own messages and looks like a
failure: unless the user set TF_CPP_MIN_LOG_LEVEL, it sets it to 3 (errors hidden, fatal ones shown); at any level
above 0 it imports TensorFlow with the INFO lines that TensorFlow prints before it reads that level dropped. With
TF_CPP_MIN_LOG_LEVEL=0 TensorFlow prints everything. Python exceptions still surface. The library itself
(keras_dyndp) leaves TensorFlow's logging alone.
"""

import importlib.util
import os
import re
import sys
import tempfile

# absl INFO lines ("I0000 00:00:...") and the notice absl prints before TensorFlow initialises its logging.
_STARTUP_CHATTER = re.compile(rb"I\d{4} |WARNING: All log messages before absl::InitializeLog\(\) is called")


def _import_tensorflow_quietly() -> None:
    """Imports TensorFlow with stderr (file descriptor 2, where its C++ code writes) captured; replays every line
    but the start-up chatter. Skipped where TensorFlow is not installed, already imported, or not the Keras backend."""
    if (
        "tensorflow" in sys.modules
        or os.environ.get("KERAS_BACKEND", "tensorflow") != "tensorflow"
        or importlib.util.find_spec("tensorflow") is None
    ):
        return
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
            captured.seek(0)
            kept = b"".join(line for line in captured if not _STARTUP_CHATTER.match(line))
            while kept:
                kept = kept[os.write(2, kept) :]


if os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3") in ("1", "2", "3"):
    _import_tensorflow_quietly()

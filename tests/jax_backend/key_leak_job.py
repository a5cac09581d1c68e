"""One process of test_key_leaks: trains a make_private model (secret key, no ``noise_seed``) for a few steps under
the writers a JAX run can have, and writes the optimizer's base key where the test reads it, outside the searched
folder.

Usage: key_leak_job.py MODE OUT_DIR KEY_FILE, with XLA_FLAGS set by the caller (XLA reads them at start-up).
MODE ``files``: JAX's persistent compilation cache in OUT_DIR/cache and IR dumps in OUT_DIR/jax_ir, a profiler
trace around a ``fit`` that compiles the step and another around a ``fit`` whose step was compiled before the trace
started (as Keras's ``TensorBoard(profile_batch=...)`` traces), then every saved format: ``.keras``,
``.weights.h5``, legacy ``.h5``, the optimizer's saved variables and variables at rest, the model's state tree (what
``OrbaxCheckpoint`` saves).
MODE ``stdout``: only ``fit`` (the caller captures what XLA prints).
"""

import json
import os
import pathlib
import sys
import warnings

os.environ["KERAS_BACKEND"] = "jax"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402

MODE, OUT_DIR, KEY_FILE = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
if MODE == "files":  # before the first compilation, when JAX decides whether it has a persistent cache
    jax.config.update("jax_compilation_cache_dir", str(OUT_DIR / "cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax.config.update("jax_dump_ir_to", str(OUT_DIR / "jax_ir"))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_dyndp import schedules  # noqa: E402
from keras_dyndp.jax_backend import DynamicDPKerasSGD  # noqa: E402
from keras_dyndp.jax_backend import make_private  # noqa: E402

warnings.simplefilter("ignore")
model = make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
optimizer = DynamicDPKerasSGD(
    schedule=schedules.DPSchedule(np.ones(8), np.ones(8), 0.5), public_batch_size=True, learning_rate=0.1
)
model.compile(optimizer=optimizer, loss=keras.losses.MeanSquaredError(reduction="none"))
pathlib.Path(KEY_FILE).write_text(json.dumps(np.asarray(optimizer._noise_source.base_key).tolist()))  # pylint: disable=protected-access
x, y = np.linspace(-1, 1, 12, dtype="float32").reshape(4, 3), np.zeros((4, 2), "float32")
if MODE == "stdout":
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    sys.exit()
with jax.profiler.trace(str(OUT_DIR / "trace_compiling")):
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
with jax.profiler.trace(str(OUT_DIR / "trace_compiled")):
    model.fit(x, y, batch_size=2, epochs=1, verbose=0)
assert int(optimizer.dp_step.numpy()) == 4, "both runs trained"
model.save(OUT_DIR / "model.keras")
model.save_weights(OUT_DIR / "model.weights.h5")
model.save(OUT_DIR / "legacy.h5")
store = {}
optimizer.save_own_variables(store)
np.savez(OUT_DIR / "optimizer_saved.npz", **store)
np.savez(OUT_DIR / "optimizer_variables.npz", *[variable.numpy() for variable in optimizer.variables])
tree = model.get_state_tree(value_format="numpy_array")["optimizer_variables"]
np.savez(OUT_DIR / "state_tree.npz", *jax.tree_util.tree_leaves(tree))

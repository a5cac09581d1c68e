"""Several processes (``jax.distributed``): one DP step over the devices of every process, provided that they agree on
the key and seed (`agreed`), the data (`check_same_data`, `check_same_source`; each feeds its share, `local_rows`) and
the optimizer (`check_same_release`), by gathered SHA-256 digests (`disagreements`). How and why: docs/jax.md,
"Accumulation, microbatches, several devices"; the refusals (`check_distribution`, `check_data`): docs/privacy.md,
"Refused, and why"."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import jax
import keras
import numpy as np
from jax.experimental import multihost_utils


def several() -> bool:
    """Whether this program runs in several ``jax.distributed`` processes."""
    return jax.process_count() > 1


def agreed(value: np.ndarray) -> np.ndarray:
    """``value`` of process 0 on every process (a collective: every process calls it); ``value`` in one process."""
    if not several():
        return value
    return np.asarray(multihost_utils.broadcast_one_to_all(value), value.dtype)


def agreed_random_bits(num_bits: int, draw) -> int:
    """``draw(num_bits)`` (OS entropy) of process 0 on every process, as an int."""
    words = agreed(np.asarray([draw(32) for _ in range(-(-num_bits // 32))], np.uint32))
    return sum(int(word) << (32 * index) for index, word in enumerate(words))


def disagreements(parts: dict[str, list]) -> dict[int, list[str]]:
    """The processes whose ``parts`` differ from process 0's, each with the names of its differing parts (a collective:
    every process calls it with the same names; {} in one process), compared by the SHA-256 digests of their buffers."""
    if not several():
        return {}
    digests = []
    for buffers in parts.values():
        digest = hashlib.sha256()
        for buffer in buffers:
            digest.update(buffer)
        digests.append(np.frombuffer(digest.digest(), np.uint32))
    gathered = multihost_utils.process_allgather(np.stack(digests))  # [processes, parts, 8]
    names = list(parts)
    differing = {index: np.flatnonzero(np.any(theirs != gathered[0], axis=-1)) for index, theirs in enumerate(gathered)}
    return {index: [names[i] for i in which] for index, which in differing.items() if which.size}


def check_same_data(arrays: list) -> None:
    """ValueError on every process unless all hold the same ``arrays`` (a collective): each process takes its share
    of one global sample of row indices, which is a Poisson sample of the data only if the rows are the same
    everywhere (a process holding its own shard would feed other examples, at another rate than p)."""
    arrays = [np.ascontiguousarray(array) for array in arrays]
    differing = disagreements({"data": [part for a in arrays for part in (f"{a.dtype}{a.shape}".encode(), a)]})
    if differing:
        raise ValueError(
            f"keras_dyndp.poisson_batches in {jax.process_count()} processes needs the whole dataset, the same, on "
            f"every process (they sample one global batch of its rows and each feeds its share); processes "
            f"{sorted(differing)} hold other data than process 0. Pass every process the same x, y and sample_weight."
        )


# Rows of data read on demand that `check_same_source` compares across processes (besides N and the shapes).
_PROBED_ROWS = 16


def check_same_source(rows: Any) -> None:
    """`check_same_data` for data read on demand (`keras_dyndp.data.sources.Rows`), which no process reads whole: N, the
    first example and ``_PROBED_ROWS`` rows at positions drawn from N (the same on every process) must agree; a
    process given another file or another number of examples is refused, one differing elsewhere is not seen."""
    if not several():
        return
    probes = np.unique(np.random.default_rng(rows.num_examples).integers(rows.num_examples, size=_PROBED_ROWS))
    leaves = jax.tree_util.tree_leaves((rows.example, rows.read(probes)))
    check_same_data([np.asarray([rows.num_examples], np.int64), *leaves])


def check_same_release(description: dict[str, Any]) -> None:
    """ValueError on every process unless all describe the release alike (a collective): ``description`` maps what
    determines it (`keras_dyndp.optimizer_base.DPOptimizerBase._check_same_release`) to values JSON or Keras serialises
    (TypeError on others: what cannot be compared is not taken as equal). Why: docs/privacy.md, "Refused, and why"."""
    if not several():
        return
    dump = lambda value: json.dumps(value, sort_keys=True, default=keras.saving.serialize_keras_object)  # noqa: E731
    differing = disagreements({name: [dump(value).encode()] for name, value in description.items()})
    if differing:
        details = "; ".join(f"process {index}: {', '.join(names)}" for index, names in differing.items())
        raise ValueError(
            f"The DP optimizers of the {jax.process_count()} processes train one model and must be built alike, but "
            f"some differ from process 0's ({details}). Build the optimizer with the same schedule (or budget "
            "arguments), learning rate and other arguments on every process."
        )


def rows_multiple() -> int:
    """What every global batch's rows must be a multiple of: the global devices under several processes (each
    process's share splits evenly over its devices), else 1."""
    return jax.device_count() if several() else 1


def check_rows(name: str, value: int | None) -> None:
    """ValueError if ``value`` (rows of every batch, or their padding multiple) is not a multiple of `rows_multiple`."""
    multiple = rows_multiple()
    if value is not None and value % multiple:
        raise ValueError(
            f"`{name}` must be a multiple of the {multiple} devices of the {jax.process_count()} processes (each "
            f"process feeds an equal share of every global batch). Received: {name}={value}; use "
            f"{-(-value // multiple) * multiple}."
        )


def share(num_rows: int) -> range:
    """The positions of this process's share of a global batch of ``num_rows`` rows (all of them in one process):
    an equal, contiguous part, in process order (``jax.make_array_from_process_local_data``)."""
    size = num_rows // jax.process_count()
    return range(jax.process_index() * size, (jax.process_index() + 1) * size)


def local_rows(value: Any) -> Any:
    """This process's share of a global batch's rows (all of them in one process)."""
    if not several():
        return value
    rows = share(len(value))
    return value[rows.start : rows.stop]


def check_distribution() -> None:
    """ValueError under several processes unless ``keras.distribution`` is ``DataParallel`` over every device."""
    if not several():
        return
    distribution = keras.distribution.distribution()
    devices = None if distribution is None else set(np.asarray(distribution.device_mesh.devices).ravel().tolist())
    if not isinstance(distribution, keras.distribution.DataParallel) or devices != set(jax.devices()):
        raise ValueError(
            f"make_private on JAX in {jax.process_count()} processes trains one model: set "
            "keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices(), "
            f"auto_shard_dataset=False)) on every process. Received: {distribution!r}. Without a distribution each "
            "process trains its own model with the same noise (two released models would cancel it); "
            "ModelParallel and meshes over some devices are not supported across processes."
        )


def check_data(x: Any, caller: str, poisson_batches_class: type) -> None:
    """ValueError under several processes unless ``caller`` is ``model.fit`` and ``x`` is `keras_dyndp.poisson_batches`
    (whose processes sample one global batch and feed their shares)."""
    if not several() or (caller == "model.fit" and isinstance(x, poisson_batches_class)):
        return
    raise ValueError(
        f"{caller} in {jax.process_count()} processes takes only keras_dyndp.poisson_batches(...) given to "
        "model.fit (the same arguments on every process): its processes sample one global batch and each feeds its "
        f"share. Received: {type(x).__name__}. A batch handed to every process would count each example "
        f"{jax.process_count()} times against noise for one; shares made elsewhere cannot be checked."
    )

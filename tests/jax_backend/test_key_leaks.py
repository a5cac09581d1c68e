"""The JAX DP step's secret noise key is in no compiled artifact, trace, dump or saved file.

Before, the key was a constant of the compiled step: a profiler trace held it (also of a step compiled before the
trace started), XLA printed it to stdout under ``--xla_dump_hlo_as_text``, and dumps and cache entries held it
wherever the refusal of those settings was bypassed. Now it is a runtime input of the step: these tests train under
every such writer at once and search everything written for the key.
"""

import gzip
import json
import os
import pathlib
import re
import struct
import subprocess
import sys
import zipfile

import pytest

pytest.importorskip("jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip("Keras is not running on JAX (set KERAS_BACKEND=jax)", allow_module_level=True)

from jax._src import compilation_cache  # noqa: E402  (the cache's own reader of its entries)

JOB = pathlib.Path(__file__).with_name("key_leak_job.py")
THREEFRY_PARITY = 0x1BD11BDA  # threefry2x32 derives a third key word, k0 ^ k1 ^ this, which a compiled step holds


def _varint(value: int) -> bytes:
    """``value`` (>= 0) as a protobuf varint."""
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value >= 0x80 else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _patterns(words: list[int]) -> dict[tuple[int, str], re.Pattern]:
    """Regular expressions over bytes, by word and the form they find, for each uint32 word: raw little- and
    big-endian, protobuf varint (of the word and of its sign-extended int32), hex and decimal (unsigned and signed)
    as whole numbers."""
    patterns = {}
    for word in words:
        signed = word - 2**32 if word >= 2**31 else word
        forms = {
            "raw little-endian": re.escape(struct.pack("<I", word)),
            "raw big-endian": re.escape(struct.pack(">I", word)),
            "varint": re.escape(_varint(word)) + b"|" + re.escape(_varint(signed % 2**64)),
            "hex": rb"(?<![0-9a-fA-F])(?:%x|%X|%08x|%08X)(?![0-9a-fA-F])" % (word, word, word, word),
            "decimal": rb"(?<![0-9])(?:%d|%d)(?![0-9])" % (word, signed),
        }
        for form, pattern in forms.items():
            patterns[word, form] = re.compile(pattern, re.DOTALL)
    return patterns


def _key_words(key_file: pathlib.Path) -> list[int]:
    k0, k1 = json.loads(key_file.read_text())
    return [k0, k1, k0 ^ k1 ^ THREEFRY_PARITY]


def _leaks(patterns: dict[tuple[int, str], re.Pattern], name: str, content: bytes) -> list[str]:
    """The key's forms found in ``content``. Raw words are searched in binary content (not UTF-8 text, where a
    program's words are printed) and count when two of the key's words are found: one 4-byte word alone matches
    random bytes once in 2^32 positions (the ~11 MB of binary content written here would flag a key that is not
    there in about 1 run of 70). Before, each cache entry held two words raw; the dumps' object files held one each,
    and the dumps' text every word in decimal."""
    try:
        content.decode("utf-8")
        binary = False
    except UnicodeDecodeError:
        binary = True
    found = [
        (word, form)
        for (word, form), pattern in patterns.items()
        if (binary or not form.startswith("raw")) and pattern.search(content)
    ]
    raw_words = {word for word, form in found if form.startswith("raw")}
    return [f"{name}: {word} as {form}" for word, form in found if len(raw_words) > 1 or not form.startswith("raw")]


def _contents(path: pathlib.Path) -> bytes:
    """The bytes of ``path`` as its reader sees them: persistent-cache entries and ``.gz`` decompressed, zip archives
    (``.keras``, ``.npz``) member by member."""
    data = path.read_bytes()
    if path.parent.name == "cache":
        return compilation_cache.decompress_executable(data)
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return b"".join(archive.read(member) for member in archive.namelist())
    return data


def _run_job(mode: str, out_dir: pathlib.Path, key_file: pathlib.Path, xla_flags: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "XLA_FLAGS": xla_flags,
        "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parents[2]), *sys.path]),
    }
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    run = subprocess.run(
        [sys.executable, "-W", "ignore", str(JOB), mode, str(out_dir), str(key_file)],
        capture_output=True,
        env=env,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-3000:]
    return run


def test_no_trace_dump_cache_entry_or_saved_file_holds_the_key(tmp_path):
    """Profiler traces (a step compiled inside and one compiled before the trace), XLA's dumps to files, JAX's IR
    dumps and persistent cache, ``.keras``, ``.weights.h5``, legacy ``.h5``, the optimizer's saved variables, its
    variables at rest and the model's state tree: no file holds a key word in any form (`_leaks`)."""
    out_dir, key_file = tmp_path / "out", tmp_path / "key.json"
    out_dir.mkdir()
    _run_job("files", out_dir, key_file, f"--xla_dump_to={out_dir / 'xla'} --xla_dump_hlo_as_text")
    files = [path for path in sorted(out_dir.rglob("*")) if path.is_file()]
    written = {path.relative_to(out_dir).parts[0] for path in files}
    expected = {
        "cache",
        "jax_ir",
        "xla",
        "trace_compiling",
        "trace_compiled",
        "model.keras",
        "model.weights.h5",
        "legacy.h5",
    }
    assert expected <= written, f"the run wrote no {sorted(expected - written)}: nothing to search there"
    assert any(path.name.endswith(".xplane.pb") for path in (out_dir / "trace_compiled").rglob("*"))
    patterns = _patterns(_key_words(key_file))
    leaks = [leak for path in files for leak in _leaks(patterns, str(path.relative_to(out_dir)), _contents(path))]
    assert not leaks, f"{len(leaks)} key forms found in {len(files)} files:\n" + "\n".join(leaks[:40])


def test_xla_dumps_to_stdout_do_not_print_the_key(tmp_path):
    """``--xla_dump_hlo_as_text`` without ``--xla_dump_to``: XLA prints every module to stdout, the DP step's too."""
    key_file = tmp_path / "key.json"
    run = _run_job("stdout", tmp_path, key_file, "--xla_dump_hlo_as_text")
    assert b"HloModule" in run.stdout and b"ENTRY" in run.stdout, "XLA printed no module: nothing to search"
    leaks = _leaks(_patterns(_key_words(key_file)), "stdout", run.stdout + run.stderr)
    assert not leaks, "\n".join(leaks)

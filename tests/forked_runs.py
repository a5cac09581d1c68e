"""Runs many ``python -m <module> <arguments>`` (or ``python <script.py> <arguments>``) command lines in one process,
each in a child forked after the start-up they all share, so that a test module pays TensorFlow's import once rather
than once per command line.

Usage (from the repository root): ``python tests/forked_runs.py <start-up module> '<JSON list of [module or
script path, [arguments]]>'``; prints a JSON list of ``{"returncode", "stdout", "stderr"}``, one per command line, in
order. With ``--serve`` in place of the JSON list it reads one JSON ``[module or script path, [arguments]]`` a line
from stdin and answers each with one JSON line, until stdin closes (`Server`: for tests that write their data first).
The start-up is the module (or comma-separated modules) every command line imports first: ``examples`` for the
trainers (it quiets TensorFlow's C++ start-up lines and imports TensorFlow) and the library modules they all import
(`trainers_start_up`), ``tensorflow`` for a script.

What a fresh process would show is kept: the start-up import runs with file descriptor 2 captured, and what it
printed there starts every child's stderr; each child has its own file descriptors 1 and 2 (C++ output included),
runs the module or script as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` as Python sets them, and exits as
Python would (the ``SystemExit`` code, or a printed traceback and status 1), through the interpreter's shutdown; a
crash kills the child only (a negative return code, as ``subprocess`` reports it).
"""

import fcntl
import gc
import importlib
import importlib.util
import json
import os
import random
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings


def trainers_start_up() -> str:
    """The start-up of the trainers in examples/ and research/: ``examples`` first (as each trainer imports it), then
    the library modules every trainer imports on this stack's backend, which define no flag and print nothing; a
    child then pays only its own trainer's imports (about 0.2 s instead of 1 s on the comparison stack)."""
    tensorflow = importlib.util.find_spec("tensorflow") is not None
    backend = "tf" if tensorflow and os.environ.get("KERAS_BACKEND", "tensorflow") in ("tensorflow", "") else "jax"
    return f"examples,keras_dyndp.cli,keras_dyndp.datasets,keras_dyndp.schedules,keras_dyndp.{backend}_backend"


def _start_up(modules: str) -> bytes:
    """Imports the comma-separated ``modules`` with file descriptor 2 captured; returns what they wrote there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            for module in modules.split(","):
                importlib.import_module(module)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        return captured.read()


def _exit_status(error: SystemExit) -> int:
    """The status Python exits with on an uncaught ``SystemExit`` (printing a non-integer code to stderr)."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def _child(module: str, arguments: list[str], stdout_fd: int, stderr_fd: int) -> None:
    """Runs ``module`` (or a script: a path ending in .py) as ``__main__`` with its output on the given descriptors;
    never returns: the child exits through the interpreter's own shutdown (atexit handlers, flushing), as the fresh
    process would."""
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    random.seed()  # A fresh process's own entropy, not the start-up's state that every child would share.
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = [module, *arguments]  # runpy puts the module's file in sys.argv[0], as -m does.
    status = 0
    try:
        if module.endswith(".py"):
            sys.path[0] = os.path.dirname(os.path.abspath(module))  # As `python script.py` sets it.
            runpy.run_path(module, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as error:
        status = _exit_status(error)
    except BaseException:  # pylint: disable=broad-exception-caught
        traceback.print_exc()
        status = 1
    sys.exit(status)


def _run(module: str, arguments: list[str], start_up_stderr: bytes) -> dict:
    """One command line in a forked child: its exit status and output."""
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        stderr.write(start_up_stderr)
        stderr.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(module, arguments, stdout.fileno(), stderr.fileno())
        _, wait_status = os.waitpid(pid, 0)
        stdout.seek(0)
        stderr.seek(0)
        return {
            "returncode": os.waitstatus_to_exitcode(wait_status),
            "stdout": stdout.read().decode(errors="replace"),
            "stderr": stderr.read().decode(errors="replace"),
        }


def run_once(tmp_path_factory, worker_id: str, name: str, start_up: str, command_lines: list, **kwargs) -> list:
    """For a pytest fixture: runs ``command_lines`` by this script once per test session, whichever pytest-xdist
    worker asks first (the others wait on a lock and read its results), so that a module split across workers pays
    once. ``kwargs`` go to ``subprocess.run`` (cwd, env, timeout). Returns a ``CompletedProcess`` per command line."""
    if worker_id == "master":  # no workers: this process is the session
        return _run_here(start_up, command_lines, **kwargs)
    shared = tmp_path_factory.getbasetemp().parent  # this session's, shared by its workers
    with open(shared / f"{name}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = shared / f"{name}.json"
        if not cached.exists():
            completed = _run_here(start_up, command_lines, **kwargs)
            cached.write_text(json.dumps([vars(process) for process in completed]), encoding="utf-8")
        return [subprocess.CompletedProcess(**process) for process in json.loads(cached.read_text(encoding="utf-8"))]


def _run_here(start_up: str, command_lines: list, **kwargs) -> list:
    result = subprocess.run(
        [sys.executable, __file__, start_up, json.dumps(command_lines)],
        capture_output=True,
        text=True,
        check=False,
        **kwargs,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [
        subprocess.CompletedProcess([module, *arguments], **outcome)
        for (module, arguments), outcome in zip(command_lines, json.loads(result.stdout), strict=True)
    ]


class Server:
    """This script in ``--serve`` mode, started on the first `run` (the start-up is paid once per pytest process);
    ``kwargs`` go to ``subprocess.Popen`` (cwd, env). `close` it at the end of the session."""

    def __init__(self, start_up: str, **kwargs):
        self._arguments, self._kwargs, self._process = [sys.executable, __file__, start_up, "--serve"], kwargs, None

    def run(self, module: str, arguments: list[str], timeout: float) -> subprocess.CompletedProcess:
        """``python -m module arguments`` (or a script) in a forked child; past ``timeout`` seconds the server and
        the child are killed (the next `run` starts a new server) and this raises ``TimeoutError``."""
        if self._process is None:
            self._process = subprocess.Popen(
                self._arguments,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own process group: a timeout kills the child with it
                **self._kwargs,
            )
        self._process.stdin.write(json.dumps([module, arguments]) + "\n")
        self._process.stdin.flush()
        ready, _, _ = select.select([self._process.stdout], [], [], timeout)
        line = self._process.stdout.readline() if ready else ""
        if not line:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait()
            self._process = None
            raise TimeoutError(f"{module} {arguments}: no result within {timeout} s (or the server died)")
        return subprocess.CompletedProcess([module, *arguments], **json.loads(line))

    def close(self) -> None:
        if self._process is not None:
            self._process.stdin.close()
            self._process.wait(timeout=60)
            self._process = None


def _serve(start_up_stderr: bytes) -> None:
    """Answers each command line read from stdin with one JSON line on stdout; the children read /dev/null, as
    stdin is this server's."""
    requests = os.fdopen(os.dup(0), encoding="utf-8")
    with open(os.devnull, "rb") as null:
        os.dup2(null.fileno(), 0)
    for request in requests:
        module, arguments = json.loads(request)
        sys.stdout.write(json.dumps(_run(module, arguments, start_up_stderr)) + "\n")
        sys.stdout.flush()


def main() -> None:
    sys.path[0] = os.getcwd()  # As `python -m` sets it: the repository root.
    warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12's note on forking a threaded process.
    start_up_stderr = _start_up(sys.argv[1])
    # As Python's gc documentation advises for a fork without exec: the start-up's objects (TensorFlow's, millions)
    # move to a generation no collection scans, so that a child's collections, its own shutdown's included, skip
    # them; scanning them wrote to every page the child shares with this process (a copy-on-write page each), which
    # took seconds per child. What the child itself creates is still collected, and its shutdown still runs.
    gc.freeze()
    if sys.argv[2] == "--serve":
        _serve(start_up_stderr)
        return
    command_lines = json.loads(sys.argv[2])
    results = [_run(module, arguments, start_up_stderr) for module, arguments in command_lines]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()

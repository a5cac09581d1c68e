"""Runs many ``python -m <module> <arguments>`` command lines in one process, each in a child forked after the
start-up they all share, so that a test module pays TensorFlow's import once rather than once per command line.

Usage (from the repository root): ``python tests/examples/forked_runs.py '<JSON list of [module, [arguments]]>'``;
prints a JSON list of ``{"returncode", "stdout", "stderr"}``, one per command line, in order.

What a fresh ``python -m`` process would show is kept: the start-up (``import examples``, which every trainer runs
first: it quiets TensorFlow's C++ start-up lines and imports TensorFlow) runs with file descriptor 2 captured, and
what it printed there starts every child's stderr; each child has its own file descriptors 1 and 2 (C++ output
included), runs the module as ``__main__`` with ``sys.argv`` as ``-m`` sets it, and exits as Python would (the
``SystemExit`` code, or a printed traceback and status 1).
"""

import json
import os
import runpy
import sys
import tempfile
import traceback
import warnings


def _start_up() -> bytes:
    """``import examples`` with file descriptor 2 captured; returns what it wrote there."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import examples  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
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
    """Runs ``module`` as ``__main__`` with its output on the given descriptors; never returns: the child exits
    through the interpreter's own shutdown (atexit handlers, flushing), as the fresh process would."""
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    sys.argv = [module, *arguments]  # runpy puts the module's file in sys.argv[0], as -m does.
    status = 0
    try:
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


def main() -> None:
    sys.path[0] = os.getcwd()  # As `python -m` sets it: the repository root.
    warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12's note on forking a threaded process.
    command_lines = json.loads(sys.argv[1])
    start_up_stderr = _start_up()
    results = [_run(module, arguments, start_up_stderr) for module, arguments in command_lines]
    sys.stdout.write(json.dumps(results))


if __name__ == "__main__":
    main()

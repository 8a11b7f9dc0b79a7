"""The `dprun` command's entry point: signal handlers at once, allocator and thread options
next, then the CLI.

The handlers are installed as this module is imported, before anything else of dprun's: the
only window left in which SIGINT or SIGTERM ends the process by Python's defaults (a
KeyboardInterrupt traceback, or death by the signal) is the interpreter's own start-up
before it imports this module (docs/ci.md, "Signals").
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from types import FrameType
from typing import NoReturn, TextIO

STARTING = "interrupted while starting; nothing was published"


def _stop_while_starting(signum: int, frame: FrameType | None) -> None:
    """SIGINT/SIGTERM before the CLI installs its handlers (while Polars and numpy import, ~0.5 s)
    end the process with exit 130 and one message, as JSON under --format json: nothing has
    been read or written yet."""
    # Python runs a handler again for a signal that comes while it runs, between any two of
    # its steps, but not once the signal is ignored; a run nested before that writes the one
    # message and ends the process itself. The message goes to the descriptor, not through
    # the stream: a buffered stream raises when entered twice (a burst of signals, or a
    # signal that lands while the process writes).
    for signum_to_ignore in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum_to_ignore, signal.SIG_IGN)
    arguments = sys.argv[1:]
    if "--format=json" in arguments or any(a == "json" and arguments[i - 1] == "--format"
                                           for i, a in enumerate(arguments) if i > 0):
        problem = {"file": "", "line": None, "column": None, "field": "", "message": STARTING}
        _write(sys.stdout, '{"ok": false, "exit_code": 130, "problems": [' + _json_object(problem) + "]}\n")
    else:
        _write(sys.stderr, f"error: {STARTING}\n")
    os._exit(130)


def _write(stream: TextIO, text: str) -> None:
    """Write `text` to the descriptor under `stream`, whole; nothing if there is none."""
    try:
        data = text.encode()
        descriptor = stream.fileno()
        while data:
            data = data[os.write(descriptor, data):]
    except (OSError, ValueError, AttributeError):  # no descriptor (closed, or not a file)
        return


def _json_object(fields: dict[str, str | None]) -> str:
    """A flat JSON object of short ASCII texts, without importing json in a signal handler."""
    def value(text: str | None) -> str:
        return "null" if text is None else '"' + text + '"'
    return "{" + ", ".join(f'"{key}": {value(text)}' for key, text in fields.items()) + "}"


for _signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(_signum, _stop_while_starting)

from dprun import card_helper  # noqa: E402 - after the handlers
from dprun.malloc_tuning import keep_freed_memory, keep_polars_freed_memory  # noqa: E402 - after the handlers


def keep_native_stderr_private() -> None:
    """Send what native code writes to file descriptor 2 to /dev/null; Python's `sys.stderr` keeps
    the real stream.

    A Rust panic in Polars prints its message there before Python sees the exception, and
    the message can quote data values; so can the JVM that the Spark engine starts (it
    inherits descriptor 2). dprun's own messages go through `sys.stderr`. With DPRUN_DEBUG
    set, nothing is redirected.
    """
    if os.environ.get("DPRUN_DEBUG"):
        return
    try:
        real = os.dup(2)
    except OSError:  # no stderr at all: nothing to keep private
        return
    # The stream is made before descriptor 2 moves, so a failure here still shows.
    stream = open(real, "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")  # noqa: SIM115
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = stream


def prepare_process() -> None:
    """Options that only take effect before Polars and numpy are imported."""
    keep_freed_memory()
    keep_polars_freed_memory()
    # numpy's OpenBLAS starts a thread per core that spins while it waits for work, taking
    # CPU time from Polars' threads (~2% of a 10^8-row run); dprun does no linear algebra.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _command() -> str | None:
    """The subcommand: the first argument that is not an option (the group's are flags)."""
    return next((argument for argument in sys.argv[1:] if not argument.startswith("-")), None)


def main() -> NoReturn:
    keep_native_stderr_private()
    prepare_process()
    if _command() == "run":
        # First, so that it has warmed up by the time the run has tables to draw.
        card_helper.start_for_this_run()
    # Imported only now: importing Polars and numpy starts threads, and a thread that has
    # allocated keeps the malloc arena it got (`keep_freed_memory`); Polars' allocator reads
    # its options when Polars is imported (`keep_polars_freed_memory`).
    from dprun.cli import main as cli_main
    from dprun.errors import ExitCode

    try:
        cli_main()
    except SystemExit as done:
        card_helper.stop()
        if done.code != ExitCode.INTERRUPTED:
            # Outputs are closed and the exit code decided: the interpreter's last collections
            # would walk every object of the run (0.07 s after `validate`, 0.12 s after a small
            # release) only to free memory the process is about to give back.
            gc.freeze()
            raise
        # An interrupted Polars query's native threads may still be running, and Python's
        # finalisation under them can abort the process (exit -6) after the message was
        # written. Scratch files are gone and nothing was published: leave without finalising.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.INTERRUPTED)

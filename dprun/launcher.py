"""The `dprun` command's entry point: allocator and thread options first, then the CLI."""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import NoReturn

from dprun.malloc_tuning import keep_freed_memory, keep_polars_freed_memory


def _exit_on_signals_while_starting() -> None:
    """SIGINT/SIGTERM before the CLI installs its handlers (while Polars and numpy import, ~0.5 s)
    end the process with exit 130 and one line: nothing has been read or written yet."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop_while_starting)


def _stop_while_starting(signum: int, frame: FrameType | None) -> None:
    os.write(2, b"error: interrupted while starting; nothing was published\n")
    os._exit(130)


def prepare_process() -> None:
    """Options that only take effect before Polars and numpy are imported."""
    keep_freed_memory()
    keep_polars_freed_memory()
    # numpy's OpenBLAS starts a thread per core that spins while it waits for work, taking
    # CPU time from Polars' threads (~2% of a 10^8-row run); dprun does no linear algebra.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main() -> NoReturn:
    _exit_on_signals_while_starting()
    prepare_process()
    # Imported only now: importing Polars and numpy starts threads, and a thread that has
    # allocated keeps the malloc arena it got (`keep_freed_memory`); Polars' allocator reads
    # its options when Polars is imported (`keep_polars_freed_memory`).
    from dprun.cli import main as cli_main

    cli_main()

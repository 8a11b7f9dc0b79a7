"""The `dprun` command's entry point: malloc options first, then the CLI."""

from __future__ import annotations

from typing import NoReturn

from dprun.malloc_tuning import keep_freed_memory


def main() -> NoReturn:
    keep_freed_memory()
    # Imported only now: importing Polars and numpy starts threads, and a thread that has
    # allocated keeps the malloc arena it got (`keep_freed_memory`).
    from dprun.cli import main as cli_main

    cli_main()

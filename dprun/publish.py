"""All-or-nothing publication of a release's files.

Every file is first written to a hidden temporary file beside its target; only
when all of them are written are they renamed into place (a rename within one
directory is atomic on POSIX). Any failure, SIGINT or SIGTERM before that point
removes the temporary files and leaves existing outputs untouched; a failed rename
while moving files into place puts the previous files back. (A crash of the machine
in the middle of the renames can still leave some files new and some old.)
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl

from dprun.errors import OutputError

Writer = Callable[[Path], None]


class Staging:
    """Files written under temporary names, moved into place together by `commit`."""

    def __init__(self) -> None:
        self._pending: list[tuple[Path, Path]] = []

    def write(self, target: Path, writer: Writer) -> None:
        temporary = target.with_name(f".{target.name}.dprun-{secrets.token_hex(6)}.tmp")
        self._pending.append((temporary, target))
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            writer(temporary)
        except (OSError, pl.exceptions.PolarsError) as exc:
            # Polars reports a full disk as a ComputeError or a bare OSError: say what it likely is.
            reason = getattr(exc, "strerror", None) or _first_line(exc)
            raise OutputError(f"cannot write {target}: {reason}") from None

    def commit(self) -> None:
        """Move every file into place; if one move fails, put back what was moved and the old files."""
        moved: list[tuple[Path, Path | None]] = []
        try:
            for temporary, target in self._pending:
                backup = None
                if target.exists():
                    backup = target.with_name(f".{target.name}.dprun-{secrets.token_hex(6)}.old")
                    os.replace(target, backup)
                moved.append((target, backup))
                os.replace(temporary, target)
        except OSError as exc:
            self._roll_back(moved)
            raise OutputError(f"cannot move outputs into place: {exc.strerror or type(exc).__name__}; "
                              "the previous files were restored") from None
        for _, backup in moved:
            if backup is not None:
                backup.unlink(missing_ok=True)
        self._pending.clear()

    @staticmethod
    def _roll_back(moved: list[tuple[Path, Path | None]]) -> None:
        for target, backup in reversed(moved):
            if backup is not None:
                os.replace(backup, target)
            else:
                target.unlink(missing_ok=True)

    def discard(self) -> None:
        for temporary, _ in self._pending:
            try:
                temporary.unlink(missing_ok=True)
            except OSError:
                # Its folder may not exist or be a file: then the temporary was never written.
                pass
        self._pending.clear()


def _first_line(exc: Exception) -> str:
    # Write errors name the target and the OS error, never data values.
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def staged() -> Iterator[Staging]:
    """A staging area that is discarded unless the block commits it."""
    staging = Staging()
    try:
        yield staging
    finally:
        staging.discard()


def refuse_existing(targets: list[tuple[Path, bool]]) -> None:
    """Fail before any work if a target exists and may not be overwritten, or is not a regular file.

    Publication replaces a target by renaming a regular file onto it: a folder, a device
    or a FIFO at a target is refused whatever `--overwrite` says.
    """
    for path, _ in targets:
        kind = _not_a_regular_file(path)
        if kind is not None:
            raise OutputError(f"cannot publish to {path}: it is {kind}, not a regular file")
    existing = [str(path) for path, overwrite in targets if path.exists() and not overwrite]
    if existing:
        raise OutputError(
            "output exists already (use --overwrite or `output.overwrite: true`): " + ", ".join(existing)
        )
    for path, _ in targets:
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not os.access(parent, os.W_OK):
            raise OutputError(f"cannot write {path}: folder {parent} is not writable")


def _not_a_regular_file(path: Path) -> str | None:
    """What stands at `path` if it is neither absent nor a regular file (targets are resolved paths)."""
    if not path.exists() or path.is_file():
        return None
    return "a folder" if path.is_dir() else "a special file (device, FIFO or socket)"

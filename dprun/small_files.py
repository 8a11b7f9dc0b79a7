"""Reading the small files a user names (a spec, a report to verify, a ledger export) safely.

Such a path can name anything: a FIFO that never ends (a read hangs), a device that never
ends (`/dev/zero`: memory grows without bound), a file of hundreds of megabytes, a symbolic
link loop, a name too long for the operating system. Every command reads these files through
`read_small_file`, which refuses what is not a regular file and what is larger than the
command needs, before reading a byte; JSON from them goes through `loads_json`, which turns
nesting deeper than the parser's recursion into an ordinary parse error.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

# Linux's limits (NAME_MAX, PATH_MAX): a longer path fails in the OS, not in dprun.
NAME_MAX_BYTES = 255
PATH_MAX_BYTES = 4095


class UnreadableFile(ValueError):
    """A file a command cannot read as asked; the message says why, without its content."""


def path_problem(text: str) -> str | None:
    """Why the operating system could not take `text` as a path, or None."""
    if "\x00" in text:
        return "a path cannot contain a NUL character"
    encoded = text.encode("utf-8", errors="surrogateescape")
    if len(encoded) > PATH_MAX_BYTES:
        return f"the path is longer than {PATH_MAX_BYTES} bytes"
    if any(len(part) > NAME_MAX_BYTES for part in encoded.split(b"/")):
        return f"a name in the path is longer than {NAME_MAX_BYTES} bytes"
    return None


def read_small_file(path: Path, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; UnreadableFile for anything else."""
    problem = path_problem(str(path))
    if problem is not None:
        raise UnreadableFile(problem)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UnreadableFile("not found") from None
    except OSError as exc:  # a symbolic link loop, a component that is not a folder, no permission
        raise UnreadableFile(exc.strerror or type(exc).__name__) from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a special file (device, FIFO or socket)"
        raise UnreadableFile(f"it is {kind}, not a regular file")
    if info.st_size > limit:
        raise UnreadableFile(f"it is larger than the {limit:,} bytes expected")
    try:
        # O_NONBLOCK: a FIFO put in the file's place since the check opens without waiting for a writer.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UnreadableFile(exc.strerror or type(exc).__name__) from None
    with os.fdopen(descriptor, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise UnreadableFile(f"it is larger than the {limit:,} bytes expected")
    return data


def loads_json(text: str | bytes) -> Any:
    """`json.loads`, with nesting too deep for the parser a ValueError like any other bad JSON."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None

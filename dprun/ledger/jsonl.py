"""Ledgers as JSON lines: the format of `dprun ledger export`, and of the file ledgers
dprun wrote before its ledger became a database (`dprun ledger import` reads both).

An entry without a `state` is published (file ledgers recorded published releases only);
spends stay the exact decimal strings they were written as.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dprun.ledger.entries import PUBLISHED, LedgerError, entry_problem
from dprun.small_files import UnreadableFile, loads_json, read_small_file

# A ledger export: a kilobyte or so per release.
MAX_JSONL_BYTES = 1 << 30


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every entry of a JSON-lines ledger, checked and numbered; a bad line is named."""
    try:
        raw = read_small_file(path, MAX_JSONL_BYTES)
    except UnreadableFile as exc:
        raise LedgerError(f"cannot read {path!s:.300}: {exc}") from None
    entries = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            entry = loads_json(line)
        except (ValueError, UnicodeDecodeError):
            raise _bad_line(path, number, "is not valid JSON") from None
        problem = entry_problem(entry)
        if problem is None and not isinstance(entry.get("release", 1), int):
            problem = "has no valid `release` number"
        if problem:
            raise _bad_line(path, number, problem)
        entries.append(entry)
    numbered_entries = numbered(entries)
    for key in ("release", "release_id"):
        values = [entry.get(key) for entry in numbered_entries if entry.get(key) is not None]
        if len(values) != len(set(values)):
            raise LedgerError(f"{path} names a `{key}` twice; dprun will not guess which entry is right")
    return numbered_entries


def numbered(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Entries with their release numbers (their own where they have one, else their position)
    and their states (a file ledger's entries were all published)."""
    return [{**entry, "release": entry.get("release", position), "state": entry.get("state", PUBLISHED)}
            for position, entry in enumerate(entries, start=1)]


def lines(entries: list[dict[str, Any]]) -> str:
    """The entries as JSON lines, each with its state and number, exact as stored."""
    return "".join(json.dumps(entry, ensure_ascii=False) + "\n" for entry in entries)


def _bad_line(path: Path, line: int, problem: str) -> LedgerError:
    return LedgerError(f"{path} line {line} {problem}; nothing was imported")

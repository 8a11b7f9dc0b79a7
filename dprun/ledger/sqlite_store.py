"""The default ledger store: one SQLite database file (Python's `sqlite3`), no server.

A write transaction starts with `BEGIN IMMEDIATE`, which takes the database's write lock
before the first read: check-then-spend is atomic across processes on this machine, and
a run that finds the lock taken waits (up to BUSY_TIMEOUT_SECONDS) rather than failing.
SQLite's rollback journal makes each transaction all-or-nothing, even across a crash.
Its locks rely on the file system's: on a network file system, or across CI runners, use
PostgreSQL (docs/ledger.md).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from dprun.ledger.entries import LedgerError
from dprun.ledger.store import SCHEMA, SCHEMA_VERSION, Cursor, SqlLedger
from dprun.small_files import path_problem

BUSY_TIMEOUT_SECONDS = 120.0
SQLITE_HEADER = b"SQLite format 3\x00"


class SqliteLedger(SqlLedger):
    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.path = path

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Cursor | None]:
        exists = self._check_location()
        if write:
            self._check_writable()
        elif not exists:
            yield None
            return
        self._check_format()
        try:
            # Autocommit mode: the transactions are the explicit BEGIN … COMMIT below.
            connection = sqlite3.connect(self._uri(write), uri=True, timeout=BUSY_TIMEOUT_SECONDS,
                                         isolation_level=None)
        except sqlite3.Error as exc:
            raise self._failure(exc) from None
        try:
            connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            cursor = connection.cursor()
            present = _has_tables(cursor)
            if not present and _any_table(cursor):
                raise LedgerError(f"{self.path} is an SQLite database of something else (it has tables, none of them "
                                  "dprun's): give the path of a new file, or of a dprun ledger")
            if write:
                _make_schema(cursor)
                present = True
            if present:
                self._check_version(cursor)
            yield cursor if present else None
            connection.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._failure(exc) from None
        finally:
            if connection.in_transaction:
                connection.rollback()
            connection.close()

    def _uri(self, write: bool) -> str:
        """A read never creates the file; it opens it writable where it can, so that SQLite can roll
        back a transaction a crashed run left in the journal."""
        mode = "rwc" if write else "rw" if os.access(self.path, os.W_OK) else "ro"
        return f"file:{quote(str(self.path))}?mode={mode}"

    def _check_location(self) -> bool:
        """Whether the ledger file exists, after refusing what cannot be one: a path the operating
        system cannot take, a symbolic link loop, a folder, a device or a FIFO (SQLite would hang on
        a FIFO, and write its journal beside /dev/null)."""
        problem = path_problem(str(self.path))
        if problem is not None:
            raise LedgerError(f"the ledger path {self.path!s:.200}: {problem}")
        try:
            info = self.path.stat()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise LedgerError(f"the ledger path {self.path}: {exc.strerror or type(exc).__name__}") from None
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a special file (device, FIFO or socket)"
            raise LedgerError(f"the ledger path {self.path} is {kind}: give the path of a regular file (e.g. "
                              "ledger.db)")
        return True

    def _check_writable(self) -> None:
        folder = self.path.parent
        if not folder.is_dir():
            raise LedgerError(f"the ledger's folder {folder} does not exist; create it (dprun never creates it, "
                              "so a mistyped ledger path cannot start a fresh, empty ledger)")
        if not os.access(folder, os.W_OK) or (self.path.exists() and not os.access(self.path, os.W_OK)):
            raise LedgerError(f"the ledger {self.path} is not writable (SQLite also writes a journal beside it, "
                              "so its folder must be writable too)")

    def _check_format(self) -> None:
        """A file that is not an SQLite database is refused before SQLite sees it; an old JSON-lines ledger is named."""
        try:
            with self.path.open("rb") as handle:
                head = handle.read(len(SQLITE_HEADER))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc.strerror or type(exc).__name__}") from None
        if not head or head == SQLITE_HEADER:
            return
        if head.lstrip().startswith(b"{"):
            raise LedgerError(
                f"the ledger {self.path} is a JSON-lines ledger, which this dprun no longer writes: move it into "
                f"a database with `dprun ledger import {self.path} NEW.db`, then point the spec's `ledger:` (or "
                "--ledger, or DPRUN_LEDGER) at NEW.db. Nothing was read or spent")
        raise LedgerError(f"the ledger {self.path} is not an SQLite database (corrupt?). dprun will not guess "
                          "what was spent; restore it from a backup, then run again")

    def _check_version(self, cursor: Cursor) -> None:
        cursor.execute("SELECT MAX(schema_version) FROM dprun_ledger")
        version = cursor.fetchone()[0]
        if version is not None and int(version) > SCHEMA_VERSION:
            raise LedgerError(f"the ledger {self.path} was written by a newer dprun (schema {version}); "
                              "upgrade dprun")

    def _failure(self, exc: sqlite3.Error) -> LedgerError:
        """SQLite's own words are about the file, never about data values, so they are shown."""
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            return LedgerError(f"the ledger {self.path} stayed locked by another run for "
                               f"{BUSY_TIMEOUT_SECONDS:.0f} s; nothing was spent")
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            return LedgerError(f"the ledger {self.path} is corrupt ({exc}). dprun will not guess what was spent; "
                               "restore it from a backup, then run again")
        return LedgerError(f"cannot read or write the ledger {self.path}: {exc}")


def _make_schema(cursor: Cursor) -> None:
    for statement in SCHEMA:
        cursor.execute(statement)
    cursor.execute("SELECT COUNT(*) FROM dprun_ledger")
    if cursor.fetchone()[0] == 0:
        cursor.execute("INSERT INTO dprun_ledger (schema_version) VALUES (?)", (SCHEMA_VERSION,))


def _any_table(cursor: Cursor) -> bool:
    cursor.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'")
    return int(cursor.fetchone()[0]) > 0


def _has_tables(cursor: Cursor) -> bool:
    cursor.execute("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('dprun_ledger', "
                   "'dprun_releases')")
    return int(cursor.fetchone()[0]) == 2

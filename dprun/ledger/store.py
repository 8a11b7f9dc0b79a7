"""The ledger's entries in an SQL database: the interface both stores share.

One table, `dprun_releases`: a row per release with its number, release id, state,
dataset, and the entry as JSON text (its state lives in the column only). Every change
is one transaction, so the rules hold whatever runs at the same time:

* `reserve` reads what the dataset has spent and inserts the new pending entry in the
  same transaction: two runs can never both pass the check and both spend;
* `publish` marks a reserved entry published with its files' sha256s;
* `abandon` marks a pending entry abandoned: its spend no longer counts.

The stores differ only in how a transaction starts and what makes one retry:
`SqliteLedger` (`BEGIN IMMEDIATE`, one writer at a time, waiting for the others) and
`PostgresLedger` (SERIALIZABLE, retried on a serialization failure).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

from dprun.ledger.entries import (
    ABANDONED,
    PENDING,
    PUBLISHED,
    LedgerError,
    Release,
    Status,
    check,
    entry_problem,
    status,
)
from dprun.small_files import loads_json

SCHEMA_VERSION = 1
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS dprun_ledger (schema_version INTEGER NOT NULL)",
    ("CREATE TABLE IF NOT EXISTS dprun_releases (release BIGINT PRIMARY KEY, release_id TEXT UNIQUE, "
     "state TEXT NOT NULL CHECK (state IN ('pending', 'published', 'abandoned')), "
     "dataset TEXT NOT NULL, entry TEXT NOT NULL)"),
    "CREATE INDEX IF NOT EXISTS dprun_releases_by_dataset ON dprun_releases (dataset)",
)
T = TypeVar("T")


class Cursor(Protocol):
    """What both drivers' cursors offer (sqlite3 and psycopg), with the store's placeholders."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class SqlLedger(ABC):
    """A ledger in an SQL database. `shown` names it in messages (never with a password)."""

    def __init__(self, shown: str) -> None:
        self.shown = shown

    @abstractmethod
    def _transaction(self, write: bool) -> AbstractContextManager[Cursor | None]:
        """A cursor inside one transaction, committed when the block ends without an error.

        With `write`, the tables exist (they are made on the first write); without it, the
        cursor is None where the ledger does not exist yet (a read never creates it).
        SQL takes `?` placeholders, whatever the driver's.
        """

    def _run(self, work: Callable[[Cursor | None], T], write: bool) -> T:
        """`work` inside one transaction; a store that retries transactions overrides this."""
        with self._transaction(write) as cursor:
            return work(cursor)

    # --- reading ---------------------------------------------------------------------------

    def entries(self, dataset: str | None = None) -> list[dict[str, Any]]:
        """Every entry (of one dataset), checked, in release order."""
        return self._run(lambda cursor: self._select(cursor, dataset), write=False)

    def status(self, release: Release) -> Status:
        return status(self.shown, self.entries(release.dataset), release)

    def _select(self, cursor: Cursor | None, dataset: str | None) -> list[dict[str, Any]]:
        if cursor is None:
            return []
        where = "" if dataset is None else " WHERE dataset = ?"
        cursor.execute(f"SELECT release, release_id, state, entry FROM dprun_releases{where} ORDER BY release",
                       () if dataset is None else (dataset,))
        return [self._decoded(row) for row in cursor.fetchall()]

    def _decoded(self, row: tuple[Any, ...]) -> dict[str, Any]:
        number, release_id, state, text = row
        if not isinstance(number, int) or not isinstance(release_id, (str, type(None))) or not isinstance(text, str):
            raise self._corrupt(number if isinstance(number, int) else 0, "has a row of the wrong types")
        try:
            stored = loads_json(text)
        except ValueError:
            raise self._corrupt(number, "is not valid JSON") from None
        if not isinstance(stored, dict):
            raise self._corrupt(number, "is not a JSON object")
        entry = {**stored, "release": number, "release_id": release_id, "state": state}
        problem = entry_problem(entry)
        if problem is not None:
            raise self._corrupt(number, problem)
        return entry

    def _corrupt(self, number: int, problem: str) -> LedgerError:
        return LedgerError(
            f"the ledger {self.shown} is corrupt: release {number} {problem}. dprun will not guess what was "
            "spent; restore the ledger from a backup, then run again")

    # --- changing ----------------------------------------------------------------------------

    def reserve(self, release: Release, entry: dict[str, Any], new_release: bool) -> dict[str, Any]:
        """Check the release against the ledger and insert `entry` as pending, in one transaction.

        Raises `ReleasedBefore` or `LifetimeExceeded` (and inserts nothing) if the checks fail.
        Returns the entry as stored, with its release number.
        """
        def work(cursor: Cursor | None) -> dict[str, Any]:
            assert cursor is not None
            check(status(self.shown, self._select(cursor, release.dataset), release), new_release)
            cursor.execute("SELECT COALESCE(MAX(release), 0) + 1 FROM dprun_releases")
            stored = {**entry, "release": int(cursor.fetchone()[0]), "state": PENDING}
            _insert(cursor, stored)
            return stored

        return self._run(work, write=True)

    def publish(self, release: Release, entry: dict[str, Any]) -> tuple[dict[str, Any], Status]:
        """Mark a reserved entry published, storing `entry` (its files hashed) in its place;
        returns it as stored, and the release's status with it, read in the same transaction.

        Published whatever state it is in: the release exists, so its spend counts, even if
        an operator abandoned the entry while the run went on.
        """
        stored = {**entry, "state": PUBLISHED}

        def work(cursor: Cursor | None) -> Status:
            assert cursor is not None
            cursor.execute("UPDATE dprun_releases SET state = ?, entry = ? WHERE release = ?",
                           (PUBLISHED, _entry_text(stored), stored["release"]))
            if cursor.rowcount != 1:
                raise LedgerError(f"release {stored['release']} is no longer in the ledger {self.shown}")
            return status(self.shown, self._select(cursor, release.dataset), release)

        return stored, self._run(work, write=True)

    def abandon(self, number: int) -> dict[str, Any]:
        """Mark pending release `number` abandoned: its spend no longer counts. Refused for any other state."""
        def work(cursor: Cursor | None) -> dict[str, Any]:
            assert cursor is not None
            cursor.execute("SELECT release, release_id, state, entry FROM dprun_releases WHERE release = ?",
                           (number,))
            row = cursor.fetchone()
            if row is None:
                raise LedgerError(f"the ledger {self.shown} has no release {number}")
            entry = self._decoded(tuple(row))
            if entry["state"] != PENDING:
                raise LedgerError(f"release {number} in the ledger {self.shown} is {entry['state']}, not pending: "
                                  "only a pending release can be abandoned")
            cursor.execute("UPDATE dprun_releases SET state = ? WHERE release = ?", (ABANDONED, number))
            return {**entry, "state": ABANDONED}

        return self._run(work, write=True)

    def import_entries(self, entries: list[dict[str, Any]]) -> None:
        """Insert checked entries, keeping their numbers, into a ledger that holds none yet."""
        def work(cursor: Cursor | None) -> None:
            assert cursor is not None
            cursor.execute("SELECT COUNT(*) FROM dprun_releases")
            held = int(cursor.fetchone()[0])
            if held:
                raise LedgerError(f"the ledger {self.shown} already holds {held} release(s): import into a new "
                                  "ledger, so that no release number is used twice")
            for entry in entries:
                _insert(cursor, entry)

        self._run(work, write=True)


def _insert(cursor: Cursor, entry: dict[str, Any]) -> None:
    cursor.execute("INSERT INTO dprun_releases (release, release_id, state, dataset, entry) VALUES (?, ?, ?, ?, ?)",
                   (entry["release"], entry.get("release_id"), entry["state"], entry["dataset"], _entry_text(entry)))


def _entry_text(entry: dict[str, Any]) -> str:
    return json.dumps({key: value for key, value in entry.items() if key != "state"}, ensure_ascii=False)

"""A ledger many machines share: PostgreSQL through psycopg 3 (`pip install 'dprun[postgres]'`).

Every transaction is SERIALIZABLE. Two runs that both read a dataset's spend and both
insert a new entry form a write skew, which PostgreSQL's serializable snapshot isolation
detects and aborts one of; two that pick the same release number collide on the primary
key. Either way the loser is retried from the start, with a fresh read of the spend, so
any number of runners on any machines can race and never spend past the lifetime.

Credentials follow libpq's conventions (the URL, PG* environment variables, ~/.pgpass,
service files), all handled by libpq itself. A password never reaches a message: the
location is shown redacted and the driver's words are scrubbed of every password known.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from dprun.ledger.entries import LedgerError
from dprun.ledger.location import redacted, secrets_in
from dprun.ledger.store import SCHEMA, SCHEMA_VERSION, Cursor, SqlLedger

CONNECT_TIMEOUT_SECONDS = 15
MAX_ATTEMPTS = 64
# An arbitrary constant: the advisory lock that serializes making the tables.
SCHEMA_LOCK = 0x6470_7275_6E00
T = TypeVar("T")


class _Retry(Exception):
    """The transaction lost a race (serialization failure, deadlock, a release number taken): run it again."""


class PostgresLedger(SqlLedger):
    def __init__(self, url: str) -> None:
        super().__init__(redacted(url))
        self.url = url

    def _run(self, work: Callable[[Cursor | None], T], write: bool) -> T:
        for attempt in range(MAX_ATTEMPTS):
            try:
                return super()._run(work, write)
            except _Retry:
                # Jittered exponential backoff, so that racing runners spread out; jitter from
                # the OS's generator like every other random choice dprun makes.
                time.sleep(min(0.5, 0.002 * 2**attempt) * (0.5 + secrets.randbelow(1024) / 1024))
        raise LedgerError(f"the ledger database {self.shown} stayed too busy: {MAX_ATTEMPTS} attempts lost a race "
                          "with other runs; nothing was spent")

    @contextmanager
    def _transaction(self, write: bool) -> Iterator[Cursor | None]:
        psycopg = _driver()
        retried = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected,
                   psycopg.errors.UniqueViolation)
        try:
            connection = psycopg.connect(self.url, connect_timeout=CONNECT_TIMEOUT_SECONDS, autocommit=True)
        except psycopg.Error as exc:
            raise LedgerError(f"cannot reach the ledger database {self.shown}: {self._scrubbed(exc)}") from None
        try:
            exists = _has_tables(connection)
            if write and not exists:
                _make_schema(connection)
            if exists or write:
                _check_version(connection, self.shown)
            connection.autocommit = False
            connection.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
            with connection.transaction():
                yield _Placeholders(connection.cursor()) if exists or write else None
        except retried:
            raise _Retry() from None
        except psycopg.Error as exc:
            raise LedgerError(f"the ledger database {self.shown} failed: {self._scrubbed(exc)}") from None
        finally:
            connection.close()

    def _scrubbed(self, exc: Exception) -> str:
        message = str(exc).strip() or type(exc).__name__
        for secret in secrets_in(self.url):
            message = message.replace(secret, "***")
        return message


class _Placeholders:
    """A psycopg cursor that takes the store's `?` placeholders (sqlite3's) as psycopg's `%s`."""

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    def execute(self, sql: str, parameters: Any = ()) -> Any:
        # The store's SQL holds no literal `?` or `%`, so the translation is exact.
        return self._cursor.execute(sql.replace("?", "%s"), parameters)

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cursor.fetchall())


def _driver() -> Any:
    try:
        import psycopg
    except ImportError:
        raise LedgerError("a postgresql:// ledger needs psycopg: pip install 'dprun[postgres]'") from None
    return psycopg


def _has_tables(connection: Any) -> bool:
    row = connection.execute("SELECT to_regclass('dprun_releases') IS NOT NULL AND "
                             "to_regclass('dprun_ledger') IS NOT NULL").fetchone()
    return bool(row[0])


def _make_schema(connection: Any) -> None:
    """Make the tables once, whoever else tries at the same time (the advisory lock serializes them)."""
    with connection.transaction():
        connection.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        for statement in SCHEMA:
            connection.execute(statement)
        if connection.execute("SELECT COUNT(*) FROM dprun_ledger").fetchone()[0] == 0:
            connection.execute("INSERT INTO dprun_ledger (schema_version) VALUES (%s)", (SCHEMA_VERSION,))


def _check_version(connection: Any, shown: str) -> None:
    version = connection.execute("SELECT MAX(schema_version) FROM dprun_ledger").fetchone()[0]
    if version is not None and int(version) > SCHEMA_VERSION:
        raise LedgerError(f"the ledger database {shown} was written by a newer dprun (schema {version}); "
                          "upgrade dprun")

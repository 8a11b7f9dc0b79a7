"""The release ledger: every release dprun makes, and what it spent, in a database.

`open_ledger(location)` gives the store for a location (`dprun.ledger.location`): a path
is an embedded SQLite database (the default), a `postgresql://` URL a PostgreSQL database
that many CI runners can share. A run reserves its spend before it reads any data row,
and marks it published or abandoned at the end (`dprun.ledger.store`); the checks and the
entries are in `dprun.ledger.entries`, exact spends in `dprun.ledger.spend`.
See docs/ledger.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the stores are imported by `open_ledger`: the spec checks import `location` only
    from dprun.ledger.location import Location
    from dprun.ledger.store import SqlLedger


def open_ledger(location: Location) -> SqlLedger:
    """The store at `location`; nothing is read or created until it is used."""
    if isinstance(location, Path):
        from dprun.ledger.sqlite_store import SqliteLedger

        return SqliteLedger(location)
    from dprun.ledger.postgres_store import PostgresLedger

    return PostgresLedger(location)

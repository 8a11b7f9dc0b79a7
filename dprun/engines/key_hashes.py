"""Table-coded keys found in each shard by a keyed hash of their values, instead of a join
of the table into every row as the rows stream to the shards.

Where a query's units are coded per shard (`codes.ShardUnits`), its keys by a table
(`codes.TableKeys`) and its shards bounded by the compiled passes (large inputs), the rows
go to the shards with a keyed 64-bit hash of their key instead of the key's code: Polars'
join of a table of 10^6 text keys into 10^8 rows cost ~10 CPU-seconds of the sink, the
hash ~1. Each shard then finds its rows' codes in an open-addressing table of the keys'
hashes (`find_codes`, ~15 ns a row).

Exact: the table's keys are checked to have distinct hashes (else the rows take the join);
every row's key is one of the table's (the table lists the query's keys, and a public
list is joined first), so a row's hash finds its own key's code; a hash with no key in the
table fails the run, as a key missing from the table does with the join.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from dprun.engines.codes import KEY, equal_by_bits
from dprun.engines.prefetch import prefetch_row_to_read

if TYPE_CHECKING:
    from dprun.engines.compiled import UnitPasses

KEY_HASH = "__dprun_key_hash__"


class KeyHashes:
    """The table's keys by a keyed hash of their values: the hash expression the rows carry to
    the shards, and each shard's codes from those hashes."""

    def __init__(self, columns: tuple[str, ...], hashes: np.ndarray, seed: int) -> None:
        self.columns = columns
        self.seed = seed
        self._hashes = hashes
        # 2^bits slots, at least twice the keys: probes stay short (half the slots are empty).
        self._slot_bits = max(1, (2 * hashes.size - 1).bit_length())
        self._slots: np.ndarray | None = None
        self._filling = threading.Lock()

    @classmethod
    def of(cls, table: pl.DataFrame, schema: dict[str, pl.DataType], seed: int) -> KeyHashes | None:
        """The table's keys by hash; None where a key column's type is not hashed exactly, its
        type in the rows is not the table's, or two of its keys share a hash."""
        columns = tuple(table.columns)
        # Only keys equal exactly where their bits are (a float's 0.0 and −0.0 are one key to a
        # join but two to a hash) are found by hash.
        if any(not equal_by_bits(schema[c]) or schema[c] != table.schema[c]
               for c in columns):
            return None
        hashes = table.select(key_hash(columns, seed)).to_series()
        if hashes.n_unique() < hashes.len():
            return None
        return cls(columns, hashes.to_numpy().view(np.int64).copy(), seed)

    def expr(self) -> pl.Expr:
        """Each row's key hash (`KEY_HASH`)."""
        return key_hash(self.columns, self.seed)

    def codes(self, hashes: pl.Series, passes: UnitPasses) -> pl.Series:
        """The key code of each hash (`KEY`), by the compiled `fill_slots` (once, by the first
        shard) and `find_codes`; null for a hash no key has, which fails the run (`_check_codes`)."""
        with self._filling:
            if self._slots is None:
                self._slots = np.zeros((1 << self._slot_bits, 2), np.int64)
                passes.fill_key_slots(self._hashes, self._slots, 64 - self._slot_bits)
        found = np.empty(hashes.len(), np.int64)
        row_hashes = hashes.rechunk().to_numpy().view(np.int64)
        codes = pl.Series(KEY, found)
        if passes.find_key_codes(self._slots, row_hashes, found, 64 - self._slot_bits):
            return codes.scatter(np.flatnonzero(found < 0), None)
        return codes


def key_hash(columns: tuple[str, ...], seed: int) -> pl.Expr:
    return pl.struct(list(columns)).hash(seed).alias(KEY_HASH)


def fill_slots(hashes: np.ndarray, slots: np.ndarray, shift: int) -> None:
    """Put key code c's hash in the first free slot from the one its top bits name: `slots[s]`
    holds (hash, c + 1), 0 in the second place for a free slot. `slots` has 2^(64 − shift)
    rows, more than the hashes. Run compiled (`compiled.UnitPasses`); as Python in tests."""
    size = slots.shape[0]
    for code in range(hashes.size):
        slot = (hashes[code] >> shift) & (size - 1)
        while slots[slot, 1] != 0:
            slot = (slot + 1) & (size - 1)
        slots[slot, 0] = hashes[code]
        slots[slot, 1] = code + 1


# Rows `find_codes` asks the slots of ahead of the row it looks up.
LOOKAHEAD = 64


def find_codes(slots: np.ndarray, hashes: np.ndarray, codes: np.ndarray, shift: int) -> int:
    """Write each hash's key code into `codes` (−1 for a hash no key has), from slots that
    `fill_slots` filled, and return how many hashes no key has. Run compiled
    (`compiled.UnitPasses`); as Python in tests.

    The slots of 10^6 keys (32 MB) are far larger than the caches, and the rows' keys come in
    no order: each row asks for the slot of the row LOOKAHEAD rows on (`prefetch_row_to_read`),
    so that that many loads are in flight (2^21 rows of the text benchmark, two workers at
    once: 15–19 → 8 ns a row)."""
    size = slots.shape[0]
    missing = 0
    for row in range(min(LOOKAHEAD, hashes.size)):
        prefetch_row_to_read(slots, (hashes[row] >> shift) & (size - 1))
    for row in range(hashes.size):
        if row + LOOKAHEAD < hashes.size:
            prefetch_row_to_read(slots, (hashes[row + LOOKAHEAD] >> shift) & (size - 1))
        found = hashes[row]
        slot = (found >> shift) & (size - 1)
        codes[row] = -1
        while slots[slot, 1] != 0:
            if slots[slot, 0] == found:
                codes[row] = slots[slot, 1] - 1
                break
            slot = (slot + 1) & (size - 1)
        if codes[row] < 0:
            missing += 1
    return missing


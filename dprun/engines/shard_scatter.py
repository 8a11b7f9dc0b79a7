"""Rows of packed codes gathered into shards of whole units in memory, batch by batch as
Polars' streaming engine returns them (`shards.scattered_shards`), instead of through its
partitioned sink into scratch files.

Written by hand, because Polars' partitioned sink cost a shuffled input of 10^8 rows
(integer unit and key, codes alone) 2.25 s, of which reading and coding the rows took
1.0: the rest went to partitioning and writing 800 MB of Arrow files, read back at once.
One compiled pass per batch (`group_by_shard`: a shard per row, then the rows grouped by
shard), each shard's part kept as a view of the batch, takes 0.4 s more than reading (1.43 s
against 1.03, two cores, the pass loaded).

Shards only gather a unit's rows; they never decide what counts, so no released number
depends on them. The rows are held in memory up to HELD_BYTES; past that, every shard's rows
held so far go to its scratch file (`HeldShards.spill`), so memory stays bounded whatever the
input's size.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np

# Bytes of rows held in memory while they are gathered; past them, the rows held go to
# scratch files. 1 GiB: 10^8 rows of codes alone (805 MB) stay in memory, where the peak
# of a run stays below 2 GB.
HELD_BYTES = 2**30
# The bits `group_by_shard` mixes a unit code in, and the multipliers' bound: their product
# stays below 2^63 (int64, compiled and in Python alike).
MIX_BITS = 32
MULTIPLIER_BITS = 31


def multipliers(seed: int) -> tuple[int, int]:
    """The two odd multipliers of `group_by_shard`'s mix, from the run's secret: below
    2^MULTIPLIER_BITS, their top bit set."""
    top = 1 << (MULTIPLIER_BITS - 1)
    return ((seed >> 3) % top | top | 1, (seed >> 35) % top | top | 1)


def group_by_shard(codes: np.ndarray, key_bits: int, first: int, second: int, count: int, grouped: np.ndarray,
                   bounds: np.ndarray) -> None:
    """Writes `codes` into `grouped` (as long) grouped by their unit's shard, in their order
    within a shard, shard s's at `bounds[s]` .. `bounds[s + 1]` (`bounds`: count + 1 long).

    A code's unit (its bits above `key_bits`) is folded into MIX_BITS bits (its high half
    xored into its low half), mixed (multiplied by `first`, its top half xored into its bottom
    half, multiplied by `second`, all mod 2^MIX_BITS: each step a bijection, as in the
    finalizers of MurmurHash) and its shard is the top part of the result, ⌊m · count / 2^MIX_BITS⌋:
    the secret multipliers spread units with a common stride over every shard. Run compiled
    (`compiled.compiled_scatter`); as Python in tests.
    """
    mask = (1 << MIX_BITS) - 1
    half = MIX_BITS // 2
    shard_of = np.empty(codes.size, np.int32)
    for shard in range(count + 1):
        bounds[shard] = 0
    for row in range(codes.size):
        unit = codes[row] >> key_bits
        mixed = ((unit ^ (unit >> MIX_BITS)) & mask) * first & mask
        mixed = (mixed ^ (mixed >> half)) * second & mask
        shard = (mixed * count) >> MIX_BITS
        shard_of[row] = shard
        bounds[shard + 1] += 1
    for shard in range(count):
        bounds[shard + 1] += bounds[shard]
    places = bounds[:count].copy()
    for row in range(codes.size):
        shard = shard_of[row]
        grouped[places[shard]] = codes[row]
        places[shard] += 1


class HeldShards:
    """Each shard's rows as they are gathered: parts in memory, appended to the shard's
    scratch file in `folder` whenever the parts held pass HELD_BYTES (`spill`); batches are
    added by several threads at once (`add`); once all are, a shard's rows are loaded once
    (`load`), by the worker that bounds it, and freed."""

    def __init__(self, count: int, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir()
        self.parts: list[list[np.ndarray]] = [[] for _ in range(count)]
        self.spilled: set[int] = set()
        self.held = 0
        self._lock = threading.Lock()

    def add(self, grouped: np.ndarray, bounds: np.ndarray) -> None:
        """A batch's rows grouped by shard (`group_by_shard`), each shard's part a view of them
        (a copy each cost 0.1 s of 10^8 rows: the batch is freed with the last shard loaded,
        as the shards are loaded once all rows are held)."""
        with self._lock:
            for shard, (start, end) in enumerate(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)):
                if end > start:
                    self.parts[shard].append(grouped[start:end])
            self.held += grouped.nbytes
            if self.held > HELD_BYTES:
                self.spill()

    def spill(self) -> None:
        """Every shard's parts held, appended to its scratch file (called holding the lock)."""
        for shard, parts in enumerate(self.parts):
            if parts:
                with self._path(shard).open("ab") as file:
                    for part in parts:
                        part.tofile(file)
                self.spilled.add(shard)
                parts.clear()
        self.held = 0

    def with_rows(self) -> list[int]:
        """The shards that hold rows, in order."""
        return [shard for shard, parts in enumerate(self.parts) if parts or shard in self.spilled]

    def load(self, shard: int) -> np.ndarray:
        """A shard's rows, in one writable array; its parts and file are freed."""
        parts = self.parts[shard]
        if shard in self.spilled:
            path = self._path(shard)
            parts.insert(0, np.fromfile(path, dtype=np.int64))
            os.unlink(path)
        loaded = parts[0] if len(parts) == 1 and shard in self.spilled else np.concatenate(parts)
        self.parts[shard] = []
        return loaded

    def _path(self, shard: int) -> Path:
        return self.folder / f"{shard}.codes"

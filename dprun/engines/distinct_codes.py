"""A shard's units coded densely from their hashes, in one compiled pass over the rows.

`codes.shard_unit_codes` codes a shard's units by a keyed 64-bit hash of their values where
the hashes tell the units apart, which it checks by counting the distinct hashes against the
distinct units. This pass does both at once: it numbers the distinct hashes 0, 1, 2, … in the
order they first come, gives each row its hash's number, and returns how many there are.
Dense codes are short (a shard's 2^18 units in 18 bits, where the hash's top bits took all
the bits beside the key's), so the radix sort of the packed codes takes 4 passes, not 7.
Written by hand, because Polars has no pass that returns both (`rank("dense")` of the hashes
sorts them, and its `n_unique` of a shard's 2^21 Int64 codes alone took 29 ms); the hashes'
own low bits place them in an open-addressing table sized for the shard's units (counted
first), each row asking for the slot of the row LOOKAHEAD rows on. Compiled by numba with the
sorted path's other passes (`dprun.engines.compiled`).
"""

from __future__ import annotations

import numpy as np

from dprun.engines.prefetch import prefetch_row

# Rows ahead of the one read whose slot the pass asks for (`prefetch_row`): a shard's table of
# 2^18 units (8 MB) is larger than the processor's caches; 2^21 rows of 200,000 units, each
# unit's rows together, 7.3 → 4.0 ms (in no order, 7.5 → 5.4).
LOOKAHEAD = 32


def slots_for(distinct: int) -> np.ndarray:
    """An empty table for `dense_codes` of hashes with at most `distinct` distinct values: a
    power of two at least twice that many slots, so that probes stay short."""
    return np.zeros((1 << max(1, (2 * distinct - 1).bit_length()), 2), np.int64)


def dense_codes(hashes: np.ndarray, slots: np.ndarray, codes: np.ndarray) -> int:
    """Write into `codes` each row's dense code, the number of its hash among the distinct
    `hashes` in the order they first come, and return how many distinct hashes there are.
    `slots` (empty: zeros, a power of two of them, more than the distinct hashes) holds
    (hash, code + 1), 0 in the second place for a free slot. Run compiled
    (`compiled.UnitPasses`); as Python in tests."""
    size = slots.shape[0]
    distinct = 0
    for row in range(hashes.size):
        found = hashes[row]
        if row + LOOKAHEAD < hashes.size:
            prefetch_row(slots, hashes[row + LOOKAHEAD] & (size - 1))
        # A unit's rows often come together (inputs listed by unit): the table only for a new one.
        if row > 0 and found == hashes[row - 1]:
            codes[row] = codes[row - 1]
            continue
        slot = found & (size - 1)
        while slots[slot, 1] != 0 and slots[slot, 0] != found:
            slot = (slot + 1) & (size - 1)
        if slots[slot, 1] == 0:
            distinct += 1
            slots[slot, 0] = found
            slots[slot, 1] = distinct
        codes[row] = slots[slot, 1] - 1
    return distinct

"""How many distinct codes a shard's rows have, counted in one compiled pass over them.

`codes.shard_unit_codes` takes a keyed hash's top bits as a shard's unit codes where they
tell the units apart, which it checks by counting the distinct codes against the distinct
units. Written by hand, because Polars' `n_unique` of a shard's 2^21 Int64 codes took 29 ms
where this pass takes ~10: the codes are hash bits already, so their own low bits place
them in an open-addressing table sized for the shard's units (counted first), which stays
in cache. Compiled by numba with the sorted path's other passes (`dprun.engines.compiled`).
"""

from __future__ import annotations

import numpy as np


def slots_for(distinct: int) -> np.ndarray:
    """An empty table for `count_distinct` of codes with at most `distinct` distinct values: a
    power of two at least twice that many slots, so that probes stay short."""
    return np.zeros(1 << max(1, (2 * distinct - 1).bit_length()), np.int64)


def count_distinct(codes: np.ndarray, slots: np.ndarray) -> int:
    """The number of distinct values among `codes` (non-negative), each put in `slots` (empty:
    zeros, a power of two of them, more than the distinct codes) as code + 1. Run compiled
    (`compiled.UnitPasses`); as Python in tests."""
    size = slots.size
    distinct = 0
    for row in range(codes.size):
        held_as = codes[row] + 1
        slot = codes[row] & (size - 1)
        while slots[slot] != 0 and slots[slot] != held_as:
            slot = (slot + 1) & (size - 1)
        if slots[slot] == 0:
            slots[slot] = held_as
            distinct += 1
    return distinct

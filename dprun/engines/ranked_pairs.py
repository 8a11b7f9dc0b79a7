"""The heavy units' kept pairs added to the running totals in one compiled pass over their
ranked pairs.

A heavy unit (more than L0 partitions) keeps its L0 first pairs in the order that chooses them
(`sorted_bounding.SortedBounding._ranked_heavy`), among the chosen keys only in Plume's second
bounding. Written by hand, because numpy took a dozen passes for it (the runs of units, each
pair's rank within its unit, a mask, then per quantity a scattered add of 8 bytes per key code
or `np.add.at`): both boundings of the 10^7 heavy pairs of d4 (the shuffled Plume data) took
0.31 s of the workers' time, 0.17 s with this pass, which asks for the row of totals of the
key LOOKAHEAD pairs on (`prefetch_row`; 0.25 s without). Compiled by numba with the sorted
path's other passes (`dprun.engines.compiled`).
"""

from __future__ import annotations

import numpy as np

from dprun.engines.prefetch import prefetch_row

# Pairs ahead of the one read whose key's row of totals the pass asks for (`prefetch_row`), as
# `light_units.LOOKAHEAD`.
LOOKAHEAD = 32


def add_ranked_pairs(units: np.ndarray, keys: np.ndarray, partials: np.ndarray, chosen: np.ndarray,
                     max_partitions: int, table: np.ndarray) -> None:
    """Adds to `table` the pairs each unit keeps: its first `max_partitions` among those whose
    key is `chosen` (every key where `chosen` is empty).

    The pairs come in ranked order, each unit's together: pair p has the unit code `units[p]`,
    the key code `keys[p]` and quantity q's partial `partials[q, p]`. A kept pair adds one unit
    to `table[key, 0]` and its partials to `table[key, q + 1]` (the layout of
    `light_units.add_light_units`; the caller makes sure the sums cannot overflow). Run compiled
    (`compiled.Passes`); as Python in tests.
    """
    every = chosen.size == 0
    quantities = partials.shape[0]
    previous = -1
    rank = 0
    for pair in range(units.size):
        if pair + LOOKAHEAD < units.size:
            prefetch_row(table, keys[pair + LOOKAHEAD])
        key = keys[pair]
        if not every and not chosen[key]:
            continue
        if units[pair] != previous:
            previous = units[pair]
            rank = 0
        if rank < max_partitions:
            table[key, 0] += 1
            for quantity in range(quantities):
                table[key, quantity + 1] += partials[quantity, pair]
        rank += 1

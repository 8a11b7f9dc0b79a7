"""A value column's rows summed per (unit, partition) pair in one compiled pass over a shard.

Each row's value becomes integer units of a quantity exactly as `polars_steps.row_units` computes
them (clamped to the bounds, centred, squared for a sum of squares, scaled by a power of two,
rounded half to even, clipped to the quantity's most units), and a pair's units are summed in
int64: as the sums are integers, the order of the rows does not matter and they equal numpy's
sums of Polars' units, bit for bit (tested).

Written by hand, because Polars computes the units in six passes over the column and numpy then
gathers them in the sorted order and sums each pair's run: three of c3's bounding's
thread-seconds in Polars and four in numpy at 10^7 users, where this pass reads each row once,
where the sort puts it. Compiled by numba with the light units' loop (`dprun.engines.compiled`).
"""

from __future__ import annotations

import numpy as np

# `pair_unit_sums`' arguments after the rows that count a pair's rows with a value: each is
# clamped to [1, 1], left uncentred, scaled by 1, so it adds one unit; a missing one adds nothing.
ONE_PER_VALUE = (1.0, 1.0, 0.0, 1.0, 1.0, 1.0, False)


def pair_unit_sums(values: np.ndarray, order: np.ndarray, starts: np.ndarray, lower: float, upper: float,
                   center: float, scale: float, low: float, high: float, squared: bool) -> np.ndarray:
    """Per pair, the sum of its rows' units; `values[order[i]]` is row i in sorted order and pair
    p's rows are starts[p] up to starts[p + 1] (the last up to the end). A missing value (NaN)
    adds nothing, as Polars' null does."""
    sums = np.zeros(starts.size, np.int64)
    for pair in range(starts.size):
        stop = starts[pair + 1] if pair + 1 < starts.size else order.size
        total = 0
        for row in range(starts[pair], stop):
            value = values[order[row]]
            if value != value:
                continue
            value = min(max(value, lower), upper) - center
            if squared:
                value = value * value
            scaled = np.round(value * scale)
            total += int(min(max(scaled, low), high))
        sums[pair] = total
    return sums


"""A shard's light units added to the running totals in one compiled pass over its sorted pairs.

A light unit has at most L0 partitions: both boundings keep all its pairs, so each of its
pairs adds one unit, its partials and, for a weighted selection, the unit's weight w(pairs)
to its key's totals; a heavy unit's pairs are only listed, to be ranked apart.

Written by hand as one loop, because numpy needs a dozen passes over the pairs for it (runs
of units, their lengths repeated per pair, masks, a bincount over 8 bytes per key code per
sum): five times the time of this loop compiled for a count, twice for four sums per pair.
Compiled by numba for inputs of `compiled.COMPILED_FROM_ROWS` rows (`dprun.engines.compiled`);
smaller ones take numpy's passes (`sorted_bounding._Totals`).

Where each pair's partials are its rows (counts only: no value, no quantile), `add_light_rows`
does the same from the shard's sorted rows, without finding the pairs first: numpy cut the rows
into pairs in four passes and wrote three arrays of a shard's size that the loop then read back
(a shard of the Plume data, 2^21 rows: 48 ms after the sort, 29 ms in one pass).
"""

from __future__ import annotations

import numpy as np


def add_light_units(pair_codes: np.ndarray, key_bits: int, max_partitions: int, weights: np.ndarray,
                    partials: np.ndarray, table: np.ndarray, heavy: np.ndarray) -> int:
    """Adds every light unit's pairs to `table`, writes the indices of the heavy units' pairs
    into `heavy` (room for every pair) and returns how many there are.

    `pair_codes`: the shard's distinct (unit, key) codes, sorted, unit above `key_bits` bits of
    key. A pair adds one unit to `table[key, 0]` and quantity q's partial `partials[q, p]` to
    `table[key, q + 1]`: a key's totals side by side, one cache line a pair (the units apart
    cost c3's loop a fifth more). With a weighted selection, `weights[n - 1]` is w(n) for
    n = 1 … L0 (at most) and goes to the column after the partials'; else `weights` is empty.
    Run compiled (`compiled.Passes`); as Python in tests.
    """
    key_mask = (1 << key_bits) - 1
    quantities = partials.shape[0]
    weighted = weights.size > 0
    heavy_pairs = 0
    start = 0
    while start < pair_codes.size:
        unit = pair_codes[start] >> key_bits
        stop = start + 1
        while stop < pair_codes.size and pair_codes[stop] >> key_bits == unit:
            stop += 1
        if stop - start > max_partitions:
            for pair in range(start, stop):
                heavy[heavy_pairs] = pair
                heavy_pairs += 1
        else:
            weight = weights[stop - start - 1] if weighted else 0
            for pair in range(start, stop):
                key = pair_codes[pair] & key_mask
                table[key, 0] += 1
                for quantity in range(quantities):
                    table[key, quantity + 1] += partials[quantity, pair]
                if weighted:
                    table[key, quantities + 1] += weight
        start = stop
    return heavy_pairs


def add_light_rows(codes: np.ndarray, key_bits: int, max_partitions: int, max_rows: int, quantities: int,
                   weights: np.ndarray, table: np.ndarray, heavy_codes: np.ndarray, heavy_rows: np.ndarray) -> int:
    """`add_light_units` from a shard's rows: `codes` are the rows' packed codes, sorted, so a
    pair is a run of equal codes and a unit a run of equal codes above `key_bits` bits.

    Each of the `quantities` partials of a light unit's pair is its rows, at most `max_rows`
    (a count's partial); a heavy unit's pairs are written, its code into `heavy_codes` and
    its rows into `heavy_rows` (room for every row), and their number returned.
    Run compiled (`compiled.Passes`); as Python in tests.
    """
    key_mask = (1 << key_bits) - 1
    weighted = weights.size > 0
    heavy_pairs = 0
    start = 0
    while start < codes.size:
        unit = codes[start] >> key_bits
        stop = start + 1
        pairs = 1
        while stop < codes.size and codes[stop] >> key_bits == unit:
            if codes[stop] != codes[stop - 1]:
                pairs += 1
            stop += 1
        heavy = pairs > max_partitions
        weight = weights[pairs - 1] if weighted and not heavy else 0
        row = start
        while row < stop:
            end = row + 1
            while end < stop and codes[end] == codes[row]:
                end += 1
            if heavy:
                heavy_codes[heavy_pairs] = codes[row]
                heavy_rows[heavy_pairs] = end - row
                heavy_pairs += 1
            else:
                key = codes[row] & key_mask
                table[key, 0] += 1
                partial = min(end - row, max_rows)
                for quantity in range(quantities):
                    table[key, quantity + 1] += partial
                if weighted:
                    table[key, quantities + 1] += weight
            row = end
        start = stop
    return heavy_pairs

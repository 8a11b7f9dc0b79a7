"""A shard's light units added to the running totals in one compiled pass over its sorted pairs.

A light unit has at most L0 partitions: both boundings keep all its pairs, so each of its
pairs adds one unit, its partials and, for a weighted selection, the unit's weight w(pairs)
to its key's totals; a heavy unit's pairs are only listed, to be ranked apart.

Written by hand as one loop, because numpy needs a dozen passes over the pairs for it (runs
of units, their lengths repeated per pair, masks, a bincount over 8 bytes per key code per
sum): five times the time of this loop compiled for a count, twice for four sums per pair.
Compiled by numba for inputs of `compiled.COMPILED_FROM_ROWS` rows (`dprun.engines.compiled`);
smaller ones take numpy's passes (`sorted_bounding._Totals`).

Without quantile metrics, `add_light_rows` does the same from the shard's sorted rows, without
finding the pairs first, and computes each pair's units and partials as it goes: numpy cut the
rows into pairs in four passes, and `pair_units.pair_unit_sums` and `sorted_bounding._partial`
wrote arrays of a shard's size per quantity, that the loop then read back (a count's shard of
the Plume data, 2^21 rows: 48 ms after the sort, 29 ms in one pass; c3's bounding 0.85 of the
CPU time).

Where a shard's rows are in unit order (row groups of an input written in order of its unit),
`add_light_runs` does the same without sorting them, finding each unit's pairs in a small table
of its codes; only the heavy units' rows are then sorted, for `add_light_rows`.

The per-key table is far larger than the processor's caches (10^6 keys), and the writes into it
bound these loops: at each row (or pair) they ask for the row of totals of the key LOOKAHEAD
rows on, and write to a pair's only once its unit's rows are all scanned (`prefetch_row`):
by then it is there. The loops share small helpers
(`value_units`, `pair_partial`), compiled into them (`compile_helpers`).
"""

from __future__ import annotations

import functools

import numpy as np

from dprun.engines.prefetch import prefetch_row, register_hints

# Rows (or pairs) ahead of the one read whose key's row of totals the passes ask for
# (`prefetch_row`): a c2 shard of 2^21 rows in unit order 20.3 → 16.4 ms (8 rows: 17.5, 64: 16.4).
LOOKAHEAD = 32


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
        stop = start
        while stop < pair_codes.size and pair_codes[stop] >> key_bits == unit:
            if stop + LOOKAHEAD < pair_codes.size:
                prefetch_row(table, pair_codes[stop + LOOKAHEAD] & key_mask)
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


# `add_light_rows`' quantity kinds (column 1 of `kinds`).
ROWS_KIND = 0
VALUE_KIND = 1


def add_light_rows(codes: np.ndarray, order: np.ndarray, key_bits: int, max_partitions: int, max_rows: int,
                   values: np.ndarray, kinds: np.ndarray, params: np.ndarray, weights: np.ndarray,
                   table: np.ndarray, heavy_codes: np.ndarray, heavy_rows: np.ndarray,
                   heavy_partials: np.ndarray) -> int:
    """`add_light_units` from a shard's rows: row i in sorted order has the packed code
    `codes[i]` and its values at place `order[i]` of each row of `values` (a missing one NaN;
    no row, and `order` unread, where no quantity reads a value), so a pair is a run of equal
    codes and a unit a run of equal codes above `key_bits` bits.

    Quantity q reads the value column `kinds[q, 0]` (-1: none). A ROWS_KIND quantity's partial
    is the pair's rows with a value (all its rows without a column), at most `max_rows`; a
    VALUE_KIND quantity's is the sum of its values' units as `pair_units.pair_unit_sums`
    computes them from `params[q]` (its arguments after `starts`), scaled to `max_rows` rows'
    worth where the pair has more values: ⌊sum · max_rows / values⌋, as `sorted_bounding._partial`
    (the caller makes sure the product fits int64). A heavy unit's pairs' partials go to
    `heavy_partials[q]`, its codes to `heavy_codes` and its rows to `heavy_rows` (room for every
    row), and their number is returned. Run compiled (`compiled.Passes`); as Python in tests.
    """
    key_mask = (1 << key_bits) - 1
    weighted = weights.size > 0
    quantities = kinds.shape[0]
    column_of, kind, lower, upper, center, scale, low, high, squared = quantity_arrays(kinds, params)
    # A pair's rows with a value of each quantity's column (all its rows without one), and its units.
    counts = np.zeros(quantities, np.int64)
    sums = np.zeros(quantities, np.int64)
    heavy_pairs = 0
    start = 0
    while start < codes.size:
        unit = codes[start] >> key_bits
        stop = start + 1
        pairs = 1
        while stop < codes.size and codes[stop] >> key_bits == unit:
            if codes[stop] != codes[stop - 1]:
                pairs += 1
            if stop + LOOKAHEAD < codes.size:
                prefetch_row(table, codes[stop + LOOKAHEAD] & key_mask)
            stop += 1
        heavy = pairs > max_partitions
        weight = weights[pairs - 1] if weighted and not heavy else 0
        row = start
        while row < stop:
            code = codes[row]
            for q in range(quantities):
                counts[q] = 0
                sums[q] = 0
            end = row
            while end < stop and codes[end] == code:
                place = order[end]
                for q in range(quantities):
                    column = column_of[q]
                    if column < 0:
                        counts[q] += 1
                    elif values[column, place] == values[column, place]:  # not NaN: a value
                        counts[q] += 1
                        if kind[q] == VALUE_KIND:
                            sums[q] += value_units(values[column, place], lower[q], upper[q], center[q], scale[q],
                                                   low[q], high[q], squared[q])
                end += 1
            if heavy:
                heavy_codes[heavy_pairs] = code
                heavy_rows[heavy_pairs] = end - row
                for q in range(quantities):
                    heavy_partials[q, heavy_pairs] = pair_partial(kind[q], counts[q], sums[q], max_rows)
                heavy_pairs += 1
            else:
                key = code & key_mask
                table[key, 0] += 1
                for q in range(quantities):
                    table[key, q + 1] += pair_partial(kind[q], counts[q], sums[q], max_rows)
                if weighted:
                    table[key, quantities + 1] += weight
            row = end
        start = stop
    return heavy_pairs


def add_light_runs(codes: np.ndarray, key_bits: int, max_partitions: int, max_rows: int, values: np.ndarray,
                   kinds: np.ndarray, params: np.ndarray, weights: np.ndarray, table: np.ndarray,
                   heavy_places: np.ndarray) -> int:
    """`add_light_rows` from a shard's rows in their own order, where each unit's rows come
    together: row i has the code `codes[i]` and its values at place i of each row of `values`.
    Returns -1, `table` untouched, where a unit's code is below the row before's (the rows are
    not in unit order); else adds the light units and returns how many rows the heavy units
    have, whose places it writes into `heavy_places` (room for every row), in order.

    A unit's pairs are found by a table of its codes (open addressing, at most L0 of them):
    no sort. Shards that are runs of row groups of an input written in order of its unit are
    in unit order (the footers say so of the row groups, this pass checks the rows); sorting
    them took a third of a count's bounding. Run compiled (`compiled.Passes`); as Python in tests.
    """
    # Without an early exit, so that the compiler vectorises the check.
    decreases = 0
    for row in range(1, codes.size):
        decreases += codes[row] >> key_bits < codes[row - 1] >> key_bits
    if decreases:
        return -1
    key_mask = (1 << key_bits) - 1
    weighted = weights.size > 0
    quantities = kinds.shape[0]
    column_of, kind, lower, upper, center, scale, low, high, squared = quantity_arrays(kinds, params)
    # A unit's pairs fill at most half the slots, so a search always ends at a free one.
    slot_bits = 4
    while 1 << slot_bits < 2 * max_partitions:
        slot_bits += 1
    slot_mask = (1 << slot_bits) - 1
    slot_codes = np.full(1 << slot_bits, -1, np.int64)
    # Each slot's pair's rows with a value of each quantity's column, and its units (as `add_light_rows`).
    counts = np.zeros((1 << slot_bits, quantities), np.int64)
    sums = np.zeros((1 << slot_bits, quantities), np.int64)
    used = np.empty(max_partitions, np.int64)
    heavy_rows = 0
    start = 0
    while start < codes.size:
        unit = codes[start] >> key_bits
        pairs = 0
        row = start
        while row < codes.size and codes[row] >> key_bits == unit:
            code = codes[row]
            if row + LOOKAHEAD < codes.size:
                prefetch_row(table, codes[row + LOOKAHEAD] & key_mask)
            slot = key_slot(code & key_mask, slot_bits)
            while slot_codes[slot] >= 0 and slot_codes[slot] != code:
                slot = (slot + 1) & slot_mask
            if slot_codes[slot] < 0:
                if pairs == max_partitions:
                    break
                slot_codes[slot] = code
                used[pairs] = slot
                pairs += 1
                for q in range(quantities):
                    counts[slot, q] = 0
                    sums[slot, q] = 0
            for q in range(quantities):
                column = column_of[q]
                if column < 0:
                    counts[slot, q] += 1
                elif values[column, row] == values[column, row]:  # not NaN: a value
                    counts[slot, q] += 1
                    if kind[q] == VALUE_KIND:
                        sums[slot, q] += value_units(values[column, row], lower[q], upper[q], center[q], scale[q],
                                                     low[q], high[q], squared[q])
            row += 1
        if row < codes.size and codes[row] >> key_bits == unit:
            # One pair more than L0: a heavy unit, whose rows are ranked apart.
            while row < codes.size and codes[row] >> key_bits == unit:
                row += 1
            for place in range(start, row):
                heavy_places[heavy_rows] = place
                heavy_rows += 1
        else:
            weight = weights[pairs - 1] if weighted else 0
            for pair in range(pairs):
                slot = used[pair]
                key = slot_codes[slot] & key_mask
                table[key, 0] += 1
                for q in range(quantities):
                    table[key, q + 1] += pair_partial(kind[q], counts[slot, q], sums[slot, q], max_rows)
                if weighted:
                    table[key, quantities + 1] += weight
        for pair in range(pairs):
            slot_codes[used[pair]] = -1
        start = row
    return heavy_rows


def quantity_arrays(kinds: np.ndarray, params: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each quantity's value column and kind, and its `params`, as arrays of their own (a fifth of
    the passes' time as matrices)."""
    return (kinds[:, 0].copy(), kinds[:, 1].copy(), params[:, 0].copy(), params[:, 1].copy(), params[:, 2].copy(),
            params[:, 3].copy(), params[:, 4].copy(), params[:, 5].copy(), params[:, 6].copy())


def value_units(value: float, lower: float, upper: float, center: float, scale: float, low: float, high: float,
                squared: float) -> int:
    """A present value's units, as `pair_units.pair_unit_sums` adds them (its arguments after `starts`)."""
    value = min(max(value, lower), upper) - center
    if squared != 0.0:
        value = value * value
    return int(min(max(np.round(value * scale), low), high))


def pair_partial(kind: int, counted: int, summed: int, max_rows: int) -> int:
    """A pair's partial from its rows with a value and their units (`add_light_rows`)."""
    if kind == ROWS_KIND:
        return min(counted, max_rows)
    if counted > max_rows:
        return summed * max_rows // counted
    return summed


def key_slot(key: int, slot_bits: int) -> int:
    """A key code's first slot of 2^slot_bits, slot_bits ≤ 32 (`add_light_runs`: L0 ≤ 10^6 gives
    at most 21): Fibonacci hashing of its low 32 bits xored with its high ones, in int64 without
    overflow (for numpy's scalars too)."""
    folded = (key ^ (key >> 32)) & 0xFFFFFFFF
    return ((folded * 0x61C88647) & 0xFFFFFFFF) >> (32 - slot_bits)


@functools.cache
def compile_helpers() -> None:
    """Give the hints of `dprun.engines.prefetch` their compiled form, and the helpers above
    theirs (inlined where called: a call that passes arrays costs their reference counts),
    before `dprun.engines.compiled` compiles the passes that call them. Here, not there:
    numba's cache of a compiled pass is redone when the pass's own source file changes, so
    what the passes compile in must be in this file (but for the hints, which change no result).

    The passes above ask for the row of totals of the key LOOKAHEAD rows on, and add to a
    pair's once its unit's rows are all scanned (`prefetch_row`; a count's shard of the Plume
    data, 2^21 sorted rows: 28.5 → 22.6 ms with a pair's row asked for as it is first met, the
    table of 10^6 keys being far larger than the caches; then 18.2 → 16.4 ms LOOKAHEAD rows on).
    """
    from numba.extending import register_jitable

    register_hints()
    for helper in (quantity_arrays, value_units, pair_partial, key_slot):
        register_jitable(inline="always")(helper)

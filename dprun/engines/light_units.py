"""A shard's light units added to the running totals in one compiled pass over its sorted pairs.

A light unit has at most L0 partitions: both boundings keep all its pairs, so each of its
pairs adds one unit, its partials and, for a weighted selection, the unit's weight w(pairs)
to its key's totals; a heavy unit's pairs are only listed, to be ranked apart.

Written by hand as one loop, because numpy needs a dozen passes over the pairs for it (runs
of units, their lengths repeated per pair, masks, a bincount over 8 bytes per key code per
sum): five times the time of this loop compiled for a count, twice for four sums per pair.
numba compiles it (a wheel from the package registry, no compiler on the user's machine) and
caches the machine code on disk, so a machine compiles it once; compiled, it releases the
GIL and each worker thread bounds its own shard. Loading it still costs 0.4 s of one core
(numba's import, then its code generator's), so only inputs of COMPILED_FROM_ROWS rows use
it, loaded in a thread while the shards are written; smaller ones take numpy's passes
(`sorted_bounding._Totals`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

# Rows of a query's input from which its shards are bounded by the compiled loop: there it
# saves ~40 ns per pair, several times the 0.4 s its loading costs.
COMPILED_FROM_ROWS = 2**23
# The one signature the loop is compiled for: all arrays C-contiguous.
SIGNATURE = "int64(int64[::1], int64, int64, int64[::1], int64[:, ::1], int64[::1], int64[:, ::1], int64[::1])"

Loop = Callable[[np.ndarray, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]
_starting = threading.Lock()


def compiled_loop() -> Future[Loop]:
    """The compiled loop, loaded (or compiled) in a thread started by the first call in the process.

    It is called as `add_light_units(pair_codes, key_bits, max_partitions, weights, partials,
    units, sums, heavy)`: it adds every light unit's pairs to `units` and `sums`, writes the
    indices of the heavy units' pairs into `heavy` (room for every pair) and returns how many
    there are. `pair_codes`: the shard's distinct (unit, key) codes, sorted, unit above
    `key_bits` bits of key. `partials[q, p]`: quantity q's partial of pair p, added to
    `sums[key, q]` (a key's sums side by side: one cache line where a pair adds several). With
    a weighted selection, `weights[n - 1]` is w(n) for n = 1 … L0 (at most) and goes to the
    column of `sums` after the partials'; else `weights` is empty. Compiled
    code checks no index and wraps on overflow: the caller makes sure neither can happen.
    """
    with _starting:
        return _loading()


@functools.cache
def _loading() -> Future[Loop]:
    future: Future[Loop] = Future()
    # Not a daemon: a run that fails before its workers wait for the loop (a bad row in the
    # sink) exits once the thread is done, never while it is inside LLVM's code generator.
    threading.Thread(target=_compile, args=(future,), name="dprun-compile").start()
    return future


def _compile(future: Future[Loop]) -> None:
    try:
        import numba  # here: only inputs of COMPILED_FROM_ROWS rows pay its import

        try:
            loop = numba.njit(SIGNATURE, nogil=True, cache=True)(add_light_units)
        except RuntimeError:
            # No writable folder for numba's cache (a read-only installation and home): compile for this run.
            loop = numba.njit(SIGNATURE, nogil=True)(add_light_units)
        future.set_result(loop)
    except Exception as error:  # raised again in the worker that waits for the loop
        future.set_exception(error)


def add_light_units(pair_codes: np.ndarray, key_bits: int, max_partitions: int, weights: np.ndarray,
                     partials: np.ndarray, units: np.ndarray, sums: np.ndarray, heavy: np.ndarray) -> int:
    """The loop `compiled_loop` compiles (what it does is said there); as Python, for tests only."""
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
                units[key] += 1
                for quantity in range(quantities):
                    sums[key, quantity] += partials[quantity, pair]
                if weighted:
                    sums[key, quantities] += weight
        start = stop
    return heavy_pairs

"""A shard's codes sorted by a least-significant-digit radix sort, compiled with the sorted
path's other passes (`dprun.engines.compiled`), on processors where it beats numpy's sort.

Written by hand, because numpy's sort of a shard's 2^21 Int64 codes took 113 ms on an AMD
EPYC with AVX-512 (numpy does not use its vectorised sort there), where four counting passes
of 10-bit digits take 20 ms: the codes are short (a shard's units and the keys, ~40 bits),
and every pass streams the array once. Where numpy's sort is vectorised it wins instead (an
Intel Xeon, 2026-11-29: 16 ms against the radix sort's 40, whose scattered writes wait on
memory there), so the process times both once (`beats_numpy`) and sorts with the faster.
The sort is stable, so codes that agree on the sorted bits stay in their order: sorting
`code << p | place` by its bits from p up sorts the codes and keeps equal ones in place
order, as numpy's sort of the whole number does; either sort gives the same keys in the
same order, and the choice moves only time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

# Bits of a digit at the most: 2^10 counts per pass (8 KB) stay in the first-level cache,
# and so do the 2^10 places being written to; 11-bit digits took 1.7 times as long.
DIGIT_BITS = 10
# The keys both sorts are timed on (`beats_numpy`): 2 MB, pseudo-random codes of a shard's
# width. Smaller than a shard so that timing costs the loading thread ~10 ms, large enough
# that the faster one is the faster on a shard (numpy's lead on the Xeon: 1.45× here, 2.25× there).
TIMED_KEYS = 2**18
TIMED_BITS = 38
TIMINGS = 3


def radix_sort(keys: np.ndarray, scratch: np.ndarray, low_bit: int, high_bit: int) -> np.ndarray:
    """`keys`, non-negative and below 2^high_bit, sorted by their bits from `low_bit` up, stably;
    the result is `keys` or `scratch` (as long as `keys`), whichever the last pass wrote, and
    the other holds no meaning. Run compiled (`compiled.Passes`); as Python in tests."""
    passes = max(0, -(-(high_bit - low_bit) // DIGIT_BITS))
    digit_bits = -(-(high_bit - low_bit) // passes) if passes else 0
    mask = (1 << digit_bits) - 1
    counts = np.zeros((passes, 1 << digit_bits), np.int64)
    for key in keys:
        for step in range(passes):
            counts[step, (key >> (low_bit + step * digit_bits)) & mask] += 1
    source, target = keys, scratch
    for step in range(passes):
        places = counts[step]
        if places.max() == keys.size:
            continue  # every key has the same digit: the order stays
        total = 0
        for digit in range(places.size):
            count = places[digit]
            places[digit] = total
            total += count
        shift = low_bit + step * digit_bits
        for key in source:
            digit = (key >> shift) & mask
            target[places[digit]] = key
            places[digit] += 1
        source, target = target, source
    return source


def beats_numpy(compiled_sort: Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]) -> bool:
    """Whether the compiled radix sort sorts TIMED_KEYS codes faster than numpy's sort on this
    processor: the best of TIMINGS runs of each, taken in turn."""
    keys = _timed_keys()
    scratch = np.empty_like(keys)
    radix = numpy = float("inf")
    for _ in range(TIMINGS):
        radix = min(radix, _seconds(lambda copy: compiled_sort(copy, scratch, 0, TIMED_BITS), keys))
        numpy = min(numpy, _seconds(np.ndarray.sort, keys))
    return radix < numpy


def _timed_keys() -> np.ndarray:
    """TIMED_KEYS codes below 2^TIMED_BITS in a scrambled order (SplitMix64's mixing of
    0, 1, 2, …: no random generator, none is needed to time a sort)."""
    mixed = np.arange(TIMED_KEYS, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    mixed ^= mixed >> np.uint64(29)
    mixed *= np.uint64(0xBF58476D1CE4E5B9)
    return (mixed >> np.uint64(64 - TIMED_BITS)).astype(np.int64)


def _seconds(sort: Callable[[np.ndarray], object], keys: np.ndarray) -> float:
    """The CPU time this thread takes to sort a copy of `keys` in place with `sort`. Not the wall
    time: the sorts are timed while the input is read on every core, and a sort preempted
    meanwhile looked slower (wall time chose the radix sort on the Xeon in 6 of 40 timings with
    three threads sorting beside them, CPU time in none)."""
    copy = keys.copy()
    start = time.thread_time()
    sort(copy)
    return time.thread_time() - start

"""A shard's codes sorted by a least-significant-digit radix sort, compiled with the sorted
path's other passes (`dprun.engines.compiled`).

Written by hand, because numpy's sort of a shard's 2^21 Int64 codes took 113 ms on an AMD
EPYC with AVX-512 (numpy does not use its vectorised sort there) and 24 ms on an Intel Xeon,
where four counting passes of 10-bit digits take 20 ms on either: the codes are short (a
shard's units and the keys, ~40 bits), and every pass streams the array once. The sort is
stable, so codes that agree on the sorted bits stay in their order: sorting `code << p |
place` by its bits from p up sorts the codes and keeps equal ones in place order, as numpy's
sort of the whole number does.
"""

from __future__ import annotations

import numpy as np

# Bits of a digit at the most: 2^10 counts per pass (8 KB) stay in the first-level cache,
# and so do the 2^10 places being written to; 11-bit digits took 1.7 times as long.
DIGIT_BITS = 10


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

"""A shard's units coded densely from their hashes (dprun/engines/distinct_codes.py), compiled
and as Python, against numpy's: hashes of every width, negative ones, repeated, colliding in
their low bits. Seeds come from os.urandom and are part of every assertion message."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from dprun_testing import fresh_seed

from dprun.engines import compiled, distinct_codes

Dense = Callable[[np.ndarray, np.ndarray, np.ndarray], int]


def compiled_dense(hashes: np.ndarray, slots: np.ndarray, codes: np.ndarray) -> int:
    return compiled.compiled_unit_passes().result().dense_codes(hashes, slots, codes)


@pytest.mark.parametrize(("dense", "size"), [pytest.param(distinct_codes.dense_codes, 3_000, id="python"),
                                             pytest.param(compiled_dense, 30_000, id="compiled")])
@pytest.mark.parametrize("bits", [1, 12, 42, 64])
def test_dense_codes_number_the_distinct_hashes_in_order_of_first_sight(dense: Dense, size: int, bits: int) -> None:
    """Hashes drawn from few values or many, with repeats, come out with as many codes as
    np.unique finds values, numbered in the order each value first comes (so equal hashes
    share a code and no two values do), in a table sized for that many. With 42 bits every
    hash is a multiple of 2^20: all start from slot 0 and probe past each other (quadratic,
    so the sizes stay small); with 64 half of them are negative."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    if bits == 64:
        hashes = rng.integers(-2**63, 2**63 - 1, size, dtype=np.int64, endpoint=True)
    else:
        hashes = rng.integers(0, 1 << bits, size, dtype=np.int64)
    if bits == 42:
        hashes <<= 20
    hashes[rng.integers(0, size, size // 3)] = hashes[rng.integers(0, size, size // 3)]
    values, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    number = np.empty(values.size, np.int64)
    number[np.argsort(first)] = np.arange(values.size)
    codes = np.full(size, -1, np.int64)
    assert dense(hashes, distinct_codes.slots_for(values.size), codes) == values.size, f"seed={seed}"
    assert (codes == number[inverse]).all(), f"seed={seed}"


def test_read_only_hashes_are_coded_in_place() -> None:
    """Polars' columns reach the pass as read-only arrays, without a copy."""
    hashes = np.array([5, -3, 5, 0, -3, 9], np.int64)
    hashes.flags.writeable = False
    codes = np.empty(6, np.int64)
    assert compiled_dense(hashes, distinct_codes.slots_for(4), codes) == 4
    assert codes.tolist() == [0, 1, 0, 2, 1, 3]

"""The count of a shard's distinct unit codes (dprun/engines/distinct_codes.py), compiled and as
Python, against numpy's: codes of every width, repeated, colliding in their low bits. Seeds
come from os.urandom and are part of every assertion message."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from dprun_testing import fresh_seed

from dprun.engines import compiled, distinct_codes


def python_count(codes: np.ndarray, slots: np.ndarray) -> int:
    return distinct_codes.count_distinct(codes, slots)


def compiled_count(codes: np.ndarray, slots: np.ndarray) -> int:
    return compiled.compiled_unit_passes().result().count_distinct(codes, slots)


Count = Callable[[np.ndarray, np.ndarray], int]


@pytest.mark.parametrize(("count", "size"), [pytest.param(python_count, 3_000, id="python"),
                                             pytest.param(compiled_count, 30_000, id="compiled")])
@pytest.mark.parametrize("bits", [1, 12, 42, 62])
def test_count_distinct_counts_as_numpy(count: Count, size: int, bits: int) -> None:
    """Codes drawn from few values or many, with repeats, come out counted as np.unique counts
    them, in a table sized for that many (low bits shared by many codes included: multiples
    of 2^20 all start from slot 0, and probe past each other: quadratic, so the sizes stay small)."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << bits, size, dtype=np.int64)
    if bits == 42:
        codes <<= 20
        codes &= (1 << 62) - 1
    codes[rng.integers(0, size, size // 3)] = codes[rng.integers(0, size, size // 3)]
    distinct = np.unique(codes).size
    assert count(codes, distinct_codes.slots_for(distinct)) == distinct, f"seed={seed}"


def test_a_read_only_column_is_counted_in_place() -> None:
    """Polars' columns reach the pass as read-only arrays, without a copy."""
    codes = np.array([5, 3, 5, 0, 3, 9], np.int64)
    codes.flags.writeable = False
    assert compiled_count(codes, distinct_codes.slots_for(4)) == 4

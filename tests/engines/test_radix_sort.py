"""The sorted path's radix sort (dprun/engines/radix_sort.py), compiled and as Python, against
numpy's sort: the same keys in the same order, equal keys in place order where only the bits
above the places are sorted. Seeds come from os.urandom and are part of every assertion message."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
from dprun_testing import fresh_seed

from dprun.engines import compiled, radix_sort


def python_sort(keys: np.ndarray, scratch: np.ndarray, low_bit: int, high_bit: int) -> np.ndarray:
    return radix_sort.radix_sort(keys, scratch, low_bit, high_bit)


def compiled_sort(keys: np.ndarray, scratch: np.ndarray, low_bit: int, high_bit: int) -> np.ndarray:
    return compiled.compiled_passes().result().radix_sort(keys, scratch, low_bit, high_bit)


Sort = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]
SORTS = [pytest.param(python_sort, 2_000, id="python"), pytest.param(compiled_sort, 200_000, id="compiled")]


@pytest.mark.parametrize(("sort", "size"), SORTS)
@pytest.mark.parametrize("bits", [1, 9, 10, 11, 20, 21, 38, 62, 63])
def test_radix_sort_sorts_as_numpy(sort: Sort, size: int, bits: int) -> None:
    """Keys of every width (one digit, several, odd and even numbers of passes, the sign bit's
    neighbour) come out as numpy sorts them, with duplicates."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 1 << bits, size, dtype=np.int64)
    keys[rng.integers(0, size, size // 4)] = keys[rng.integers(0, size, size // 4)]
    found = sort(keys.copy(), np.empty_like(keys), 0, int(keys.max()).bit_length())
    assert np.array_equal(found, np.sort(keys)), f"seed={seed}"


@pytest.mark.parametrize(("sort", "size"), SORTS)
@pytest.mark.parametrize("code_bits", [3, 17, 40])
def test_radix_sort_keeps_equal_codes_in_place_order(sort: Sort, size: int, code_bits: int) -> None:
    """Sorting `code << p | place` by its bits from p up is numpy's sort of the whole numbers:
    the places of equal codes stay in order, though the sort never looks at them."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << code_bits, size, dtype=np.int64) // 7
    place_bits = (size - 1).bit_length()
    keyed = codes << place_bits | np.arange(size, dtype=np.int64)
    found = sort(keyed.copy(), np.empty_like(keyed), place_bits, int(keyed.max()).bit_length())
    assert np.array_equal(found, np.sort(keyed)), f"seed={seed}"


@pytest.mark.parametrize(("sort", "size"), SORTS)
def test_radix_sort_of_no_keys_one_key_and_equal_keys(sort: Sort, size: int) -> None:
    """Nothing to sort, one key and all keys equal (every pass skipped) come back as they were."""
    for keys in [np.zeros(0, np.int64), np.array([5], np.int64), np.full(size, 3 << 30, np.int64)]:
        found = sort(keys.copy(), np.empty_like(keys), 0, int(keys.max()).bit_length() if keys.size else 0)
        assert np.array_equal(found, keys), keys[:3]


def slow_sort(keys: np.ndarray, scratch: np.ndarray, low_bit: int, high_bit: int) -> np.ndarray:
    """numpy's sort of the keys, then five more of them sorted: never faster than numpy's sort once."""
    for _ in range(3):
        keys.sort()
        keys[::-1].sort()
    return keys


def no_sort(keys: np.ndarray, scratch: np.ndarray, low_bit: int, high_bit: int) -> np.ndarray:
    return keys


@pytest.mark.parametrize(("sort", "beats"), [(slow_sort, False), (no_sort, True)])
def test_the_faster_sort_is_chosen(sort: Sort, beats: bool) -> None:
    assert radix_sort.beats_numpy(sort) is beats


def test_the_sorts_are_timed_by_their_own_cpu_time() -> None:
    """A sort that waits 50 ms (a thread preempted by the readers on every core) costs its
    thread no CPU time: it beats numpy's sort, which a wall clock would deny it."""
    def waiting_sort(keys: np.ndarray, scratch: np.ndarray, low_bit: int, high_bit: int) -> np.ndarray:
        time.sleep(0.05)
        return keys

    assert radix_sort.beats_numpy(waiting_sort)


def test_timed_keys_are_codes_of_a_shard_in_no_order() -> None:
    keys = radix_sort._timed_keys()
    assert keys.size == radix_sort.TIMED_KEYS
    assert keys.min() >= 0 and int(keys.max()).bit_length() == radix_sort.TIMED_BITS
    assert np.unique(keys).size > 0.99 * keys.size, "nearly all distinct"
    assert 0.45 < (np.diff(keys) > 0).mean() < 0.55, "as many rises as falls: not sorted, not reversed"

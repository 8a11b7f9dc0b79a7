"""The compiled passes of the sorted path, loaded by numba for large inputs.

Loops written by hand where numpy needs a dozen passes over a shard, or is slow on some
processors (each module says why): the light units' totals (`light_units.add_light_units`), a
value column's units summed per pair (`pair_units`), the shard's codes sorted
(`radix_sort`), its rows' key codes found by their hashes (`key_hashes`) and its distinct
unit codes counted (`distinct_codes`). numba compiles them (a wheel from the package
registry, no compiler on the user's machine) for explicit signatures and caches the machine
code on disk, so a machine compiles them once; compiled, they release the GIL and each
worker thread bounds its own shard. Loading them still costs
about 0.5 s of one core (numba's import, then its code generator's), so only inputs of
COMPILED_FROM_ROWS rows use them, loaded in a thread while the shards are read; smaller
ones take numpy's and Polars' passes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from dprun.engines import distinct_codes, key_hashes, light_units, pair_units, radix_sort

# Rows of a query's input from which its shards are bounded by the compiled passes: there the
# light units' loop alone saves ~40 ns per pair, several times the 0.4 s their loading costs.
COMPILED_FROM_ROWS = 2**23
# The one signature the light units' loop is compiled for: all arrays C-contiguous.
LIGHT_UNITS = "int64(int64[::1], int64, int64, int64[::1], int64[:, ::1], int64[:, ::1], int64[::1])"
RADIX_SORT = "int64[::1](int64[::1], int64[::1], int64, int64)"
FILL_KEY_SLOTS = "void(int64[::1], int64[:, ::1], int64)"

LightUnits = Callable[[np.ndarray, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]
UnitSums = Callable[[np.ndarray, np.ndarray, np.ndarray, float, float, float, float, float, float, bool], np.ndarray]
RadixSort = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]
FillKeySlots = Callable[[np.ndarray, np.ndarray, int], None]
FindKeyCodes = Callable[[np.ndarray, np.ndarray, np.ndarray, int], int]
CountDistinct = Callable[[np.ndarray, np.ndarray], int]


@dataclass(frozen=True)
class Passes:
    """The compiled `light_units.add_light_units`, `pair_units.pair_unit_sums`, `radix_sort.radix_sort`,
    `key_hashes.fill_slots` and `find_codes`, and `distinct_codes.count_distinct`."""

    add_light_units: LightUnits
    pair_unit_sums: UnitSums
    radix_sort: RadixSort
    fill_key_slots: FillKeySlots
    find_key_codes: FindKeyCodes
    count_distinct: CountDistinct


_starting = threading.Lock()


def compiled_passes() -> Future[Passes]:
    """The compiled passes, loaded (or compiled) in a thread started by the first call in the
    process. Compiled code checks no index and wraps on overflow: the callers make sure
    neither can happen."""
    with _starting:
        return _loading()


@functools.cache
def _loading() -> Future[Passes]:
    future: Future[Passes] = Future()
    # Not a daemon: a run that fails before its workers wait for the passes (a bad row read)
    # exits once the thread is done, never while it is inside LLVM's code generator.
    threading.Thread(target=_compile, args=(future,), name="dprun-compile").start()
    return future


def _compile(future: Future[Passes]) -> None:
    try:
        import numba  # here: only inputs of COMPILED_FROM_ROWS rows pay its import

        def compiled(signatures: list[Any], function: Callable[..., object]) -> Callable[..., object]:
            try:
                return numba.njit(signatures, nogil=True, cache=True)(function)
            except RuntimeError:
                # No writable folder for numba's cache (a read-only installation and home): compile for this run.
                return numba.njit(signatures, nogil=True)(function)

        signatures = _signatures()
        future.set_result(Passes(
            compiled([LIGHT_UNITS], light_units.add_light_units),  # type: ignore[arg-type]
            compiled(signatures["pair_unit_sums"], pair_units.pair_unit_sums),  # type: ignore[arg-type]
            compiled([RADIX_SORT], radix_sort.radix_sort),  # type: ignore[arg-type]
            compiled([FILL_KEY_SLOTS], key_hashes.fill_slots),  # type: ignore[arg-type]
            compiled(signatures["find_key_codes"], key_hashes.find_codes),  # type: ignore[arg-type]
            compiled(signatures["count_distinct"], distinct_codes.count_distinct)))  # type: ignore[arg-type]
    except Exception as error:  # raised again in the worker that waits for the passes
        future.set_exception(error)


def _with_read_only(dtype: Any, signature: Callable[[Any], Any]) -> list[Any]:
    """`signature` of one C-contiguous 1-d `dtype` array, writable and read-only (numpy views
    Polars' memory without a copy where it can), which numba's signature strings cannot say."""
    from numba import types

    return [signature(types.Array(dtype, 1, "C", readonly=readonly)) for readonly in (False, True)]


def _signatures() -> dict[str, list[Any]]:
    """The signatures of the passes that take a column of Polars' memory (all arrays C-contiguous)."""
    from numba import types

    index = types.Array(types.int64, 1, "C")
    slots = types.Array(types.int64, 2, "C")
    return {
        # The value column.
        "pair_unit_sums": _with_read_only(
            types.float64, lambda values: index(values, index, index, *[types.float64] * 6, types.boolean)),
        # The rows' key hashes.
        "find_key_codes": _with_read_only(
            types.int64, lambda hashes: types.int64(slots, hashes, index, types.int64)),
        # The rows' unit codes.
        "count_distinct": _with_read_only(types.int64, lambda codes: types.int64(codes, index)),
    }

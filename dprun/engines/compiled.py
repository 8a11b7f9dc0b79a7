"""The compiled passes of the sorted path, loaded by numba for large inputs.

Loops written by hand where numpy needs a dozen passes over a shard, or is slow on some
processors (each module says why): the light units' totals (`light_units.add_light_units`, from
the sorted rows `add_light_rows`, and from rows in unit order `add_light_runs`), the heavy
units' kept pairs' totals (`ranked_pairs`), a value column's units summed per pair
(`pair_units`) and the shard's codes sorted (`radix_sort`, where it beats numpy's sort on the
processor) are `Passes`; a shard's rows' key codes found by their hashes (`key_hashes`) and its
distinct units coded densely (`distinct_codes`) are `UnitPasses`, loaded apart and only for
units coded per shard (`codes.ShardUnits`), so other queries do not pay for them; so is the
pass that gathers rows into shards in memory (`shard_scatter.group_by_shard`).
numba compiles them (a wheel from the package registry, no compiler on the user's machine)
for explicit signatures and caches the machine code on disk, so a machine compiles them once;
compiled, they release the GIL and each worker thread bounds its own shard. Loading `Passes`
still costs about 0.5 s of one core (numba's import, then its code generator's), so only inputs
of COMPILED_FROM_ROWS rows use them, loaded in a thread while the shards are read; smaller ones
take numpy's and Polars' passes.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from dprun.engines import (distinct_codes, key_hashes, light_units, pair_units, radix_sort, ranked_pairs,
                           shard_scatter)
from dprun.engines.prefetch import register_hints
from dprun.jit import njit_cached

# Rows of a query's input from which its shards are bounded by the compiled passes: there the
# light units' loop alone saves ~40 ns per pair, several times the 0.4 s their loading costs.
COMPILED_FROM_ROWS = 2**23
# The one signature the light units' loop is compiled for: all arrays C-contiguous.
LIGHT_UNITS = "int64(int64[::1], int64, int64, int64[::1], int64[:, ::1], int64[:, ::1], int64[::1])"
RADIX_SORT = "int64[::1](int64[::1], int64[::1], int64, int64)"
FILL_KEY_SLOTS = "void(int64[::1], int64[:, ::1], int64)"

LightUnits = Callable[[np.ndarray, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]
LightRows = Callable[[np.ndarray, np.ndarray, int, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                      np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]
LightRuns = Callable[[np.ndarray, int, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                     np.ndarray], int]
UnitSums = Callable[[np.ndarray, np.ndarray, np.ndarray, float, float, float, float, float, float, bool], np.ndarray]
RadixSort = Callable[[np.ndarray, np.ndarray, int, int], np.ndarray]
FillKeySlots = Callable[[np.ndarray, np.ndarray, int], None]
FindKeyCodes = Callable[[np.ndarray, np.ndarray, np.ndarray, int], int]
DenseCodes = Callable[[np.ndarray, np.ndarray, np.ndarray], int]
GroupByShard = Callable[[np.ndarray, int, int, int, int, np.ndarray, np.ndarray], None]
RankedPairs = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, np.ndarray], None]
Compile = Callable[[list[Any], Callable[..., object]], Any]
R = TypeVar("R")


@dataclass(frozen=True)
class Passes:
    """The compiled `light_units.add_light_units`, `add_light_rows` and `add_light_runs`,
    `ranked_pairs.add_ranked_pairs`, `pair_units.pair_unit_sums` and `radix_sort.radix_sort`,
    and whether the radix sort is faster than numpy's on this processor (`radix_sort.beats_numpy`)."""

    add_light_units: LightUnits
    add_light_rows: LightRows
    add_light_runs: LightRuns
    add_ranked_pairs: RankedPairs
    pair_unit_sums: UnitSums
    radix_sort: RadixSort
    radix_beats_numpy: bool


@dataclass(frozen=True)
class UnitPasses:
    """The compiled passes of units coded per shard (`codes.ShardUnits`): `key_hashes.fill_slots`
    and `find_codes`, and `distinct_codes.dense_codes`. Loaded apart, by queries with such
    units only: each pass adds ~0.1 s of one core to the loading."""

    fill_key_slots: FillKeySlots
    find_key_codes: FindKeyCodes
    dense_codes: DenseCodes


_starting = threading.Lock()


def compiled_passes() -> Future[Passes]:
    """The compiled passes, loaded (or compiled) in a thread started by the first call in the
    process. Compiled code checks no index and wraps on overflow: the callers make sure
    neither can happen."""
    with _starting:
        return _loading(_passes)


def compiled_unit_passes() -> Future[UnitPasses]:
    """The compiled passes of units coded per shard, as `compiled_passes` loads its own."""
    with _starting:
        return _loading(_unit_passes)


def compiled_scatter() -> Future[GroupByShard]:
    """The compiled `shard_scatter.group_by_shard`, as `compiled_passes` loads its own."""
    with _starting:
        return _loading(_scatter)


@functools.cache
def _loading(load: Callable[[Compile], R]) -> Future[R]:
    future: Future[R] = Future()
    # Not a daemon: a run that fails before its workers wait for the passes (a bad row read)
    # exits once the thread is done, never while it is inside LLVM's code generator.
    threading.Thread(target=_compile, args=(load, future), name="dprun-compile").start()
    return future


def _compile(load: Callable[[Compile], R], future: Future[R]) -> None:
    try:
        future.set_result(load(njit_cached))  # numba's import is in here: only inputs of COMPILED_FROM_ROWS rows pay it
    except Exception as error:  # raised again in the worker that waits for the passes
        future.set_exception(error)


def _passes(compiled: Compile) -> Passes:
    light_units.compile_helpers()
    sort = compiled([RADIX_SORT], radix_sort.radix_sort)
    return Passes(compiled([LIGHT_UNITS], light_units.add_light_units),
                  compiled(_with_read_only("float64", _light_rows_signature, dimensions=2),
                           light_units.add_light_rows),
                  compiled([_light_runs_signature()], light_units.add_light_runs),
                  compiled([_ranked_pairs_signature()], ranked_pairs.add_ranked_pairs),
                  compiled(_with_read_only("float64", _unit_sums_signature), pair_units.pair_unit_sums),
                  sort, radix_sort.beats_numpy(sort))


def _unit_passes(compiled: Compile) -> UnitPasses:
    register_hints()
    return UnitPasses(compiled([FILL_KEY_SLOTS], key_hashes.fill_slots),
                      compiled(_with_read_only("int64", _key_codes_signature), key_hashes.find_codes),
                      compiled(_with_read_only("int64", _dense_codes_signature), distinct_codes.dense_codes))


def _scatter(compiled: Compile) -> GroupByShard:
    from numba import types

    codes = types.Array(types.int64, 1, "C")
    return compiled([types.void(types.Array(types.int64, 1, "C", readonly=True), *[types.int64] * 4, codes, codes)],
                    shard_scatter.group_by_shard)


def _with_read_only(dtype: str, signature: Callable[[Any], Any], dimensions: int = 1) -> list[Any]:
    """`signature` of one C-contiguous array of numba's type `dtype`, writable and read-only
    (numpy views Polars' memory without a copy where it can), which numba's signature strings
    cannot say."""
    from numba import types

    return [signature(types.Array(getattr(types, dtype), dimensions, "C", readonly=readonly))
            for readonly in (False, True)]


def _unit_sums_signature(values: Any) -> Any:
    """The value pass's signature for this value column (all arrays C-contiguous)."""
    from numba import types

    index = types.Array(types.int64, 1, "C")
    return index(values, index, index, *[types.float64] * 6, types.boolean)


def _light_rows_signature(values: Any) -> Any:
    """`light_units.add_light_rows`' signature for these value columns (all arrays C-contiguous)."""
    from numba import types

    index, matrix = types.Array(types.int64, 1, "C"), types.Array(types.int64, 2, "C")
    return types.int64(index, index, types.int64, types.int64, types.int64, values, matrix,
                       types.Array(types.float64, 2, "C"), index, matrix, index, index, matrix)


def _light_runs_signature() -> Any:
    """`light_units.add_light_runs`' signature. Its inputs are typed read-only: writable arrays
    (a shard's own copies) are passed to it as well, without a second signature."""
    from numba import types

    def array(dtype: Any, dimensions: int, readonly: bool) -> Any:
        return types.Array(dtype, dimensions, "C", readonly=readonly)

    return types.int64(array(types.int64, 1, True), types.int64, types.int64, types.int64,
                       array(types.float64, 2, True), array(types.int64, 2, True), array(types.float64, 2, True),
                       array(types.int64, 1, True), array(types.int64, 2, False), array(types.int64, 1, False))


def _ranked_pairs_signature() -> Any:
    """`ranked_pairs.add_ranked_pairs`' signature, its inputs typed read-only (as `_light_runs_signature`)."""
    from numba import types

    def read_only(dtype: Any, dimensions: int) -> Any:
        return types.Array(dtype, dimensions, "C", readonly=True)

    return types.void(read_only(types.int64, 1), read_only(types.int64, 1), read_only(types.int64, 2),
                      read_only(types.boolean, 1), types.int64, types.Array(types.int64, 2, "C"))


def _key_codes_signature(hashes: Any) -> Any:
    """`key_hashes.find_codes`'s signature for these rows' hashes."""
    from numba import types

    return types.int64(types.Array(types.int64, 2, "C"), hashes, types.Array(types.int64, 1, "C"), types.int64)


def _dense_codes_signature(hashes: Any) -> Any:
    """`distinct_codes.dense_codes`'s signature for these units' hashes."""
    from numba import types

    return types.int64(hashes, types.Array(types.int64, 2, "C"), types.Array(types.int64, 1, "C"))

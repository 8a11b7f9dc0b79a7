"""Contribution bounding by sorting packed integer codes: the Polars engine's fast path.

When the privacy unit is one integer column and the partition key is one integer column
(or there is no group_by), each row's (unit, partition) pair packs into one Int64:
(unit − min) · 2^b + (key − min). Sorting that one column puts every unit's rows next to
each other and every pair's rows next to each other, so per-partition bounding and the
count of each unit's partitions are runs in a sorted array — an order of magnitude
cheaper than a hash group-by over ~10^8 distinct pairs, which is what the general path
(`polars_engine.HashBounding`) does.

Only units with more than L0 partitions ("heavy" units, usually a small share of the
rows) need a random choice of partitions and, after private partition selection, Plume's
second bounding; their pairs are kept in temporary files. Every other unit keeps all its
partitions in both boundings, so its pairs are summed per partition straight away.

The result is the same as the general path's, step for step: the same scaled partials
(`polars_steps.scaled_partial`) and the same keyed hash of (unit, partition) to choose a
heavy unit's partitions, so under the test seed both paths release identical tables.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from queue import SimpleQueue
from typing import Any, BinaryIO, TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from dprun.engines.polars_steps import GLOBAL_KEY, UNITS, collect, row_units, scaled_partial, sink
from dprun.errors import DataError
from dprun.malloc_tuning import keep_freed_memory
from dprun.mechanisms.quantities import Quantity
from dprun.plan import QueryPlan
from dprun.spec.input_schema import InputInfo, scan

PACKED = "__dprun_packed__"
SHARD = "__dprun_shard__"
ROWS = "__dprun_rows__"
R = TypeVar("R")
A = TypeVar("A")
# Rows sorted in memory at once: ~8 bytes per row and per value column. A shard's arrays
# (16 MB per column) stay below glibc's mmap threshold (`keep_freed_memory`), so they are
# reused from the heap: at 2^22 rows half the shards' arrays were mapped afresh, page by
# page, and the bounding spent twice the kernel time.
SHARD_ROWS = 2**21
# Per-partition totals are kept in dense arrays indexed by the key's code.
MAX_KEY_CODES = 2**22
# Shards bounded at once (`_in_parallel`): one per Polars thread, at most 8 (each holds
# about 100 MB at SHARD_ROWS), at least 2 so that one shard is bounded while another is read.
WORKERS = max(2, min(8, pl.thread_pool_size()))
PACKED_BITS = 62


@dataclass(frozen=True)
class Codes:
    """How a row's (unit, key) packs into one Int64 below 2^62: unit code above `key_bits`, key code below.

    Key codes 0 .. key_span−1 stand for key_min .. key_min+key_span−1; code key_span is a null key.
    """

    unit: str
    unit_min: int
    unit_max: int
    unit_dtype: pl.DataType
    key: str
    key_min: int
    key_span: int
    key_dtype: pl.DataType
    key_bits: int
    rows: int

    @property
    def key_codes(self) -> int:
        return self.key_span + 1

    def packed(self) -> pl.Expr:
        """The packed code, null for a row outside the ranges (`SortedBounding` then fails the run)."""
        within = pl.col(self.unit).is_between(self.unit_min, self.unit_max) & (
            pl.col(self.key).is_null() | pl.col(self.key).is_between(self.key_min, self.key_min + self.key_span - 1))
        code = (_offset(self.unit, self.unit_min, self.unit_dtype) * (1 << self.key_bits)
                + _offset(self.key, self.key_min, self.key_dtype).fill_null(self.key_span))
        return pl.when(within).then(code).alias(PACKED)

    def key_values(self, codes: np.ndarray) -> pl.Series:
        nulls = codes == self.key_span
        # The null code may lie past the key type's range (Int8 keys up to 127): it is decoded as 0, then nulled.
        values = _values(self.key, np.where(nulls, 0, codes), self.key_min, self.key_dtype)
        return values.scatter(np.flatnonzero(nulls), None) if nulls.any() else values

    def key_codes_of(self, keys: pl.DataFrame) -> np.ndarray:
        codes = (pl.col(self.key).cast(pl.Int128) - pl.lit(self.key_min, dtype=pl.Int128)).fill_null(self.key_span)
        return keys.select(codes.cast(pl.Int64)).to_series().to_numpy()

    def unit_values(self, codes: np.ndarray) -> pl.Series:
        return _values(self.unit, codes, self.unit_min, self.unit_dtype)


def _offset(column: str, minimum: int, dtype: pl.DataType) -> pl.Expr:
    """column − minimum as Int64: exact for a row within the ranges (offsets below 2^62); for
    any other row it wraps around, and `Codes.packed` nulls it.

    Int64 throughout, not UInt64: Polars' checked cast to UInt64 cost a tenth of the sink.
    """
    if dtype == pl.UInt64:
        return (pl.col(column) - pl.lit(minimum, dtype=pl.UInt64)).cast(pl.Int64, wrap_numerical=True)
    return pl.col(column).cast(pl.Int64) - pl.lit(minimum, dtype=pl.Int64)


def _values(name: str, codes: np.ndarray, minimum: int, dtype: pl.DataType) -> pl.Series:
    """minimum + codes in the column's type; codes stay within the column's range, so no overflow."""
    wide = np.uint64 if dtype == pl.UInt64 else np.int64
    return pl.Series(name, codes.astype(wide) + wide(minimum)).cast(dtype)


def packable(plan: QueryPlan, schema: dict[str, pl.DataType], key: str) -> bool:
    """Whether the plan's columns allow packing, from the schema alone."""
    if len(plan.privacy_unit) != 1 or len(plan.group_by) > 1:
        return False
    if any(q.quantity.is_quantile for q in plan.quantities):
        return False
    return all(column in schema and schema[column].is_integer() for column in (plan.privacy_unit[0], key))


def codes_for(rows: pl.LazyFrame, unit: str, key: str, info: InputInfo, fan_out: int = 1) -> Codes | None:
    """The packing of this input's (unit, key), or None if its ranges do not fit in 62 bits.

    The ranges come from the Parquet footers' statistics where every row group has them (and,
    for a key a public lookup adds, from the lookup), else from one streaming pass over the two
    columns. `fan_out` bounds the rows a join makes of one row of the input. The ranges
    decide how rows are packed and sharded, never what is released; a row outside them fails
    the run (`Codes.packed`).
    """
    schema = rows.collect_schema()
    ranges = _footer_ranges(info, unit, key, fan_out) or _scanned_ranges(rows, unit, key)
    (unit_min, unit_max), (key_min, key_max), count = ranges[unit], ranges[key], ranges["rows"]
    key_span = key_max - key_min + 1
    key_bits = key_span.bit_length()
    unit_bits = (unit_max - unit_min).bit_length()
    if key_span + 1 > MAX_KEY_CODES or unit_bits + key_bits > PACKED_BITS:
        return None
    return Codes(unit, unit_min, unit_max, schema[unit], key, key_min, key_span, schema[key], key_bits, count)


Ranges = dict[str, Any]


def _scanned_ranges(rows: pl.LazyFrame, unit: str, key: str) -> Ranges:
    stats = collect(rows.select(
        pl.len().alias("rows"), pl.col(unit).min().alias("unit_min"), pl.col(unit).max().alias("unit_max"),
        pl.col(key).min().alias("key_min"), pl.col(key).max().alias("key_max"),
    )).row(0, named=True)
    return {
        "rows": stats["rows"],
        unit: (0, 0) if stats["unit_min"] is None else (int(stats["unit_min"]), int(stats["unit_max"])),
        key: (0, 0) if stats["key_min"] is None else (int(stats["key_min"]), int(stats["key_max"])),
    }


def _footer_ranges(info: InputInfo, unit: str, key: str, fan_out: int) -> Ranges | None:
    """Row count and column ranges from Parquet footers and public lookups alone (filters only
    narrow them). A join keeps a subset of its first input's units, and takes a key from the
    input that holds the column; a lookup's key range is read from the (public) lookup."""
    if key == GLOBAL_KEY:  # the global partition: one key, 0
        found = _parquet_ranges(info, [unit])
        return None if found is None else found | {key: (0, 0), "rows": found["rows"] * fan_out}
    if key not in info.joined_schema:  # derived by the query
        return None
    holder = next((j for j in info.joins if key in j.info.schema and key not in j.on), None)
    if holder is None:
        found = _parquet_ranges(info, [unit, key])
    else:
        own = _parquet_ranges(info, [unit])
        other = _parquet_ranges(holder.info, [key]) or (_scanned_range(holder.info, key) if holder.public else None)
        found = None if own is None or other is None else own | {key: other[key]}
    return None if found is None else found | {"rows": found["rows"] * fan_out}


def _scanned_range(lookup: InputInfo, key: str) -> Ranges:
    """A public lookup's range of `key`, read from its (small, public) file."""
    low, high = collect(scan(lookup).select(pl.col(key).min().alias("low"), pl.col(key).max().alias("high"))).row(0)
    return {key: (0, 0) if low is None else (int(low), int(high))}


def _parquet_ranges(info: InputInfo, columns: list[str]) -> Ranges | None:
    """Row count and each column's (min, max) over every row group of a Parquet input, or None
    where a footer lacks them (CSV, a derived column, a row group without statistics)."""
    if info.format != "parquet":
        return None
    found: Ranges = {"rows": 0}
    for path in info.paths:
        metadata = pq.ParquetFile(path).metadata
        names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
        for group in (metadata.row_group(i) for i in range(metadata.num_row_groups)):
            found["rows"] += group.num_rows
            for column in columns:
                stats = group.column(names.index(column)).statistics if column in names else None
                if stats is None or not stats.has_min_max:
                    return None
                low, high = found.get(column, (stats.min, stats.max))
                found[column] = (min(low, int(stats.min)), max(high, int(stats.max)))
    return found if all(column in found for column in columns) else None


@dataclass
class _Totals:
    """Per key code: privacy units, and each quantity's exact sum of partials."""

    units: np.ndarray
    sums: dict[str, _ExactSums]

    @classmethod
    def zeros(cls, size: int, quantity_ids: list[str]) -> _Totals:
        return cls(np.zeros(size, np.int64), {qid: _ExactSums(size) for qid in quantity_ids})

    def add(self, keys: np.ndarray, partials: dict[str, np.ndarray], sign: int = 1) -> None:
        """Add (or with sign −1, take away) these pairs."""
        pairs = np.bincount(keys, minlength=self.units.size)
        if sign < 0:
            np.negative(pairs, out=pairs)
        self.units += pairs
        for qid, values in partials.items():
            self.sums[qid].add(keys, values, pairs, sign)

    def merge(self, other: _Totals) -> None:
        self.units += other.units
        for qid, sums in other.sums.items():
            self.sums[qid].merge(sums)

    def column(self, qid: str, rows: np.ndarray) -> pl.Series:
        return self.sums[qid].total().gather(rows).alias(qid)


@dataclass(frozen=True)
class _WorkerTotals:
    """A worker's running totals: light units, and heavy units' first bounding."""

    light: _Totals
    first_heavy: _Totals

    @classmethod
    def zeros(cls, size: int, quantity_ids: list[str]) -> _WorkerTotals:
        return cls(_Totals.zeros(size, quantity_ids), _Totals.zeros(size, quantity_ids))

    def merge(self, other: _WorkerTotals) -> None:
        self.light.merge(other.light)
        self.first_heavy.merge(other.first_heavy)


class _ExactSums:
    """Σ of int64 values per key code, exact, at np.bincount's speed (a hash group-by is several times slower).

    Sums stay in int64 while a bound on them (`reach`, the sum of |values| added) proves they
    fit, and are carried into Int128 beyond; np.bincount adds in float64, so it is used only
    where every partial sum stays below 2^53 (else `_exact_bincount` splits the values).
    """

    def __init__(self, size: int) -> None:
        self.small = np.zeros(size, np.int64)
        self.reach = 0
        self.wide: pl.Series | None = None

    def add(self, keys: np.ndarray, values: np.ndarray, pairs: np.ndarray, sign: int) -> None:
        """Add (or with sign −1, take away) each value to its key's sum; `pairs` is sign · np.bincount(keys)."""
        if values.size == 0:
            return
        low, high = int(values.min()), int(values.max())
        reach = max(-low, high) * values.size
        if reach >= 2**53:
            self._add_wide(_exact_bincount(keys, values if sign > 0 else -values, self.small.size))
        elif low == high == 1:
            # A partial of one row per pair (e.g. a count with max_contributions_per_partition 1) sums to the pair count.
            self._add_small(pairs, reach)
        else:
            sums = np.bincount(keys, weights=values.astype(np.float64), minlength=self.small.size).astype(np.int64)
            if sign < 0:
                np.negative(sums, out=sums)
            self._add_small(sums, reach)

    def merge(self, other: _ExactSums) -> None:
        self._add_small(other.small, other.reach)
        if other.wide is not None:
            self._add_wide(other.wide)

    def total(self) -> pl.Series:
        small = pl.Series(self.small).cast(pl.Int128)
        return small if self.wide is None else small + self.wide

    def _add_small(self, sums: np.ndarray, reach: int) -> None:
        if self.reach + reach >= 2**63:
            self._add_wide(pl.Series(self.small).cast(pl.Int128))
            self.small, self.reach = np.zeros_like(self.small), 0
        self.small += sums
        self.reach += reach

    def _add_wide(self, sums: pl.Series) -> None:
        self.wide = sums if self.wide is None else self.wide + sums


def _exact_bincount(keys: np.ndarray, values: np.ndarray, size: int) -> pl.Series:
    """Σ values per key, exactly, for values whose sums may pass 2^53.

    np.bincount adds in float64, exact below 2^53: the values are cut into parts of
    `bits` bits such that n parts of that size cannot reach 2^53, and recombined in Int128.
    """
    bits = 52 - int(values.size).bit_length()
    limit = 1 << bits
    total = pl.lit(0, dtype=pl.Int128)
    rest, shift = values.astype(np.int64), 0
    while True:
        last = rest.size == 0 or (int(rest.min()) > -limit and int(rest.max()) < limit)
        part = rest if last else rest & (limit - 1)
        sums = np.rint(np.bincount(keys, weights=part.astype(np.float64), minlength=size)).astype(np.int64)
        total = total + pl.lit(pl.Series(sums)).cast(pl.Int128) * pl.lit(1 << shift, dtype=pl.Int128)
        if last:
            return pl.select(total).to_series()
        rest, shift = rest >> bits, shift + bits


class SortedBounding:
    """Both contribution boundings of one query, computed shard by shard on packed codes."""

    def __init__(self, plan: QueryPlan, rows: pl.LazyFrame, codes: Codes, seed: int, workdir: Path) -> None:
        self.plan = plan
        self.codes = codes
        self.seed = seed
        self.quantities = [q.quantity for q in plan.quantities if q.quantity.aggregate != "privacy_units"]
        self.value_columns = sorted({q.column for q in self.quantities if q.column is not None})
        ids = [q.id for q in self.quantities]
        self.chosen: np.ndarray | None = None
        self.rebound = False
        keep_freed_memory()
        # Value columns go to the shards as they are; their integer units are computed per
        # shard (`_row_values`): one Float64 per row instead of one Int64 per quantity.
        frame = rows.select(codes.packed(), *self.value_columns)
        loads = _shards(frame, codes, seed, workdir)
        work = [partial(self._bound_shard, load, workdir / f"heavy-{index}.arrow") for index, load in enumerate(loads)]
        heavy_files, (totals, *others) = _in_parallel_into(work, partial(_WorkerTotals.zeros, codes.key_codes, ids))
        for other in others:
            totals.merge(other)
        self.light, self.first_heavy = totals.light, totals.first_heavy
        self.heavy_files = [heavy_file for heavy_file in heavy_files if heavy_file is not None]

    def _row_values(self, shard: pl.DataFrame) -> pl.DataFrame:
        """A shard's packed codes, each value column's non-null flag, each value quantity's units."""
        if not self.value_columns:
            return shard
        present = [pl.col(c).is_not_null().cast(pl.Int32).alias(_present(c)) for c in self.value_columns]
        values = [row_units(q).fill_null(0).alias(q.id) for q in self.quantities if q.aggregate != "rows"]
        return shard.select(PACKED, *present, *values)

    def _bound_shard(self, load: Callable[[], pl.DataFrame], heavy_file: Path, totals: _WorkerTotals) -> Path | None:
        """Adds a shard's light units, and its heavy units' first bounding, to `totals`; its
        heavy units' pairs, ranked, go to `heavy_file`, which is returned (None if the shard
        has no heavy unit)."""
        pairs = _pair_sums(self._row_values(load()))
        pair_packed = pairs.pop(PACKED)
        partials = {q.id: self._partial(q, pairs) for q in self.quantities}
        del pairs
        unit_code = pair_packed >> self.codes.key_bits
        key_code = pair_packed & ((1 << self.codes.key_bits) - 1)
        user_starts, per_unit = _runs(unit_code)
        is_heavy = per_unit > self.plan.max_partitions
        # Light units' totals: all pairs', less the heavy units' (a small share).
        totals.light.add(key_code, partials)
        heavy = _run_members(user_starts, per_unit, is_heavy)
        heavy_partials = {qid: values[heavy] for qid, values in partials.items()}
        totals.light.add(key_code[heavy], heavy_partials, sign=-1)
        ranked = self._ranked_heavy(unit_code[heavy], key_code[heavy], heavy_partials)
        self._add_kept(totals.first_heavy, ranked, None)
        if ranked.height == 0:
            return None
        ranked.write_ipc(heavy_file, compression="uncompressed")
        return heavy_file

    def _partial(self, quantity: Quantity, pairs: dict[str, np.ndarray]) -> np.ndarray:
        """Each pair's partial, bounded to max_rows rows' worth, exactly as the general path."""
        m = self.plan.max_rows
        present = pairs[ROWS if quantity.column is None else _present(quantity.column)]
        if quantity.aggregate == "rows":
            return np.minimum(present, m)
        total = pairs[quantity.id]
        over = present > m
        if not over.any():
            return total
        scaled = pl.select(scaled_partial(pl.lit(pl.Series(total[over])).cast(pl.Int128),
                                          pl.lit(pl.Series(present[over])), m)).to_series()
        result = total.copy()
        result[over] = scaled.cast(pl.Int64).to_numpy()
        return result

    def _ranked_heavy(self, unit_code: np.ndarray, key_code: np.ndarray, partials: dict[str, np.ndarray]) -> pl.DataFrame:
        """A heavy unit's pairs in the order of the keyed hash of (unit, partition) that chooses them."""
        codes = self.codes
        frame = pl.DataFrame({codes.unit: codes.unit_values(unit_code), codes.key: codes.key_values(key_code)})
        hashes = frame.select(pl.struct(codes.unit, codes.key).hash(self.seed))[:, 0].to_numpy()
        # One UInt64 sort key: the unit's index among these units on top, the hash's top bits
        # below (a two-column sort costs several times more). Equal keys keep their order, like
        # the general path's ordinal rank; whatever the order, each unit keeps at most L0 pairs.
        starts, lengths = _runs(unit_code)
        index = np.repeat(np.arange(starts.size, dtype=np.uint64), lengths)
        bits = max(1, starts.size.bit_length())
        order = np.argsort((index << np.uint64(64 - bits)) | (hashes >> np.uint64(bits)), kind="stable")
        return pl.DataFrame({"unit": unit_code[order], "key": key_code[order],
                             **{qid: values[order] for qid, values in partials.items()}})

    def _add_kept(self, totals: _Totals, ranked: pl.DataFrame, chosen: np.ndarray | None) -> None:
        """Add to `totals` the ranked heavy pairs each unit keeps: its L0 first-ranked pairs,
        among the chosen keys only if given (Plume's second bounding)."""
        if ranked.height == 0:
            return
        keys = ranked["key"].to_numpy()
        candidates = np.flatnonzero(chosen[keys]) if chosen is not None else np.arange(ranked.height)
        kept = candidates[_rank_within_runs(ranked["unit"].to_numpy()[candidates]) < self.plan.max_partitions]
        totals.add(keys[kept], {q.id: ranked[q.id].to_numpy()[kept] for q in self.quantities})

    def _rebound_heavy(self) -> _Totals:
        """Plume's second bounding of the heavy units, among the chosen keys."""
        work = [partial(self._add_kept_from, path) for path in self.heavy_files]
        _, (totals, *others) = _in_parallel_into(work, partial(_Totals.zeros, self.codes.key_codes,
                                                               [q.id for q in self.quantities]))
        for other in others:
            totals.merge(other)
        return totals

    def _add_kept_from(self, path: Path, totals: _Totals) -> None:
        self._add_kept(totals, pl.read_ipc(path), self.chosen)

    def unit_counts(self) -> pl.DataFrame:
        """col : (key, privacy units after the first bounding) for keys with at least one unit."""
        units = self.light.units + self.first_heavy.units
        present = np.flatnonzero(units)
        return pl.DataFrame([self.codes.key_values(present), pl.Series(UNITS, units[present])])

    def restrict(self, chosen: pl.DataFrame, rebound: bool) -> None:
        """Keep the chosen partitions only; with `rebound`, bound heavy units again among them (Plume)."""
        self.chosen = np.zeros(self.codes.key_codes, dtype=bool)
        self.chosen[self.codes.key_codes_of(chosen)] = True
        self.rebound = rebound

    def partition_sums(self) -> pl.DataFrame:
        """col : (key, units, exact Int128 sum per quantity) for keys with at least one unit."""
        heavy = self._rebound_heavy() if self.rebound else self.first_heavy
        units = self.light.units + heavy.units
        if self.chosen is not None:
            units = np.where(self.chosen, units, 0)
        present = np.flatnonzero(units)
        columns = [self.codes.key_values(present), pl.Series(UNITS, units[present])]
        for noisy in self.plan.quantities:
            qid = noisy.quantity.id
            if noisy.quantity.aggregate == "privacy_units":
                columns.append(pl.Series(qid, units[present]).cast(pl.Int128))
            else:
                columns.append((self.light.column(qid, present) + heavy.column(qid, present)).alias(qid))
        return pl.DataFrame(columns)


def _pair_sums(shard: pl.DataFrame) -> dict[str, np.ndarray]:
    """Per (unit, partition) pair, in packed order: its code, its rows, and the sum of every other column.

    A pair's rows are a run in the sorted codes, so np.add.reduceat sums them (no hashing).
    """
    if shard[PACKED].null_count():
        raise DataError("a Parquet footer's statistics do not match the file's data; rewrite the file")
    if shard.height >= 2**32:
        # A row is at most 2^30 units (VALUE_BITS), so a pair's Int64 sum is exact below 2^33 rows.
        raise DataError("over 2^32 rows fell into one shard of privacy units, more than the sorted path sums exactly;"
                        " split the input")
    # Polars' single-threaded sort, one per worker: about three times numpy's on the benchmark
    # machine (where numpy sorts int64 at ~60 ns a row); Polars' own threads would only
    # compete with the other workers. A frame's sort first copies its columns into one chunk
    # each, so the codes alone are sorted as a series: one copy fewer.
    if shard.width == 1:
        shard = shard[PACKED].sort(multithreaded=False).to_frame()
    else:
        shard = shard.sort(PACKED, multithreaded=False)
    packed = shard[PACKED].to_numpy()
    starts, rows = _runs(packed)
    pairs = {PACKED: packed[starts], ROWS: rows}
    for column in [name for name in shard.columns if name != PACKED]:
        values = shard[column].to_numpy()
        pairs[column] = np.add.reduceat(values, starts, dtype=np.int64) if starts.size else values[:0].astype(np.int64)
    return pairs


def _present(column: str) -> str:
    return f"__dprun_present_{column}__"


def _runs(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of equal values starts in a sorted array, and its length."""
    if sorted_values.size == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    changes = np.empty(sorted_values.size, dtype=bool)
    changes[0] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=changes[1:])
    starts = np.flatnonzero(changes)
    # Not np.diff(append=…): it copies the array first, several times slower on millions of runs.
    lengths = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=lengths[:-1])
    lengths[-1] = sorted_values.size - starts[-1]
    return starts, lengths


def _run_members(starts: np.ndarray, lengths: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Indices of the elements of the chosen runs, in order."""
    starts, lengths = starts[chosen], lengths[chosen]
    firsts = np.cumsum(lengths) - lengths
    return np.repeat(starts - firsts, lengths) + np.arange(int(lengths.sum()))


def _rank_within_runs(sorted_values: np.ndarray) -> np.ndarray:
    """0, 1, 2, … within each run of equal values."""
    starts, lengths = _runs(sorted_values)
    return np.arange(sorted_values.size) - np.repeat(starts, lengths)


def _shards(frame: pl.LazyFrame, codes: Codes, seed: int, workdir: Path) -> list[Callable[[], pl.DataFrame]]:
    """Loaders of the packed rows in shards of whole units, each small enough to sort in memory."""
    count = max(1, math.ceil(codes.rows / SHARD_ROWS))
    if count == 1:
        return [lambda: collect(frame)]
    files = _ShardFiles(workdir / "packed")
    shard_of_unit = (pl.col(PACKED) // (1 << codes.key_bits)).hash(seed) % count
    try:
        sink(frame.with_columns(shard_of_unit.alias(SHARD)),
             pl.PartitionBy(str(files.folder), key=SHARD, include_key=False, file_path_provider=files.create),
             workdir, arrow=True)
    finally:
        files.close()
    return [partial(_load, paths) for paths in files.paths()]


class _ShardFiles:
    """The files Polars' partitioned sink writes, opened here rather than by Polars.

    Polars opens a file it is given by path twice, with O_TRUNC, so the second open
    truncates the empty file the first created. ext4 takes a truncated file for one being
    rewritten and, when it is closed, starts writing all its pages to disk (auto_da_alloc):
    a third of a second at the end of the sink on the benchmark machine, for scratch files
    that are read back at once. A file opened once, exclusively, stays in the page cache.
    Unbuffered, so that closing a file after a failed sink has nothing left to write.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir()
        self.by_shard: dict[int, list[BinaryIO]] = {}

    def create(self, args: pl.FileProviderArgs) -> BinaryIO:
        shard = int(args.partition_keys[SHARD][0])
        file = (self.folder / f"{shard}-{args.index_in_partition}.arrow").open("xb", buffering=0)
        self.by_shard.setdefault(shard, []).append(file)
        return file

    def paths(self) -> list[list[Path]]:
        """Each shard's files, in shard order."""
        return [[Path(file.name) for file in files] for _, files in sorted(self.by_shard.items())]

    def close(self) -> None:
        for files in self.by_shard.values():
            for file in files:
                file.close()


def _load(files: list[Path]) -> pl.DataFrame:
    """A shard's rows, memory-mapped (pyarrow reads Arrow files without a copy, unlike Polars);
    the files are removed as soon as they are read (deleting hundreds of MB at the end takes a while)."""
    # Not rechunked: the sort writes its own contiguous copy anyway.
    shard = pl.from_arrow(pa.concat_tables(pa.ipc.open_file(pa.memory_map(str(file))).read_all() for file in files),
                          rechunk=False)
    assert isinstance(shard, pl.DataFrame)
    for file in files:
        file.unlink()
    return shard


def _in_parallel_into(tasks: Sequence[Callable[[A], R]], new_accumulator: Callable[[], A]) -> tuple[list[R], list[A]]:
    """Each task's result, in order, as `_in_parallel`, and the accumulators (at least one)
    the tasks were given: a running task holds one that no other running task holds.

    One accumulator per worker, not per task: the sorted path's totals are 8 bytes per key
    code and quantity, written in full when they are zeroed and when they are merged.
    """
    accumulators = [new_accumulator() for _ in range(max(1, min(WORKERS, len(tasks))))]
    idle: SimpleQueue[A] = SimpleQueue()
    for accumulator in accumulators:
        idle.put(accumulator)

    def run(task: Callable[[A], R]) -> R:
        accumulator = idle.get()
        try:
            return task(accumulator)
        finally:
            idle.put(accumulator)

    return list(_in_parallel([partial(run, task) for task in tasks])), accumulators


def _in_parallel(tasks: list[Callable[[], R]]) -> Iterator[R]:
    """Each task's result, in order, WORKERS tasks running at once.

    Sorting and numpy release the GIL, so shards keep the cores busy. Only WORKERS shards
    are held in memory at a time."""
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        pending: deque[Future[R]] = deque()
        for task in tasks:
            pending.append(pool.submit(task))
            if len(pending) == WORKERS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

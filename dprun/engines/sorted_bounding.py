"""Contribution bounding by sorting packed integer codes: the Polars engine's fast path.

When the privacy unit is one integer column and the partition key is one integer column
(or there is no group_by), each row's (unit, partition) pair packs into one UInt64:
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
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from dprun.engines.polars_steps import UNITS, collect, row_units, scaled_partial, sink
from dprun.errors import DataError
from dprun.mechanisms.quantities import Quantity
from dprun.plan import QueryPlan
from dprun.spec.input_schema import InputInfo

PACKED = "__dprun_packed__"
ROWS = "__dprun_rows__"
T = TypeVar("T")
R = TypeVar("R")
# Rows sorted in memory at once: ~8 bytes per row and per value column, cache-friendly.
SHARD_ROWS = 2**22
# Per-partition totals are kept in dense arrays indexed by the key's code.
MAX_KEY_CODES = 2**22
PACKED_BITS = 62


@dataclass(frozen=True)
class Codes:
    """How a row's (unit, key) packs into one UInt64: unit code above `key_bits`, key code below.

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
    """column − minimum as UInt64, without overflow in narrow or unsigned types."""
    wide = pl.UInt64 if dtype == pl.UInt64 else pl.Int64
    return (pl.col(column).cast(wide) - pl.lit(minimum, dtype=wide)).cast(pl.UInt64)


def _values(name: str, codes: np.ndarray, minimum: int, dtype: pl.DataType) -> pl.Series:
    wide = pl.lit(pl.Series(codes.astype(np.uint64))).cast(pl.Int128) + pl.lit(minimum, dtype=pl.Int128)
    return pl.select(wide.cast(dtype).alias(name)).to_series()


def packable(plan: QueryPlan, schema: dict[str, pl.DataType], key: str) -> bool:
    """Whether the plan's columns allow packing, from the schema alone."""
    if len(plan.privacy_unit) != 1 or len(plan.group_by) > 1:
        return False
    if any(q.quantity.aggregate == "quantile_tree" for q in plan.quantities):
        return False
    return all(column in schema and schema[column].is_integer() for column in (plan.privacy_unit[0], key))


def codes_for(rows: pl.LazyFrame, unit: str, key: str, info: InputInfo) -> Codes | None:
    """The packing of this input's (unit, key), or None if its ranges do not fit in 62 bits.

    The ranges come from the Parquet footers' statistics where every row group has them,
    else from one streaming pass over the two columns. They decide how rows are packed and
    sharded, never what is released; a row outside them fails the run (`Codes.packed`).
    """
    schema = rows.collect_schema()
    ranges = _footer_ranges(info, unit, key) or _scanned_ranges(rows, unit, key)
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


def _footer_ranges(info: InputInfo, unit: str, key: str) -> Ranges | None:
    """Row count and column ranges from Parquet footers alone (filters only narrow them)."""
    if info.format != "parquet":
        return None
    found: Ranges = {"rows": 0, key: (0, 0)} if key not in info.schema else {"rows": 0}
    wanted = [column for column in (unit, key) if column not in found]
    for path in info.paths:
        metadata = pq.ParquetFile(path).metadata
        names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
        for group in (metadata.row_group(i) for i in range(metadata.num_row_groups)):
            found["rows"] += group.num_rows
            for column in wanted:
                stats = group.column(names.index(column)).statistics if column in names else None
                if stats is None or not stats.has_min_max:
                    return None
                low, high = found.get(column, (stats.min, stats.max))
                found[column] = (min(low, int(stats.min)), max(high, int(stats.max)))
    return found if all(column in found for column in wanted) else None


@dataclass
class _Totals:
    """Per key code: privacy units, and each quantity's exact Int128 sum of partials."""

    units: np.ndarray
    sums: dict[str, pl.Series]

    @classmethod
    def zeros(cls, size: int, quantity_ids: list[str]) -> _Totals:
        return cls(np.zeros(size, np.int64), {qid: pl.zeros(size, dtype=pl.Int128, eager=True) for qid in quantity_ids})

    def add(self, keys: np.ndarray, partials: dict[str, np.ndarray], sign: int = 1) -> None:
        """Add (or with sign −1, take away) these pairs."""
        size = self.units.size
        counts = np.bincount(keys, minlength=size) * sign
        self.units += counts
        for qid, values in partials.items():
            # A partial of one row per pair (e.g. a count with max_contributions_per_partition 1) sums to the pair count.
            all_ones = values.size > 0 and values.min() == 1 and values.max() == 1
            per_key = pl.Series(counts).cast(pl.Int128) if all_ones else _exact_bincount(keys, values * sign, size)
            self.sums[qid] = self.sums[qid] + per_key

    def merge(self, other: _Totals) -> None:
        self.units += other.units
        for qid, sums in other.sums.items():
            self.sums[qid] = self.sums[qid] + sums

    def column(self, qid: str, rows: np.ndarray) -> pl.Series:
        return self.sums[qid].gather(rows).alias(qid)


def _exact_bincount(keys: np.ndarray, values: np.ndarray, size: int) -> pl.Series:
    """Σ values per key, exactly, at np.bincount's speed (a hash group-by is several times slower).

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
        self.light = _Totals.zeros(codes.key_codes, ids)
        self.heavy_files: list[Path] = []
        self.chosen: np.ndarray | None = None
        self.rebound = False
        frame = rows.select(codes.packed(), *self._row_columns())
        loads = _shards(frame, codes, seed, workdir)
        for index, (light, heavy) in enumerate(_two_at_a_time(self._bound_shard, loads)):
            self.light.merge(light)
            if heavy.height:
                path = workdir / f"heavy-{index}.arrow"
                heavy.write_ipc(path, compression="uncompressed")
                self.heavy_files.append(path)
        self.first_heavy = self._heavy_totals(None)

    def _row_columns(self) -> list[pl.Expr]:
        present = [pl.col(c).is_not_null().cast(pl.Int32).alias(_present(c)) for c in self.value_columns]
        values = [row_units(q).fill_null(0).alias(q.id) for q in self.quantities if q.aggregate != "rows"]
        return [*present, *values]

    def _bound_shard(self, load: Callable[[], pl.DataFrame]) -> tuple[_Totals, pl.DataFrame]:
        """A shard's light units' totals per key, and its heavy units' pairs, ranked."""
        shard = load()
        if shard[PACKED].null_count():
            raise DataError("a Parquet footer's statistics do not match the file's data; rewrite the file")
        # On a sorted column Polars groups by slicing runs: no hashing.
        pairs = shard.sort(PACKED).group_by(PACKED, maintain_order=True).agg(self._pair_sums())
        del shard
        pair_packed = pairs[PACKED].to_numpy()
        partials = {q.id: self._partial(q, pairs) for q in self.quantities}
        del pairs
        unit_code = pair_packed >> np.uint64(self.codes.key_bits)
        # Codes are below 2^62, so the UInt64 bits read as Int64 unchanged (np.bincount wants signed).
        key_code = np.bitwise_and(pair_packed, np.uint64((1 << self.codes.key_bits) - 1)).view(np.int64)
        user_starts, per_unit = _runs(unit_code)
        heavy = _run_members(user_starts, per_unit, per_unit > self.plan.max_partitions)
        heavy_partials = {qid: values[heavy] for qid, values in partials.items()}
        # Light units' totals: all pairs', less the heavy units' (a small share).
        light = _Totals.zeros(self.codes.key_codes, list(partials))
        light.add(key_code, partials)
        light.add(key_code[heavy], heavy_partials, sign=-1)
        return light, self._ranked_heavy(unit_code[heavy], key_code[heavy], heavy_partials)

    def _pair_sums(self) -> list[pl.Expr]:
        """Per pair: its rows, each value column's non-null rows, each value quantity's total."""
        sums = [pl.col(_present(c)).sum().cast(pl.Int64) for c in self.value_columns]
        sums += [pl.col(q.id).sum() for q in self.quantities if q.aggregate != "rows"]
        return [pl.len().cast(pl.Int64).alias(ROWS), *sums]

    def _partial(self, quantity: Quantity, pairs: pl.DataFrame) -> np.ndarray:
        """Each pair's partial, bounded to max_rows rows' worth, exactly as the general path."""
        m = self.plan.max_rows
        present = pairs[ROWS if quantity.column is None else _present(quantity.column)].to_numpy()
        if quantity.aggregate == "rows":
            return np.minimum(present, m)
        total = pairs[quantity.id].to_numpy()
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

    def _heavy_totals(self, chosen: np.ndarray | None) -> _Totals:
        """Heavy units' pairs per key: each unit's L0 first-ranked pairs, among the chosen keys
        only if given (Plume's second bounding)."""
        totals = _Totals.zeros(self.codes.key_codes, [q.id for q in self.quantities])
        for path in self.heavy_files:
            pairs = pl.read_ipc(path)
            keys = pairs["key"].to_numpy()
            candidates = np.flatnonzero(chosen[keys]) if chosen is not None else np.arange(pairs.height)
            kept = candidates[_rank_within_runs(pairs["unit"].to_numpy()[candidates]) < self.plan.max_partitions]
            totals.add(keys[kept], {q.id: pairs[q.id].to_numpy()[kept] for q in self.quantities})
        return totals

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
        heavy = self._heavy_totals(self.chosen) if self.rebound else self.first_heavy
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
    return starts, np.diff(starts, append=sorted_values.size)


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
    folder = workdir / "packed"
    shard_of_unit = (pl.col(PACKED) // (1 << codes.key_bits)).hash(seed) % count
    sink(frame.with_columns(shard_of_unit.alias("__dprun_shard__")),
         pl.PartitionBy(str(folder), key="__dprun_shard__", include_key=False), arrow=True)
    shards = [sorted((folder / f"__dprun_shard__={index}").glob("*")) for index in range(count)]
    return [partial(_load, files) for files in shards if files]


def _load(files: list[Path]) -> pl.DataFrame:
    """A shard's rows; its files are removed at once (deleting hundreds of MB takes a while)."""
    shard = collect(pl.scan_ipc(files))
    for file in files:
        file.unlink()
    return shard


def _two_at_a_time(work: Callable[[T], R], items: list[T]) -> Iterator[R]:
    """work(item) for each item, in order, two running at once.

    Sorting and numpy release the GIL, so two shards keep both cores busy; only two
    shards are held in memory at a time."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        pending: deque[Future[R]] = deque()
        for item in items:
            pending.append(pool.submit(work, item))
            if len(pending) == 2:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

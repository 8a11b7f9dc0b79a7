"""Exact integer codes for the sorted bounding path: any privacy unit, any partition key.

A partition key (one or several columns of any type, null a value of its own) gets a code
in 0 .. count−1 that indexes the per-partition arrays of `sorted_bounding`:

* `RangeKeys`: one integer column whose values span at most MAX_KEY_CODES − 1 values, coded
  by its offset from the smallest (the range comes from Parquet footers or a public lookup
  where they give it, else from one streaming pass); null is the code after the last;
* `TableKeys`: any other key, coded by its row in the table of distinct keys: the public
  partitions' list, or one streaming group-by over the key columns.

A privacy unit gets a code that is unique among the units of its shard:

* `RangeUnits`: one integer column, coded by its offset from the smallest value, packed with
  the key before the rows are sharded;
* `ShardUnits`: any other unit (text, dates, several columns, integers too far apart),
  coded by its dense rank among the units of its shard once the shard is in memory
  (`shard_unit_codes`).

Every code is exact: no hash stands in for identity, since two people merged by a collision
would break the guarantee (a keyed hash only spreads units over shards, where a collision
costs balance, nothing else). Memory: a shard of rows (`sorted_bounding.SHARD_ROWS`) per
worker, and per distinct key its code's totals and the key's own values — as much as the
table of partitions a selection needs anyway. Codes are internal, never released; which
of a unit's contributions count is decided by a keyed hash of the unit's and the key's
values, never by a code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from dprun.engines.polars_steps import GLOBAL_KEY, collect
from dprun.plan import QueryPlan
from dprun.spec.input_schema import InputInfo, scan

PACKED = "__dprun_packed__"
KEY = "__dprun_key_code__"
UNIT = "__dprun_unit_code__"
ROWS = "__dprun_rows__"
# Per-partition totals are dense arrays indexed by the key's code: a key range wider than
# this is coded by a table of the keys present instead.
MAX_KEY_CODES = 2**22
PACKED_BITS = 62


@dataclass(frozen=True)
class RangeKeys:
    """One integer key column, coded value − minimum; `span` codes for values, then one for null."""

    column: str
    minimum: int
    span: int
    dtype: pl.DataType

    @property
    def count(self) -> int:
        return self.span + 1

    def attach(self, frame: pl.LazyFrame) -> pl.LazyFrame:
        """The frame with each row's key code; null for a key outside the range (the run then fails)."""
        key = pl.col(self.column)
        within = key.is_null() | key.is_between(self.minimum, self.minimum + self.span - 1)
        code = _offset(self.column, self.minimum, self.dtype).fill_null(self.span)
        return frame.with_columns(pl.when(within).then(code).alias(KEY))

    def values(self, codes: np.ndarray) -> pl.DataFrame:
        nulls = codes == self.span
        # The null code may lie past the key type's range (Int8 keys up to 127): decoded as 0, then nulled.
        values = _values(self.column, np.where(nulls, 0, codes), self.minimum, self.dtype)
        return (values.scatter(np.flatnonzero(nulls), None) if nulls.any() else values).to_frame()

    def codes_of(self, keys: pl.DataFrame) -> np.ndarray:
        offset = pl.col(self.column).cast(pl.Int128) - pl.lit(self.minimum, dtype=pl.Int128)
        return keys.select(offset.fill_null(self.span).cast(pl.Int64)).to_series().to_numpy()


@dataclass(frozen=True)
class TableKeys:
    """Any key, coded by its row in `table`, the distinct keys (null included)."""

    table: pl.DataFrame

    @property
    def count(self) -> int:
        return self.table.height

    def attach(self, frame: pl.LazyFrame) -> pl.LazyFrame:
        """The frame with each row's key code (a small table joined in memory as the rows stream past)."""
        return frame.join(self._coded().lazy(), on=self.table.columns, how="left", nulls_equal=True)

    def values(self, codes: np.ndarray) -> pl.DataFrame:
        return self.table[codes]

    def codes_of(self, keys: pl.DataFrame) -> np.ndarray:
        coded = keys.join(self._coded(), on=self.table.columns, how="left", nulls_equal=True, maintain_order="left")
        return coded[KEY].to_numpy()

    def _coded(self) -> pl.DataFrame:
        return self.table.with_row_index(KEY).with_columns(pl.col(KEY).cast(pl.Int64))


@dataclass(frozen=True)
class RangeUnits:
    """One integer unit column, coded value − minimum."""

    column: str
    minimum: int
    maximum: int
    dtype: pl.DataType

    @property
    def bits(self) -> int:
        return (self.maximum - self.minimum).bit_length()

    def code(self) -> pl.Expr:
        """The unit's code; null outside the range (the run then fails)."""
        within = pl.col(self.column).is_between(self.minimum, self.maximum)
        return pl.when(within).then(_offset(self.column, self.minimum, self.dtype))

    def values(self, codes: np.ndarray) -> pl.DataFrame:
        return _values(self.column, codes, self.minimum, self.dtype).to_frame()


@dataclass(frozen=True)
class ShardUnits:
    """Any unit: coded per shard by `shard_unit_codes`."""

    columns: tuple[str, ...]


Keys = RangeKeys | TableKeys
Units = RangeUnits | ShardUnits


@dataclass(frozen=True)
class Codes:
    """How a row's (unit, key) packs into one Int64 below 2^62: unit code above `key_bits`, key code below.

    `rows` bounds the rows the query reads (it sizes the shards, nothing else).
    """

    units: Units
    keys: Keys
    key_columns: tuple[str, ...]
    rows: int

    @property
    def key_bits(self) -> int:
        return (self.keys.count - 1).bit_length()

    def packed(self, unit_code: pl.Expr) -> pl.Expr:
        """The packed code from a unit code and the key code (`KEY`); null where either is."""
        return (unit_code * (1 << self.key_bits) + pl.col(KEY)).alias(PACKED)


def shard_unit_codes(shard: pl.DataFrame, units: ShardUnits) -> pl.Expr:
    """Each row's unit code within its shard: the dense rank of its unit's values, from 0.

    Exact whatever the columns' types (a sort compares values); 0.3–0.6 s for 2^21 rows of
    text ids on the benchmark machine.
    """
    columns = list(units.columns)
    unit = pl.col(columns[0]) if len(columns) == 1 and shard.schema[columns[0]].is_integer() else pl.struct(columns)
    return (unit.rank("dense").cast(pl.Int64) - 1).alias(UNIT)


def codes_for(rows: pl.LazyFrame, plan: QueryPlan, keys: list[str], info: InputInfo, fan_out: int) -> Codes:
    """The codes of this query's units and keys, from the schema, footers and public tables where
    they suffice, else from one streaming pass over the unit and key columns.

    `fan_out` bounds the rows a join makes of one row of the input. The ranges and tables decide
    how rows are coded and sharded, never what is released.
    """
    schema = dict(rows.collect_schema())
    units = list(plan.privacy_unit)
    int_unit = units[0] if len(units) == 1 and schema[units[0]].is_integer() else None
    int_key = keys[0] if len(keys) == 1 and schema[keys[0]].is_integer() else None
    stats = _stats(rows, info, int_unit, keys, int_key, plan, fan_out)
    key_codes = _key_codes(rows, plan, keys, int_key, stats, schema)
    unit_codes: Units = ShardUnits(tuple(units))
    if int_unit is not None:
        low, high = stats[int_unit]
        ranged = RangeUnits(int_unit, low, high, schema[int_unit])
        if ranged.bits + (key_codes.count - 1).bit_length() <= PACKED_BITS:
            unit_codes = ranged
    return Codes(unit_codes, key_codes, tuple(keys), stats[ROWS])


Stats = dict[str, Any]


def _stats(rows: pl.LazyFrame, info: InputInfo, int_unit: str | None, keys: list[str], int_key: str | None,
           plan: QueryPlan, fan_out: int) -> Stats:
    """Row count and (min, max) of the integer unit and key columns: from footers where they
    have them, else from one pass (which, for a key coded by table, also finds the keys)."""
    ranged = [c for c in (int_unit, int_key) if c is not None]
    found = _footer_ranges(info, ranged, fan_out) if int_key is not None or plan.public_keys is not None else None
    if found is not None:
        return found
    if int_key is None and plan.public_keys is None:
        by_key = collect(rows.group_by(keys).agg(pl.len().alias(ROWS), *_min_max(int_unit)))
        found = {ROWS: int(by_key[ROWS].sum()), "keys": by_key.select(keys)}
        if int_unit is not None:
            found[int_unit] = _range(by_key[f"{int_unit}_min"].min(), by_key[f"{int_unit}_max"].max())
        return found
    totals = collect(rows.select(pl.len().alias(ROWS), *_min_max(int_unit), *_min_max(int_key))).row(0, named=True)
    return {ROWS: totals[ROWS], **{c: _range(totals[f"{c}_min"], totals[f"{c}_max"]) for c in ranged}}


def _min_max(column: str | None) -> list[pl.Expr]:
    if column is None:
        return []
    return [pl.col(column).min().alias(f"{column}_min"), pl.col(column).max().alias(f"{column}_max")]


def _range(low: Any, high: Any) -> tuple[int, int]:
    return (0, 0) if low is None else (int(low), int(high))


def _key_codes(rows: pl.LazyFrame, plan: QueryPlan, keys: list[str], int_key: str | None, stats: Stats,
               schema: dict[str, pl.DataType]) -> Keys:
    if int_key is not None and int_key in stats:
        low, high = stats[int_key]
        if high - low + 2 <= MAX_KEY_CODES:
            return RangeKeys(int_key, low, high - low + 1, schema[int_key])
    if plan.public_keys is not None:
        return TableKeys(plan.public_keys.select(keys).unique(maintain_order=True))
    if "keys" in stats:
        return TableKeys(stats["keys"])
    return TableKeys(collect(rows.select(keys).unique()))


def _offset(column: str, minimum: int, dtype: pl.DataType) -> pl.Expr:
    """column − minimum as Int64: exact for a value within the range (offsets below 2^62); for
    any other it wraps around, and the caller nulls it.

    Int64 throughout, not UInt64: Polars' checked cast to UInt64 cost a tenth of the sink.
    """
    if dtype == pl.UInt64:
        return (pl.col(column) - pl.lit(minimum, dtype=pl.UInt64)).cast(pl.Int64, wrap_numerical=True)
    return pl.col(column).cast(pl.Int64) - pl.lit(minimum, dtype=pl.Int64)


def _values(name: str, codes: np.ndarray, minimum: int, dtype: pl.DataType) -> pl.Series:
    """minimum + codes in the column's type; codes stay within the column's range, so no overflow."""
    wide = np.uint64 if dtype == pl.UInt64 else np.int64
    return pl.Series(name, codes.astype(wide) + wide(minimum)).cast(dtype)


def _footer_ranges(info: InputInfo, columns: list[str], fan_out: int) -> Stats | None:
    """Row count and the columns' ranges from Parquet footers and public lookups alone (filters only
    narrow them). A join keeps a subset of its first input's units and rows × `fan_out`, and takes
    a column from the input that holds it; a lookup's range is read from the (public) lookup."""
    columns = [c for c in columns if c != GLOBAL_KEY]
    if any(c not in info.joined_schema for c in columns):  # derived by the query
        return None
    own = [c for c in columns if _holder(info, c) is None]
    found = _parquet_ranges(info, own)
    if found is None:
        return None
    for column in columns:
        holder = _holder(info, column)
        if holder is not None:
            other = _parquet_ranges(holder.info, [column]) or (
                _scanned_range(holder.info, column) if holder.public else None)
            if other is None:
                return None
            found[column] = other[column]
    return found | {ROWS: found[ROWS] * fan_out, GLOBAL_KEY: (0, 0)}


def _holder(info: InputInfo, column: str) -> Any:
    """The joined input a column comes from, or None for the query's own input."""
    return next((j for j in info.joins if column in j.info.schema and column not in j.on), None)


def _scanned_range(lookup: InputInfo, column: str) -> Stats:
    """A public lookup's range of `column`, read from its (small, public) file."""
    low, high = collect(scan(lookup).select(pl.col(column).min(), pl.col(column).max().alias("high"))).row(0)
    return {column: _range(low, high)}


def _parquet_ranges(info: InputInfo, columns: list[str]) -> Stats | None:
    """Row count and each column's (min, max) over every row group of a Parquet input, or None
    where a footer lacks them (CSV, a row group without statistics)."""
    if info.format != "parquet":
        return None
    found: Stats = {ROWS: 0}
    for path in info.paths:
        metadata = pq.ParquetFile(path).metadata
        names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
        for group in (metadata.row_group(i) for i in range(metadata.num_row_groups)):
            found[ROWS] += group.num_rows
            for column in columns:
                stats = group.column(names.index(column)).statistics if column in names else None
                if stats is None or not stats.has_min_max:
                    return None
                low, high = found.get(column, (stats.min, stats.max))
                found[column] = (min(low, int(stats.min)), max(high, int(stats.max)))
    return found if all(column in found for column in columns) else None

"""Exact integer codes for the sorted bounding path: any privacy unit, any partition key.

A partition key (one or several columns of any type, null a value of its own) gets a code
in 0 .. count−1 that indexes the per-partition arrays of `sorted_bounding`:

* `RangeCodes`: integer columns, each coded by its offset from its smallest value and
  combined in mixed radix, when their ranges span at most MAX_KEY_CODES codes (and no more
  than the rows); the ranges come from Parquet footers or a public lookup where they give
  them, else from one streaming pass; a column's null is the code after its largest value;
* `TableKeys`: any other key, coded by its row in the table of distinct keys: the public
  partitions' list, or one streaming group-by over the key columns.

A privacy unit gets a code that is unique among the units of its shard:

* `RangeCodes`: integer columns (a compound unit of integers too), coded as keys are,
  packed with the key before the rows are sharded, when both fit in 62 bits;
* `ShardUnits`: any other unit (text, dates, mixed columns, integers too far apart),
  coded once its shard is in memory by a keyed hash of its values, checked to tell the
  shard's units apart, or by its dense rank there (`shard_unit_codes`).

Every code is exact: two people merged by a collision would break the guarantee, so a hash
stands for a unit only where it is checked to tell the units of its shard apart (a keyed hash
also spreads units over shards, where a collision costs balance, nothing else). Memory: a shard of rows (`shards.SHARD_ROWS`) per
worker, and per distinct key its code's totals and the key's own values — as much as the
table of partitions a selection needs anyway. Codes are internal, never released; which
of a unit's contributions count is decided by a keyed hash of the unit's and the key's
values, never by a code.
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from dprun.engines import distinct_codes
from dprun.engines.polars_steps import GLOBAL_KEY, collect, key_order
from dprun.plan import QueryPlan
from dprun.spec.input_schema import InputInfo, scan

if TYPE_CHECKING:
    from dprun.engines.compiled import UnitPasses

PACKED = "__dprun_packed__"
KEY = "__dprun_key_code__"
UNIT = "__dprun_unit_code__"
# A unit's keyed hash, carried by a shard whose load computed it (`shards.clustered_shards`).
UNIT_HASH = "__dprun_unit_hash__"
ROWS = "__dprun_rows__"
# Per-partition totals are dense arrays indexed by the key's code (8 bytes per code, quantity
# and worker): integer keys whose ranges span more codes than this, or more than the rows
# (and MIN_KEY_CODES), are coded by a table of the keys present instead.
MAX_KEY_CODES = 2**24
MIN_KEY_CODES = 2**16
PACKED_BITS = 62


@dataclass(frozen=True)
class Digit:
    """One integer column's place in a mixed-radix code: value − minimum, in 0 .. span−1, and
    span for null where `nulls` (a key's null is a value of its own; a unit is never null)."""

    column: str
    minimum: int
    span: int
    dtype: pl.DataType
    nulls: bool

    @property
    def radix(self) -> int:
        return self.span + int(self.nulls)

    def within(self) -> pl.Expr:
        value = pl.col(self.column)
        inside = value.is_between(self.minimum, self.minimum + self.span - 1)
        return value.is_null() | inside if self.nulls else inside

    def code(self) -> pl.Expr:
        offset = _offset(self.column, self.minimum, self.dtype)
        return offset.fill_null(self.span) if self.nulls else offset

    def decode(self, codes: np.ndarray) -> pl.Series:
        nulls = codes == self.span
        # The null code may lie past the column type's range (Int8 keys up to 127): decoded as 0, then nulled.
        values = _values(self.column, np.where(nulls, 0, codes), self.minimum, self.dtype)
        return values.scatter(np.flatnonzero(nulls), None) if self.nulls and nulls.any() else values


@dataclass(frozen=True)
class RangeCodes:
    """Integer columns coded by their offsets from their minimums, in mixed radix: the code of
    values (v_1 … v_n) is Σ (v_i − min_i) · Π_{j>i} radix_j, below `count`."""

    digits: tuple[Digit, ...]

    @property
    def count(self) -> int:
        return math.prod(d.radix for d in self.digits)

    @property
    def bits(self) -> int:
        return (self.count - 1).bit_length()

    def code(self) -> pl.Expr:
        """Each row's code; null for a row outside the ranges (the run then fails)."""
        terms = [d.code() if stride == 1 else d.code() * stride for d, stride in zip(self.digits, self._strides(),
                                                                                    strict=True)]
        within = self.digits[0].within() if len(self.digits) == 1 else pl.all_horizontal(d.within() for d in self.digits)
        return pl.when(within).then(functools.reduce(operator.add, terms))

    def attach(self, frame: pl.LazyFrame) -> pl.LazyFrame:
        """The frame with each row's key code (`KEY`)."""
        return frame.with_columns(self.code().alias(KEY))

    def values(self, codes: np.ndarray) -> pl.DataFrame:
        return pl.DataFrame([d.decode(self._digit_codes(codes, position)) for position, d in enumerate(self.digits)])

    def _digit_codes(self, codes: np.ndarray, position: int) -> np.ndarray:
        """The codes' digit at `position`: codes // stride % radix, without the division where the stride
        is 1 or the modulo for the first digit (codes are below `count`): numpy's Int64 division costs
        5 ns a code, a heavy unit's pairs and every key's values go through here."""
        stride = self._strides()[position]
        digit = codes if stride == 1 else codes // stride
        return digit if position == 0 else digit % self.digits[position].radix

    def codes_of(self, keys: pl.DataFrame) -> pl.Series:
        """Each key's code; null for a key outside the ranges (a listed partition without data)."""
        return keys.select(self.code()).to_series()

    def _strides(self) -> list[int]:
        radices = [d.radix for d in self.digits]
        return [math.prod(radices[i + 1:]) for i in range(len(radices))]


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

    def codes_of(self, keys: pl.DataFrame) -> pl.Series:
        """Each key's code; null for a key the table lacks (a listed partition without data)."""
        coded = keys.join(self._coded(), on=self.table.columns, how="left", nulls_equal=True, maintain_order="left")
        return coded[KEY]

    def _coded(self) -> pl.DataFrame:
        return self.table.with_row_index(KEY).with_columns(pl.col(KEY).cast(pl.Int64))


@dataclass(frozen=True)
class ShardUnits:
    """Any unit: coded per shard by `shard_unit_codes`."""

    columns: tuple[str, ...]

    def value(self) -> pl.Expr:
        """Each row's unit: its one column, or a struct of its columns."""
        return pl.col(self.columns[0]) if len(self.columns) == 1 else pl.struct(list(self.columns))


Keys = RangeCodes | TableKeys
Units = RangeCodes | ShardUnits


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


def shard_unit_codes(shard: pl.DataFrame, units: ShardUnits, bits: int, seed: int, passes: UnitPasses | None
                     ) -> pl.Series:
    """Each row's unit code within its shard, below 2^bits.

    Where a keyed hash of the unit's values tells the shard's units apart, which is checked
    exactly (as many distinct hashes as distinct units, or as runs of equal units where the
    rows come unit by unit, `_unit_runs`: then no two units share a code), its hash's dense
    number in the shard where the compiled `passes` are loaded (`distinct_codes`), else the
    hash's top bits; where two units collide, the unit's dense rank among the shard's units.
    The hash and the check cost about a third of the rank (a sort of the values) on text ids.
    The hashes are the shard's UNIT_HASH column where its load computed them with `seed`.
    """
    unit = units.value()
    if passes is not None:
        hashed = shard[UNIT_HASH] if UNIT_HASH in shard.columns else shard.select(unit.hash(seed)).to_series()
        hashes = hashed.rechunk().to_numpy().view(np.int64)
        dense = np.empty(hashes.size, np.int64)
        runs = _unit_runs(shard, unit, units.columns)
        # As many distinct hashes as runs of equal units, at least as many as the units: one code a unit.
        if runs is not None and passes.dense_codes(hashes, distinct_codes.slots_for(runs), dense) == runs:
            return pl.Series(UNIT, dense)
    distinct_units = _distinct_units(shard, unit)
    if passes is not None:
        if passes.dense_codes(hashes, distinct_codes.slots_for(distinct_units), dense) == distinct_units:
            return pl.Series(UNIT, dense)
    else:
        top_bits = unit.hash(seed) // pl.lit(1 << (64 - bits), dtype=pl.UInt64)
        hashed = shard.select(top_bits.cast(pl.Int64).alias(UNIT)).to_series()
        if hashed.n_unique() == distinct_units:
            return hashed
    return shard.select((unit.rank("dense").cast(pl.Int64) - 1).alias(UNIT)).to_series()


def _distinct_units(shard: pl.DataFrame, unit: pl.Expr) -> int:
    """The shard's distinct units."""
    return int(shard.select(unit.n_unique()).item())


def _unit_runs(shard: pl.DataFrame, unit: pl.Expr, columns: tuple[str, ...]) -> int | None:
    """The runs of rows of one unit in a shard whose units come together (at most half as many
    runs as rows), as an input listed unit by unit gives them; None otherwise, or where equal
    units may differ in their bits (and so in their hashes).

    Counting the runs is one comparison per row, where counting the distinct units hashes them
    all into a table (`n_unique`: 45 ms of a text shard's 2^21 rows, the runs 8)."""
    if not all(equal_by_bits(shard.schema[c]) for c in columns):
        return None
    runs = shard.select(unit.ne_missing(unit.shift(1)).sum()).item()
    return runs if runs <= shard.height // 2 else None


def equal_by_bits(dtype: pl.DataType) -> bool:
    """Whether values of the type are equal exactly where their bits are (a float's 0.0 and −0.0
    are one value to a comparison but two to a hash)."""
    return dtype.is_integer() or dtype in (pl.String, pl.Boolean, pl.Date)


def codes_for(rows: pl.LazyFrame, plan: QueryPlan, keys: list[str], info: InputInfo, fan_out: int,
              scanned: pl.LazyFrame | None = None) -> Codes:
    """The codes of this query's units and keys, from the schema, footers and public tables where
    they suffice, else from one streaming pass over the unit and key columns.

    `fan_out` bounds the rows a join makes of one row of the input. The ranges and tables decide
    how rows are coded and sharded, never what is released. The pass reads `scanned` where given:
    the rows with those whose unit is null, so that a text key's table is found without reading
    the unit column (a fifth of the pass on the text benchmark). The table then lists keys that
    only such rows have, which no unit ever reaches: it codes them, and they are never candidates
    (`SortedBounding.unit_counts`); the row count sizes the shards only; a range ignores nulls.
    """
    schema = dict(rows.collect_schema())
    units = list(plan.privacy_unit)
    int_units = units if all(schema[c].is_integer() for c in units) else []
    int_keys = keys if all(schema[c].is_integer() for c in keys) else []
    read = rows if scanned is None else scanned
    stats = _stats(read, info, int_units, keys, int_keys, plan, fan_out)
    key_codes = _key_codes(read, plan, keys, int_keys, stats, schema)
    unit_codes: Units = ShardUnits(tuple(units))
    if int_units:
        ranged = RangeCodes(tuple(_digit(c, stats[c], schema[c], nulls=False) for c in int_units))
        if ranged.bits + (key_codes.count - 1).bit_length() <= PACKED_BITS:
            unit_codes = ranged
    return Codes(unit_codes, key_codes, tuple(keys), stats[ROWS])


def _digit(column: str, value_range: tuple[int, int], dtype: pl.DataType, nulls: bool) -> Digit:
    low, high = value_range
    return Digit(column, low, high - low + 1, dtype, nulls)


Stats = dict[str, Any]


def _stats(rows: pl.LazyFrame, info: InputInfo, int_units: list[str], keys: list[str], int_keys: list[str],
           plan: QueryPlan, fan_out: int) -> Stats:
    """Row count and (min, max) of the integer unit and key columns: from footers where they
    have them, else from one pass (which, for keys coded by table, also finds the keys; where
    the footers give the rest, it only finds them: the text benchmark's 10^6 keys among 10^8
    rows 3.1 s, counting the rows as well 3.6)."""
    ranged = [*int_units, *int_keys]
    found = _footer_ranges(info, ranged, fan_out)
    if found is not None and (int_keys or plan.public_keys is not None):
        return found
    if not int_keys and plan.public_keys is None:
        if found is not None:
            return found | {"keys": collect(rows.select(keys).unique())}
        by_key = collect(rows.group_by(keys).agg(pl.len().alias(ROWS), *_min_max(int_units)))
        found = {ROWS: int(by_key[ROWS].sum()), "keys": by_key.select(keys)}
        return found | {c: _range(by_key[f"{c}_min"].min(), by_key[f"{c}_max"].max()) for c in int_units}
    totals = collect(rows.select(pl.len().alias(ROWS), *_min_max(ranged))).row(0, named=True)
    return {ROWS: totals[ROWS], **{c: _range(totals[f"{c}_min"], totals[f"{c}_max"]) for c in ranged}}


def _min_max(columns: list[str]) -> list[pl.Expr]:
    return [e for c in dict.fromkeys(columns)
            for e in (pl.col(c).min().alias(f"{c}_min"), pl.col(c).max().alias(f"{c}_max"))]


def _range(low: Any, high: Any) -> tuple[int, int]:
    return (0, 0) if low is None else (int(low), int(high))


def _key_codes(rows: pl.LazyFrame, plan: QueryPlan, keys: list[str], int_keys: list[str], stats: Stats,
               schema: dict[str, pl.DataType]) -> Keys:
    if int_keys and all(c in stats for c in int_keys):
        ranged = RangeCodes(tuple(_digit(c, stats[c], schema[c], nulls=True) for c in int_keys))
        # Dense arrays of `count` totals: no more than the rows could fill (else a table of the keys present).
        if ranged.count <= min(MAX_KEY_CODES, max(stats[ROWS], MIN_KEY_CODES)):
            return ranged
    if plan.public_keys is not None:
        return TableKeys(plan.public_keys.select(keys).unique(maintain_order=True))
    found = stats["keys"] if "keys" in stats else collect(rows.select(keys).unique())
    # In key order: the candidates of a private selection, listed by code, then come in the order
    # their draws are made in, which Polars' sort of them finds at once (10^6 text keys: the
    # table's sort 57 ms; the candidates' sort with their counts 161 ms, then a few).
    return TableKeys(found.sort(key_order(found.schema), nulls_last=True))


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
    where a footer lacks them (CSV, a row group without statistics) or gives them as other than
    integers (a date or decimal column the spec casts to an integer type)."""
    if info.format != "parquet":
        return None
    found: Stats = {ROWS: 0}
    for path in info.paths:
        metadata = pq.ParquetFile(path).metadata
        names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
        for group in (metadata.row_group(i) for i in range(metadata.num_row_groups)):
            found[ROWS] += group.num_rows
            for column in columns:
                group_range = footer_range(group.column(names.index(column)).statistics) if column in names else None
                if group_range is None:
                    return None
                low, high = found.get(column, group_range)
                found[column] = (min(low, group_range[0]), max(high, group_range[1]))
    return found if all(column in found for column in columns) else None


def footer_range(stats: pq.Statistics | None) -> tuple[int, int] | None:
    """A row group's (min, max) of a column from its footer statistics, where they are
    integers: None without them, or for a date or decimal column the spec reads as integers."""
    if stats is None or not stats.has_min_max or not (isinstance(stats.min, int) and isinstance(stats.max, int)):
        return None
    return stats.min, stats.max

"""Contribution bounding by sorting exact integer codes: the Polars engine's one bounding path.

Each row's (unit, partition) pair packs into one Int64, its unit's code above its key's
(`dprun.engines.codes`: exact codes for any column types). Sorting that one column, shard
by shard of units, puts every unit's rows next to each other and every pair's rows next to
each other, so per-partition bounding and the count of each unit's partitions are runs in
a sorted array — an order of magnitude cheaper than a hash group-by over ~10^8 distinct
pairs.

Only units with more than L0 partitions ("heavy" units, usually a small share of the
rows) need a random choice of partitions and, after private partition selection, Plume's
second bounding; their pairs are kept in temporary files. Every other unit keeps all its
partitions in both boundings, so its pairs are summed per partition straight away.
Quantile metrics' weighted leaves follow the same split (`dprun.engines.sorted_quantiles`).

The Spark engine computes the same thing with group-bys and windows: the same scaled
partials, and its own keyed hash of the unit's and the key's values (`xxhash64`, not
`tie_hashes`) to order a heavy unit's partitions of equal rows, so under the test seed both
engines release identical tables wherever no unit has more than L0 partitions.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TypeVar

import numpy as np
import polars as pl

from dprun.engines import compiled, light_units, pair_units, release_steps, sorted_quantiles
from dprun.engines.codes import PACKED, ROWS, Codes, ShardUnits, TableKeys
from dprun.engines.polars_steps import (SELECTION_WEIGHTS, UNITS, row_unit_range, row_units, scaled_partial,
                                        statistics_mismatch)
from dprun.engines.shards import (InputSlices, Shard, UnitsNotClustered, in_parallel_into, packed_rows,
                                  split_into_shards)
from dprun.errors import DataError
from dprun.malloc_tuning import keep_freed_memory
from dprun.mechanisms import bound_choice, selection
from dprun.mechanisms.quantities import Quantity
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan

R = TypeVar("R")
STARTS = "__dprun_starts__"
VALUE = "__dprun_value_"  # + the index of a value column the contribution profile reads


@dataclass
class _Totals:
    """Per key code: privacy units, and each quantity's exact sum of partials. `table` holds
    them side by side (`light_units`): the units, then each quantity's int64 part in the
    order of `sums`."""

    units: np.ndarray
    table: np.ndarray
    sums: dict[str, _ExactSums]

    @classmethod
    def zeros(cls, size: int, quantity_ids: list[str]) -> _Totals:
        table = np.zeros((size, 1 + len(quantity_ids)), np.int64)
        return cls(table[:, 0], table,
                   {qid: _ExactSums(table[:, column]) for column, qid in enumerate(quantity_ids, start=1)})

    def add(self, keys: np.ndarray, partials: dict[str, np.ndarray]) -> None:
        """Add these pairs."""
        if _is_sparse(keys, self.units.size):
            np.add.at(self.units, keys, 1)
            for qid, values in partials.items():
                self.sums[qid].add_sparse(keys, values)
            return
        pairs = np.bincount(keys, minlength=self.units.size)
        self.units += pairs
        for qid, values in partials.items():
            self.sums[qid].add(keys, values, pairs)

    def add_light_units(self, pair_codes: np.ndarray, key_bits: int, max_partitions: int,
                        partials: dict[str, np.ndarray], weights: np.ndarray, loop: compiled.LightUnits | None
                        ) -> np.ndarray:
        """Add the pairs of units with at most `max_partitions` pairs, through the compiled `loop`
        where given, else numpy's passes; return the indices of the other units' pairs.

        `partials`: every quantity's but the weights', in the order of the table's columns; where
        the selection is weighted, w(n) is `weights[n - 1]` (`light_units.add_light_units`)."""
        assert list(partials) == list(self.sums)[:len(partials)], "partials in the order of the table's columns"
        if loop is None:
            return self._add_light_units_by_numpy(pair_codes, key_bits, max_partitions, partials, weights)
        reaches = {qid: _reach(values) for qid, values in partials.items()}
        wide = {qid: values for qid, values in partials.items() if reaches[qid] >= 2**63}
        table_partials = np.zeros((len(partials), pair_codes.size), np.int64)
        for row, (qid, values) in enumerate(partials.items()):
            if qid not in wide:
                table_partials[row] = values
                self.sums[qid].reserve(reaches[qid])
        if weights.size:
            self.sums[SELECTION_WEIGHTS].reserve(int(weights.max()) * pair_codes.size)
        heavy = np.empty(pair_codes.size, np.int64)
        heavy = heavy[:loop(pair_codes, key_bits, max_partitions, weights, table_partials, self.table, heavy)]
        if wide:
            # Sums that int64 could not hold (huge bounds): added exactly, light pairs only.
            light = np.ones(pair_codes.size, dtype=bool)
            light[heavy] = False
            keys = pair_codes[light] & ((1 << key_bits) - 1)
            for qid, values in wide.items():
                self.sums[qid].add_wide(_exact_bincount(keys, values[light], self.units.size))
        return heavy

    def add_light_rows(self, codes: np.ndarray, order: np.ndarray, key_bits: int, max_partitions: int,
                       max_rows: int, values: np.ndarray, kinds: np.ndarray, params: np.ndarray,
                       weights: np.ndarray, most: list[int], loop: compiled.LightRows
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`add_light_units` from a shard's rows' sorted `codes`, their places `order` and their
        `values` (`light_units.add_light_rows`); `most`: the most units a row adds to each quantity
        (the caller makes sure a shard's rows times that times max_rows stays below 2^63).
        Returns the heavy units' pairs: their codes, rows, and partials (a row per quantity)."""
        self._reserve(codes.size, weights, most)
        heavy_codes = np.empty(codes.size, np.int64)
        heavy_rows = np.empty(codes.size, np.int64)
        heavy_partials = np.empty((len(most), codes.size), np.int64)
        found = loop(codes, order, key_bits, max_partitions, max_rows, values, kinds, params, weights, self.table,
                     heavy_codes, heavy_rows, heavy_partials)
        return heavy_codes[:found], heavy_rows[:found], heavy_partials[:, :found]

    def add_light_runs(self, codes: np.ndarray, key_bits: int, max_partitions: int, max_rows: int,
                       values: np.ndarray, kinds: np.ndarray, params: np.ndarray, weights: np.ndarray,
                       most: list[int], loop: compiled.LightRuns) -> np.ndarray | None:
        """`add_light_rows` from a shard's rows in their own order, each unit's rows together
        (`light_units.add_light_runs`); returns the places of the heavy units' rows, in order, or
        None, nothing added, where the rows are not in unit order."""
        self._reserve(codes.size, weights, most)
        heavy_places = np.empty(codes.size, np.int64)
        found = loop(codes, key_bits, max_partitions, max_rows, values, kinds, params, weights, self.table,
                     heavy_places)
        return None if found < 0 else heavy_places[:found]

    def _reserve(self, rows: int, weights: np.ndarray, most: list[int]) -> None:
        """Room in the sums for `rows` rows' pairs: a pair's partial is at most its rows' worth of
        `most`, the most units a row adds to each quantity, and a unit's weight at most the largest."""
        for qid, units in zip(list(self.sums)[:len(most)], most, strict=True):
            self.sums[qid].reserve(units * rows)
        if weights.size:
            self.sums[SELECTION_WEIGHTS].reserve(int(weights.max()) * rows)

    def _add_light_units_by_numpy(self, pair_codes: np.ndarray, key_bits: int, max_partitions: int,
                                  partials: dict[str, np.ndarray], weights: np.ndarray) -> np.ndarray:
        _, per_unit = _runs(pair_codes >> key_bits)
        unit_pairs = np.repeat(per_unit, per_unit)
        light = unit_pairs <= max_partitions
        light_partials = {qid: values[light] for qid, values in partials.items()}
        if weights.size:
            light_partials[SELECTION_WEIGHTS] = weights[unit_pairs[light] - 1]
        self.add(pair_codes[light] & ((1 << key_bits) - 1), light_partials)
        return np.flatnonzero(~light)

    def merge(self, other: _Totals) -> None:
        self.units += other.units
        for qid, sums in other.sums.items():
            self.sums[qid].merge(sums)

    def column(self, qid: str, rows: np.ndarray) -> pl.Series:
        return self.sums[qid].total_of(rows).alias(qid)


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

    Sums stay in int64 (`small`, a column of its `_Totals`' table) while a bound on them (`reach`,
    the sum of |values| added) proves they fit, and are carried into Int128 beyond; np.bincount
    adds in float64, so it is used only where every partial sum stays below 2^53 (else
    `_exact_bincount` splits the values).
    """

    def __init__(self, small: np.ndarray) -> None:
        self.small = small
        self.reach = 0
        self.wide: pl.Series | None = None

    def add(self, keys: np.ndarray, values: np.ndarray, pairs: np.ndarray) -> None:
        """Add each value to its key's sum; `pairs` is np.bincount(keys)."""
        if values.size == 0:
            return
        low, high = int(values.min()), int(values.max())
        reach = max(-low, high) * values.size
        if reach >= 2**53:
            self.add_wide(_exact_bincount(keys, values, self.small.size))
        elif low == high == 1:
            # A partial of one per pair (a count of a column with no missing value, one row per pair) sums to the pairs.
            self._add_small(pairs, reach)
        else:
            sums = np.bincount(keys, weights=values.astype(np.float64), minlength=self.small.size).astype(np.int64)
            self._add_small(sums, reach)

    def add_sparse(self, keys: np.ndarray, values: np.ndarray) -> None:
        """`add` for a few keys (`_is_sparse`): straight into the sums, without a per-key array for them."""
        if values.size == 0:
            return
        reach = _reach(values)
        if reach >= 2**63:
            self.add_wide(_exact_bincount(keys, values, self.small.size))
            return
        self.reserve(reach)
        np.add.at(self.small, keys, values)

    def reserve(self, reach: int) -> None:
        """Make room in the int64 sums for values of this reach (below 2^63), about to be added to them."""
        self._make_room(reach)
        self.reach += reach

    def merge(self, other: _ExactSums) -> None:
        self._add_small(other.small, other.reach)
        if other.wide is not None:
            self.add_wide(other.wide)

    def total_of(self, rows: np.ndarray) -> pl.Series:
        """The sums of these key codes, Int128: gathered first, then widened (the int64 sums are a
        strided column of their table: copying and widening every key code's first took 14.5 ms
        for 987,000 of 10^6 keys, this 7.9)."""
        small = pl.Series(self.small[rows]).cast(pl.Int128)
        return small if self.wide is None else small + self.wide.gather(rows)

    def add_wide(self, sums: pl.Series) -> None:
        self.wide = sums if self.wide is None else self.wide + sums

    def _add_small(self, sums: np.ndarray, reach: int) -> None:
        self.reserve(reach)
        self.small += sums

    def _make_room(self, reach: int) -> None:
        """Carry the int64 sums into Int128 if adding values of this reach could overflow them."""
        if self.reach + reach >= 2**63:
            self.add_wide(pl.Series(np.ascontiguousarray(self.small)).cast(pl.Int128))
            self.small[:] = 0
            self.reach = 0


def _reach(values: np.ndarray) -> int:
    """A bound on any sum of these values: the largest |value| times their number."""
    return _largest_magnitude(values) * values.size


def _largest_magnitude(values: np.ndarray) -> int:
    """max |value| (0 for none), as a Python int: -min(int64) does not fit an int64."""
    return max(-int(values.min()), int(values.max())) if values.size else 0


def _is_sparse(keys: np.ndarray, size: int) -> bool:
    """Whether adding per key is cheaper straight into the running sums (np.add.at, random access
    into them) than through a per-key array of this call's sums (np.bincount: that array is
    allocated, zeroed and added in full, 8 bytes per key code, whatever the number of pairs)."""
    return keys.size * 4 < size


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

    def __init__(self, plan: QueryPlan, rows: pl.LazyFrame, codes: Codes, seed: int, workdir: Path,
                 slices: InputSlices | None = None) -> None:
        self.plan = plan
        self.codes = codes
        self.seed = seed
        summed = [q.quantity for q in plan.quantities
                  if q.quantity.aggregate != "privacy_units" and not q.quantity.is_quantile]
        # A count of rows bounded to one row per pair adds one per pair, as the units do: its
        # sums are the units', so it is not summed apart.
        self.counted_as_units = {q.id for q in summed if q.aggregate == "rows" and q.column is None and plan.max_rows == 1}
        self.quantities = [q for q in summed if q.id not in self.counted_as_units]
        self.quantile_plans = [q for q in plan.quantities if q.quantity.is_quantile]
        self.leaf_columns = [sorted_quantiles.leaf_column(i) for i in range(len(self.quantile_plans))]
        self.value_columns = sorted({q.column for q in self.quantities if q.column is not None})
        self.weighted = release_steps.weighs_units(plan)
        # The sums kept per key: each quantity's, and for a weighted selection the units' weights.
        ids = [q.id for q in self.quantities] + ([SELECTION_WEIGHTS] if self.weighted else [])
        self.chosen: np.ndarray | None = None
        self._table_key_hashes: np.ndarray | None = None
        self._hashing_keys = threading.Lock()
        self.rebound = False
        keep_freed_memory()
        # Loaded while the shards are read (`compiled`).
        self.compiled = compiled.compiled_passes() if codes.rows >= compiled.COMPILED_FROM_ROWS else None
        self.unit_passes = _unit_passes(codes, self.compiled is not None)
        # Value columns go to the shards as they are; their integer units are computed per
        # shard (`_row_values`): one Float64 per row instead of one Int64 per quantity.
        leaves = sorted_quantiles.leaf_columns([q.quantity for q in self.quantile_plans])
        # Units not coded by range are coded once their shard is in memory (`packed_rows`).
        def bound(slices: InputSlices | None) -> tuple[list[_ShardOutput], list[_WorkerTotals]]:
            loads = split_into_shards(rows, codes, seed, workdir, [*self.value_columns, *leaves], slices,
                                      compiled=self.compiled is not None)
            work = [partial(self._bound_shard, load, _ShardOutput.named(workdir, index))
                    for index, load in enumerate(loads)]
            return in_parallel_into(work, partial(_WorkerTotals.zeros, codes.keys.count, ids))

        outputs, (totals, *others) = _by_hash_where_not_clustered(bound, slices)
        for other in others:
            totals.merge(other)
        self.light, self.first_heavy = totals.light, totals.first_heavy
        self.heavy_files = [output.heavy for output in outputs if output.heavy is not None]
        self.leaf_files = [output for output in outputs if output.light_leaves is not None]

    def _row_values(self, shard: pl.DataFrame) -> pl.DataFrame:
        """A shard's packed codes, each value column's non-null flag (where the shard has nulls in
        it: else a pair's present values are its rows), each value quantity's units."""
        present = [pl.col(c).is_not_null().cast(pl.Int32).alias(_present(c)) for c in self.value_columns
                   if shard[c].null_count()]
        values = [row_units(q).fill_null(0).alias(q.id) for q in self.quantities if q.aggregate != "rows"]
        return shard.select(PACKED, *present, *values, *self.leaf_columns)

    def _value_pair_sums(self, shard: pl.DataFrame, passes: compiled.Passes) -> dict[str, np.ndarray] | None:
        """`_pair_sums` of `_row_values`, the same integers, with each value quantity's units
        computed and summed per pair by the compiled pass (`pair_units`); None where the value
        columns are not all numbers or the codes and row places do not fit one Int64."""
        if any(shard[c].dtype != pl.Float64 for c in self.value_columns):
            return None
        _check_codes(shard)
        found = _sorted_with_places(shard, passes)
        if found is None:
            return None
        packed, order = found
        starts, rows = _runs(packed)
        pairs = {PACKED: packed[starts], ROWS: rows, STARTS: starts}
        # A missing value is NaN here: `_as_value` turned NaN into null, and numpy reads null as NaN.
        columns = {c: np.ascontiguousarray(shard[c].to_numpy(), dtype=np.float64) for c in self.value_columns}
        for column, values in columns.items():
            if shard[column].null_count():
                pairs[_present(column)] = passes.pair_unit_sums(values, order, starts, *pair_units.ONE_PER_VALUE)
        for quantity in self.quantities:
            if quantity.aggregate != "rows":
                assert quantity.column is not None
                lower, upper, center, scale, low, high, squared = _unit_params(quantity)
                pairs[quantity.id] = passes.pair_unit_sums(columns[quantity.column], order, starts, lower, upper,
                                                           center, scale, low, high, bool(squared))
        for leaf in self.leaf_columns:
            pairs[leaf] = shard[leaf].to_numpy()[order]
        return pairs

    def _bound_shard(self, load: Shard, files: _ShardOutput, totals: _WorkerTotals
                     ) -> _ShardOutput:
        """Adds a shard's light units, and its heavy units' first bounding, to `totals`; its
        heavy units' pairs, ranked, and its quantities' weighted leaves go to `files`, which
        are returned (the names of those written)."""
        shard, unit_values = packed_rows(load, self.codes, self.seed, self.unit_passes)
        passes = self.compiled.result() if self.compiled is not None else None
        key_bits, l0 = self.codes.key_bits, self.plan.max_partitions
        # w(n) for the partitions n ≤ L0 a light unit of this shard can have.
        weights = (selection.unit_weights(np.arange(1, min(l0, shard.height) + 1)) if self.weighted
                   else np.zeros(0, np.int64))
        heavy = (self._add_light_rows(shard, weights, passes, totals.light, load.in_unit_order)
                 if passes is not None and not self.leaf_columns else None)
        if heavy is not None:
            del shard
            heavy_packed, heavy_rows, heavy_partials = heavy
            files = replace(files, light_leaves=None, heavy_leaves=None)
        else:
            pairs = (self._value_pair_sums(shard, passes) if passes is not None and self.value_columns else None
                     ) or _pair_sums(self._row_values(shard), passes, carried=self.leaf_columns)
            del shard
            heavy_packed, heavy_rows, heavy_partials, files = self._add_light_pairs(pairs, weights, passes,
                                                                                    totals.light, files)
        if self.weighted:
            # A heavy unit's first bounding keeps L0 partitions: each of its pairs weighs w(L0).
            heavy_partials[SELECTION_WEIGHTS] = np.repeat(selection.unit_weights(np.array([l0])), heavy_rows.size)
        ranked = self._ranked_heavy(heavy_packed >> key_bits, heavy_packed & ((1 << key_bits) - 1), heavy_rows,
                                    heavy_partials, unit_values, passes)
        self._add_kept(totals.first_heavy, ranked, None)
        if ranked.height == 0:
            return replace(files, heavy=None)
        ranked.drop(SELECTION_WEIGHTS, strict=False).write_ipc(files.heavy, compression="uncompressed")
        return files

    def _add_light_rows(self, shard: pl.DataFrame, weights: np.ndarray, passes: compiled.Passes, light: _Totals,
                        in_unit_order: bool) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
        """Adds a shard's light units to `light` straight from its rows, without finding its pairs
        first; returns its heavy units' pairs: their codes, rows and partials. Rows `in_unit_order`
        (row groups the footers, or text units coded as they first come, put in unit order) are
        taken as they are where they are (`light_units.add_light_runs`), and only the heavy units'
        rows are sorted; other rows are sorted (`light_units.add_light_rows`).
        None, nothing added, where neither pass can: value columns not all numbers, codes and row
        places not fitting one Int64 together, or a pair's sum times max_rows that could pass Int64."""
        _check_codes(shard)
        key_bits, l0, m = self.codes.key_bits, self.plan.max_partitions, self.plan.max_rows
        # The most units one row adds to each quantity: a pair's sum is at most its rows times that.
        most = [row_unit_range(q)[1] if q.aggregate != "rows" else 1 for q in self.quantities]
        if self.value_columns and (any(shard[c].dtype != pl.Float64 for c in self.value_columns)
                                   or max(most) * m * shard.height >= 2**63):
            return None
        packed = shard[PACKED].to_numpy()
        if not self.value_columns:
            # Counts only: no value is read.
            values = np.zeros((0, shard.height))
        else:
            columns = [np.ascontiguousarray(shard[c].to_numpy(), dtype=np.float64) for c in self.value_columns]
            values = columns[0][np.newaxis] if len(columns) == 1 else np.stack(columns)
        kinds = np.array([(-1 if q.column is None else self.value_columns.index(q.column),
                           light_units.ROWS_KIND if q.aggregate == "rows" else light_units.VALUE_KIND)
                          for q in self.quantities], np.int64).reshape(-1, 2)
        params = np.array([_unit_params(q) for q in self.quantities], np.float64).reshape(-1, 7)
        # The heavy units' rows are sorted after: where their shard's codes fit beside their places, theirs do.
        heavy_places = (light.add_light_runs(packed, key_bits, l0, m, values, kinds, params, weights, most,
                                             passes.add_light_runs)
                        if in_unit_order and (not self.value_columns or packed.size == 0
                                              or _with_places_bits(packed) is not None) else None)
        found = self._sorted_rows(packed if heavy_places is None else packed[heavy_places], passes)
        if found is None:
            return None
        codes, order = found
        if heavy_places is not None and self.value_columns:
            order = heavy_places[order]
        heavy_codes, heavy_rows, heavy_partials = light.add_light_rows(
            codes, order, key_bits, l0, m, values, kinds, params, weights, most, passes.add_light_rows)
        return heavy_codes, heavy_rows, {q.id: partials for q, partials in zip(self.quantities, heavy_partials,
                                                                                strict=True)}

    def _sorted_rows(self, packed: np.ndarray, passes: compiled.Passes) -> tuple[np.ndarray, np.ndarray] | None:
        """Rows' codes sorted, and the order of their places that sorts them (the codes themselves,
        unread, where no quantity reads a value); None where codes and places do not fit one Int64."""
        if packed.size == 0:
            return packed, packed
        if not self.value_columns:
            codes = _sorted_codes(packed, passes)
            return codes, codes
        return _keys_sorted_with_places(packed, passes)

    def _add_light_pairs(self, pairs: dict[str, np.ndarray], weights: np.ndarray, passes: compiled.Passes | None,
                         light: _Totals, files: _ShardOutput
                         ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], _ShardOutput]:
        """Adds the light units of a shard's `pairs` (`_pair_sums`, emptied here) to `light` and
        writes the shard's weighted leaves to `files`; returns its heavy units' pairs (their
        codes, rows and partials) and `files` (the names of those written)."""
        key_bits = self.codes.key_bits
        key_mask = (1 << key_bits) - 1
        leaves = [pairs.pop(column) for column in self.leaf_columns]
        starts = pairs.pop(STARTS)
        pair_packed = pairs.pop(PACKED)
        rows_per_pair = pairs[ROWS]
        partials = {q.id: self._partial(q, pairs) for q in self.quantities}
        pairs.clear()
        loop = passes.add_light_units if passes is not None else None
        heavy = light.add_light_units(pair_packed, key_bits, self.plan.max_partitions, partials, weights, loop)
        if leaves:
            heavy_pairs = np.zeros(pair_packed.size, dtype=bool)
            heavy_pairs[heavy] = True
            light_leaves, heavy_leaves = sorted_quantiles.shard_leaves(
                leaves, starts, rows_per_pair, pair_packed & key_mask, pair_packed >> key_bits,
                heavy_pairs, self.plan.max_rows)
            light_leaves.write_ipc(files.light_leaves, compression="uncompressed")
            heavy_leaves.write_ipc(files.heavy_leaves, compression="uncompressed")
        else:
            files = replace(files, light_leaves=None, heavy_leaves=None)
        return pair_packed[heavy], rows_per_pair[heavy], {qid: values[heavy] for qid, values in partials.items()}, files

    def _partial(self, quantity: Quantity, pairs: dict[str, np.ndarray]) -> np.ndarray:
        """Each pair's partial, bounded to max_rows rows' worth (the Spark engine's `_partials` computes the same)."""
        m = self.plan.max_rows
        present = pairs[ROWS] if quantity.column is None else pairs.get(_present(quantity.column), pairs[ROWS])
        if quantity.aggregate == "rows":
            return np.minimum(present, m)
        total = pairs[quantity.id]
        over = np.flatnonzero(present > m)
        if over.size == 0:
            return total
        result = total.copy()
        result[over] = _scaled_partials(total[over], present[over], m)
        return result

    def _ranked_heavy(self, unit_code: np.ndarray, key_code: np.ndarray, rows: np.ndarray,
                      partials: dict[str, np.ndarray], unit_values: Callable[[np.ndarray], pl.DataFrame],
                      passes: compiled.Passes | None) -> pl.DataFrame:
        """A heavy unit's pairs in the order that chooses them: most rows first (the partitions that hold
        most of the unit's own rows), ties by a keyed hash of the unit's and the partition's values
        (`tie_hashes`). Each unit's values are found and hashed once, not once per pair. Unit and
        key codes in 32 bits where they fit (`_narrow`): the pairs go to disk for the second
        bounding (Plume's data: 10^7 heavy pairs, 232 MB written and read back, 77 MB in 32 bits)."""
        starts, lengths = _runs(unit_code)
        unit_hashes = value_hashes(unit_values(unit_code[starts]), self.seed)
        hashes = tie_hashes(np.repeat(unit_hashes, lengths), self._key_hashes(key_code))
        # Whatever the order, each unit keeps at most L0 pairs.
        order = _choice_order(np.repeat(np.arange(starts.size), lengths), np.asarray(rows, dtype=np.int64), hashes,
                              passes)
        return pl.DataFrame({"unit": _narrow(unit_code[order]), "key": _narrow(key_code[order]),
                             **{qid: values[order] for qid, values in partials.items()}})

    def _key_hashes(self, key_code: np.ndarray) -> np.ndarray:
        """The keyed hash of each code's key values (`value_hashes` with the keys' own secret):
        every key code's values hashed once, by the first shard that asks (gathering a text key's
        values for every heavy pair took longer than the rest of its ranking; decoding a range's
        for every heavy pair took 2.8 ms a shard of the Plume data). As many hashes as key codes:
        the running totals hold several numbers per key code already."""
        keys = self.codes.keys
        with self._hashing_keys:
            if self._table_key_hashes is None:
                values = keys.table if isinstance(keys, TableKeys) else keys.values(np.arange(keys.count))
                self._table_key_hashes = value_hashes(values, key_seed(self.seed))
        return self._table_key_hashes[key_code]

    def _add_kept(self, totals: _Totals, ranked: pl.DataFrame, chosen: np.ndarray | None) -> None:
        """Add to `totals` the ranked heavy pairs each unit keeps: its L0 first-ranked pairs,
        among the chosen keys only if given (Plume's second bounding); in one compiled pass
        where the passes are loaded and the sums' bound fits Int64 (`ranked_pairs`)."""
        if ranked.height == 0:
            return
        partials = {qid: ranked[qid].to_numpy() for qid in totals.sums}
        reaches = [_reach(values) for values in partials.values()]
        if self.compiled is None or max(reaches, default=0) >= 2**63:
            kept = self._kept(ranked, chosen)
            totals.add(ranked["key"].to_numpy()[kept], {qid: values[kept] for qid, values in partials.items()})
            return
        for sums, reach in zip(totals.sums.values(), reaches, strict=True):
            sums.reserve(reach)
        table_partials = (np.stack(list(partials.values())).astype(np.int64, copy=False) if partials
                          else np.zeros((0, ranked.height), np.int64))
        self.compiled.result().add_ranked_pairs(
            ranked["unit"].to_numpy().astype(np.int64), ranked["key"].to_numpy().astype(np.int64), table_partials,
            np.zeros(0, bool) if chosen is None else chosen, self.plan.max_partitions, totals.table)

    def _kept(self, ranked: pl.DataFrame, chosen: np.ndarray | None) -> np.ndarray:
        """The rows of the ranked heavy pairs each unit keeps: its L0 first-ranked pairs, among
        the chosen keys only if given."""
        keys = ranked["key"].to_numpy()
        candidates = np.flatnonzero(chosen[keys]) if chosen is not None else np.arange(ranked.height)
        return candidates[_rank_within_runs(ranked["unit"].to_numpy()[candidates]) < self.plan.max_partitions]

    def _rebound_heavy(self) -> _Totals:
        """Plume's second bounding of the heavy units, among the chosen keys."""
        work = [partial(self._add_kept_from, path) for path in self.heavy_files]
        _, (totals, *others) = in_parallel_into(work, partial(_Totals.zeros, self.codes.keys.count,
                                                               [q.id for q in self.quantities]))
        for other in others:
            totals.merge(other)
        return totals

    def _add_kept_from(self, path: Path, totals: _Totals) -> None:
        self._add_kept(totals, pl.read_ipc(path), self.chosen)

    def unit_counts(self) -> pl.DataFrame:
        """col : (key, privacy units after the first bounding, and for a weighted selection the sum of
        their weights) for keys with at least one unit."""
        units = self.light.units + self.first_heavy.units
        present = np.flatnonzero(units)
        found = self.codes.keys.values(present).with_columns(pl.Series(UNITS, units[present]))
        if not self.weighted:
            return found
        weights = self.light.column(SELECTION_WEIGHTS, present) + self.first_heavy.column(SELECTION_WEIGHTS, present)
        return found.with_columns(weights.cast(pl.Int64).alias(SELECTION_WEIGHTS))

    def restrict(self, chosen: pl.DataFrame, rebound: bool) -> None:
        """Keep the chosen partitions only; with `rebound`, bound heavy units again among them (Plume)."""
        self.chosen = np.zeros(self.codes.keys.count, dtype=bool)
        codes = self.codes.keys.codes_of(chosen)
        assert codes.null_count() == 0, "chosen partitions have units, so they have codes"
        self.chosen[codes.to_numpy()] = True
        self.rebound = rebound

    def partition_sums(self) -> pl.DataFrame:
        """col : (key, units, exact Int128 sum per quantity) for keys with at least one unit."""
        heavy = self._rebound_heavy() if self.rebound else self.first_heavy
        units = self.light.units + heavy.units
        if self.chosen is not None:
            units = np.where(self.chosen, units, 0)
        present = np.flatnonzero(units)
        columns = [pl.Series(UNITS, units[present])]
        for noisy in self.plan.quantities:
            qid = noisy.quantity.id
            if noisy.quantity.aggregate == "privacy_units" or qid in self.counted_as_units:
                columns.append(pl.Series(qid, units[present]).cast(pl.Int128))
            elif not noisy.quantity.is_quantile:
                columns.append((self.light.column(qid, present) + heavy.column(qid, present)).alias(qid))
        return pl.concat([self.codes.keys.values(present), pl.DataFrame(columns)], how="horizontal")

    def quantiles(self, partitions: pl.DataFrame, source: RandomSource) -> dict[str, dict[float, np.ndarray]]:
        """Every quantile quantity's answers for `partitions`, by quantity id, in the plan's order."""
        chosen = self.chosen if self.rebound else None
        heavy = [(self._kept_pairs(output.heavy, chosen), output.heavy_leaves) for output in self.leaf_files
                 if output.heavy is not None and output.heavy_leaves is not None]
        light = [output.light_leaves for output in self.leaf_files if output.light_leaves is not None]
        codes = self.codes.keys.codes_of(partitions)
        return {noisy.quantity.id: release_steps.answer_quantile(
                    noisy, self.plan, sorted_quantiles.leaf_table(position, light, heavy, codes), partitions.height,
                    source)
                for position, noisy in enumerate(self.quantile_plans)}

    def _kept_pairs(self, heavy: Path, chosen: np.ndarray | None) -> pl.DataFrame:
        """col : (unit, key) of the heavy pairs in this file that their units keep."""
        ranked = pl.read_ipc(heavy, columns=["unit", "key"])
        return ranked[self._kept(ranked, chosen)]


def _narrow(codes: np.ndarray) -> np.ndarray:
    """Codes (never negative) as UInt32 where they all fit, else as they are."""
    return codes.astype(np.uint32) if codes.size and int(codes.max()) < 2**32 else codes


@dataclass(frozen=True)
class _ShardOutput:
    """A shard's files: its heavy units' ranked pairs, and its light and heavy units' weighted
    leaves (`sorted_quantiles.shard_leaves`); None where the shard wrote none."""

    heavy: Path | None
    light_leaves: Path | None
    heavy_leaves: Path | None

    @classmethod
    def named(cls, folder: Path, index: int) -> _ShardOutput:
        return cls(*(folder / f"{kind}-{index}.arrow" for kind in ("heavy", "leaves", "heavy-leaves")))


@dataclass
class _Profile:
    """A worker's share of the contribution histogram, of the picks per key code and of the value histograms."""

    cells: np.ndarray
    unit_rows: np.ndarray
    picks: np.ndarray
    values: np.ndarray
    kept_rows: np.ndarray
    kept_pairs: np.ndarray

    def merge(self, other: _Profile) -> None:
        self.cells += other.cells
        self.unit_rows += other.unit_rows
        self.picks += other.picks
        self.values += other.values
        self.kept_rows += other.kept_rows
        self.kept_pairs += other.kept_pairs


def contribution_profile(plan: QueryPlan, rows: pl.LazyFrame, codes: Codes, seeds: tuple[int, int], workdir: Path,
                         slices: InputSlices | None = None) -> bound_choice.ContributionProfile:
    """The exact histograms `auto` bounds are chosen from, shard by shard of units (memory: the
    shards being sorted, and one count per key code).

    Per unit, its partitions and the rows of the pair with the smallest keyed hash of its unit's
    and partition's values (`seeds`: the sharding key, then the picking key); per partition,
    the units that picked it; per value column, each unit's rows' value cells, weighed to one
    count per unit (`bound_choice.unit_value_weights`); per candidate bound, the units' kept
    shares (`bound_choice.kept_weights`). Codes only say which rows belong together: which
    pair a unit picks depends on its own values."""
    choice = plan.bound_choice
    assert choice is not None, "a query with auto bounds"
    shard_seed, pick_seed = seeds
    value_columns = {f"{VALUE}{i}": pl.col(c).cast(pl.Float64) for i, c in enumerate(choice.value_columns)}
    # Loaded while the shards are read, for the radix sort (`compiled`).
    loading = compiled.compiled_passes() if codes.rows >= compiled.COMPILED_FROM_ROWS else None
    unit_passes = _unit_passes(codes, loading is not None)

    def new_profile() -> _Profile:
        return _Profile(np.zeros(choice.shape, dtype=np.int64),
                        np.zeros(len(bound_choice.UNIT_ROWS_CANDIDATES) + 1, dtype=np.int64),
                        np.zeros(codes.keys.count, dtype=np.int64),
                        np.zeros((len(value_columns), bound_choice.VALUE_CELLS), dtype=np.int64),
                        np.zeros((len(bound_choice.KEPT_CAPS), len(choice.l0_options), len(choice.rows_options)),
                                 dtype=np.int64),
                        np.zeros(len(choice.l0_options), dtype=np.int64))

    def profile_shard(load: Shard, found: _Profile) -> None:
        shard, unit_values = packed_rows(load, codes, shard_seed, unit_passes)
        if value_columns:
            units = shard[PACKED].to_numpy() >> codes.key_bits
            for index, name in enumerate(value_columns):
                found.values[index] += _value_weights(units, shard[name])
        passes = loading.result() if loading is not None else None
        pairs = _pair_sums(shard.select(PACKED), passes)
        del shard
        unit_code = pairs[PACKED] >> codes.key_bits
        key_code = pairs[PACKED] & ((1 << codes.key_bits) - 1)
        values = pl.concat([unit_values(unit_code), codes.keys.values(key_code)], how="horizontal")
        hashes = values.select(pl.struct(values.columns).hash(pick_seed))[:, 0].to_numpy()
        starts, lengths = _runs(unit_code)
        # Sorted by unit, then hash: each unit's first pair is the one it picks.
        order = _choice_order(np.repeat(np.arange(starts.size), lengths), np.zeros(unit_code.size, np.int64), hashes,
                              passes)
        picked = order[starts]
        found.cells += bound_choice.histogram(lengths, pairs[ROWS][picked], choice)
        if starts.size:
            found.unit_rows += bound_choice.unit_rows_histogram(np.add.reduceat(pairs[ROWS], starts))
        found.picks += np.bincount(key_code[picked], minlength=codes.keys.count)
        kept_rows, kept_pairs = bound_choice.runs_kept_weights(pairs[ROWS], starts, lengths, choice)
        found.kept_rows += kept_rows
        found.kept_pairs += kept_pairs

    def profile(slices: InputSlices | None) -> tuple[list[None], list[_Profile]]:
        loads = split_into_shards(rows, codes, shard_seed, workdir, [e.alias(n) for n, e in value_columns.items()],
                                  slices, compiled=loading is not None)
        return in_parallel_into([partial(profile_shard, load) for load in loads], new_profile)

    _, (total, *others) = _by_hash_where_not_clustered(profile, slices)
    for other in others:
        total.merge(other)
    return bound_choice.ContributionProfile(total.cells, total.unit_rows,
                                            bound_choice.size_histogram(total.picks[total.picks > 0]),
                                            total.kept_rows, total.kept_pairs, total.values)


def _by_hash_where_not_clustered(bound: Callable[[InputSlices | None], R], slices: InputSlices | None) -> R:
    """`bound(slices)`, or where its shards of row groups turn out to share a unit
    (`shards.clustered_shards`), `bound(None)`: the rows sharded by hash, every total afresh."""
    try:
        return bound(slices)
    except UnitsNotClustered:
        return bound(None)


def _unit_passes(codes: Codes, compiled_path: bool) -> Future[compiled.UnitPasses] | None:
    """The compiled passes of units coded per shard, loading in a thread, where the query has
    such units and its shards are bounded by the compiled passes."""
    return compiled.compiled_unit_passes() if compiled_path and isinstance(codes.units, ShardUnits) else None


def _value_weights(unit_code: np.ndarray, values: pl.Series) -> np.ndarray:
    """One value column's histogram in a shard: its finite values only (nulls and NaN add nothing)."""
    present = values.is_finite().fill_null(False).to_numpy()
    numbers = values.to_numpy()[present]
    return bound_choice.unit_value_weights(unit_code[present], bound_choice.value_cells(numbers))


def _pair_sums(shard: pl.DataFrame, passes: compiled.Passes | None, carried: Sequence[str] = ()
               ) -> dict[str, np.ndarray]:
    """Per (unit, partition) pair, in packed order: its code, its rows, the sum of every other column
    except the `carried` ones, given per row in packed order, and where each pair's rows start.

    A pair's rows are a run in the sorted codes, so np.add.reduceat sums them (no hashing).
    """
    _check_codes(shard)
    order: np.ndarray | None = None
    if shard.width == 1:
        packed = _sorted_codes(shard[PACKED].to_numpy(), passes)
    elif (found := _sorted_with_places(shard, passes)) is not None:
        packed, order = found
    else:
        # Polars' single-threaded sort, one per worker (its own threads would only compete with
        # the other workers), carries the other columns along.
        shard = shard.sort(PACKED, multithreaded=False)
        packed = shard[PACKED].to_numpy()
    starts, rows = _runs(packed)
    pairs = {PACKED: packed[starts], ROWS: rows, STARTS: starts}
    for column in [name for name in shard.columns if name != PACKED]:
        values = shard[column].to_numpy() if order is None else shard[column].to_numpy()[order]
        if column in carried:
            pairs[column] = values
        elif starts.size:
            pairs[column] = np.add.reduceat(values, starts, dtype=np.int64)
        else:
            pairs[column] = values[:0].astype(np.int64)
    return pairs


def _sorted_codes(packed: np.ndarray, passes: compiled.Passes | None) -> np.ndarray:
    """A shard's lone column of codes sorted, in place where it is a copy already (a shard read from several files)."""
    return _sorted(packed if packed.flags.writeable else packed.copy(), 0,
                   int(packed.max()).bit_length() if packed.size else 0, passes)


def _unit_params(quantity: Quantity) -> tuple[float, float, float, float, float, float, float]:
    """How a row's value becomes the quantity's integer units in the compiled passes
    (`pair_units.pair_unit_sums`' arguments after `starts`, the last 1.0 for squared), as
    `row_units` computes them; zeros for a count, which reads no value."""
    if quantity.aggregate == "rows":
        return (0.0,) * 7
    low, high = row_unit_range(quantity)
    lower = -math.inf if quantity.lower is None else quantity.lower
    upper = math.inf if quantity.upper is None else quantity.upper
    return (float(lower), float(upper), float(quantity.center), math.ldexp(1.0, -quantity.unit_exponent),
            float(low), float(high), float(quantity.aggregate == "centered_sumsq"))


def _check_codes(shard: pl.DataFrame) -> None:
    """Every row has a code, and the shard's pair sums fit Int64."""
    if shard[PACKED].null_count():
        raise statistics_mismatch()
    if shard.height >= 2**32:
        # A row is at most 2^30 units (VALUE_BITS), so a pair's Int64 sum is exact below 2^33 rows.
        raise DataError("over 2^32 rows fell into one shard of privacy units, more than the sorted path sums exactly;"
                        " split the input")


def _scaled_partials(total: np.ndarray, present: np.ndarray, max_rows: int) -> np.ndarray:
    """`scaled_partial` of pairs with more than max_rows rows: floor(total · max_rows / present),
    in int64 where no product can overflow (Polars' Int128 expression took six times as long)."""
    if _largest_magnitude(total) * max_rows < 2**63:
        return total * max_rows // present
    return pl.select(scaled_partial(pl.lit(pl.Series(total)).cast(pl.Int128), pl.lit(pl.Series(present)),
                                    max_rows)).to_series().cast(pl.Int64).to_numpy()


def _sorted_with_places(shard: pl.DataFrame, passes: compiled.Passes | None
                        ) -> tuple[np.ndarray, np.ndarray] | None:
    """The shard's packed codes sorted, and the order of its rows that sorts them; None where a
    code and a row's place in the shard do not fit one Int64 together (`_keys_sorted_with_places`).

    That takes a third of the time of Polars' sort of the frame, which spends most of it
    finding that order (gathering the columns in that order comes on top). `UnitMix` keeps
    codes short enough.
    """
    if shard.height == 0:
        return None
    return _keys_sorted_with_places(shard[PACKED].to_numpy(), passes)


def _with_places_bits(keys: np.ndarray) -> int | None:
    """The bits that non-empty keys take with their places beside them (`_keys_sorted_with_places`);
    None where a key is negative or they would pass 63."""
    high_bit = int(keys.max()).bit_length() + _place_bits(keys)
    return None if int(keys.min()) < 0 or high_bit > 63 else high_bit


def _place_bits(keys: np.ndarray) -> int:
    return max(1, (keys.size - 1).bit_length())


def _keys_sorted_with_places(keys: np.ndarray, passes: compiled.Passes | None
                             ) -> tuple[np.ndarray, np.ndarray] | None:
    """Non-empty keys sorted, and the order that sorts them, equal keys in place order; None where
    a key and its place do not fit one Int64 together.

    Each key and its place are sorted as one number, key above place: the places are then the order.
    """
    high_bit = _with_places_bits(keys)
    if high_bit is None:
        return None
    place_bits = _place_bits(keys)
    # In place where numpy allows: a shard's arrays are 16 MB, each pass spared 1–2 ms (29 → 24 ms at 2^21 keys).
    keyed = np.left_shift(keys, place_bits)
    keyed |= np.arange(keys.size, dtype=np.int64)
    keyed = _sorted(keyed, place_bits, high_bit, passes)
    places = keyed & ((1 << place_bits) - 1)
    keyed >>= place_bits
    return keyed, places


def _choice_order(runs: np.ndarray, rows: np.ndarray, hashes: np.ndarray, passes: compiled.Passes | None
                  ) -> np.ndarray:
    """The order that sorts pairs by their unit's run (non-decreasing from 0), then most rows first,
    then hash, then place: np.lexsort((hashes, -rows, runs)).

    numpy sorts each pair as one Int64 instead: its run, its rows and as many top bits of its
    hash as fit beside its place (`_keys_sorted_with_places`; np.lexsort took a fifth of the
    bounding of the Plume benchmark's heavy units, ten times this sort). Pairs whose run, rows
    and top hash bits agree are then in place order; only those are sorted again by their whole hashes.
    """
    if runs.size == 0:
        return np.zeros(0, dtype=np.int64)
    most = int(rows.max())
    rows_bits, run_bits = most.bit_length(), int(runs[-1]).bit_length()
    hash_bits = 63 - max(1, (runs.size - 1).bit_length()) - rows_bits - run_bits
    if hash_bits < 16:
        return np.lexsort((hashes, -rows, runs))
    keys = runs << (rows_bits + hash_bits)
    keys |= (most - rows) << hash_bits
    keys |= (hashes >> np.uint64(64 - hash_bits)).astype(np.int64)
    found = _keys_sorted_with_places(keys, passes)
    assert found is not None, "the keys leave room for the places"
    keys, order = found
    tied = keys[1:] == keys[:-1]
    if tied.any():
        in_tie = np.zeros(runs.size, dtype=bool)
        in_tie[1:] |= tied
        in_tie[:-1] |= tied
        places = np.flatnonzero(in_tie)
        tied_order = order[places]
        # By key first, so each group of equal keys stays where it is.
        order[places] = tied_order[np.lexsort((tied_order, hashes[tied_order], keys[places]))]
    return order


def _sorted(keys: np.ndarray, low_bit: int, high_bit: int, passes: compiled.Passes | None) -> np.ndarray:
    """Writable keys in 0 .. 2^high_bit − 1 (codes are never negative) sorted by their bits from
    `low_bit` up, equal ones in their order, where the bits below are places or nothing (then
    numpy's sort of the whole keys orders them alike): by the compiled radix sort where it is
    loaded and faster on this processor, else by numpy's, in place."""
    if passes is not None and passes.radix_beats_numpy:
        return passes.radix_sort(keys, np.empty_like(keys), low_bit, high_bit)
    keys.sort()
    return keys


def _present(column: str) -> str:
    return f"__dprun_present_{column}__"


# Xored into the run's secret for the keys' hashes (`key_seed`): a unit and a partition key of
# equal values do not hash alike.
KEY_SEED_TWEAK = 0x5851F42D4C957F2D


def key_seed(seed: int) -> int:
    """The secret the partition keys' values are hashed with for `tie_hashes`."""
    return seed ^ KEY_SEED_TWEAK


def value_hashes(values: pl.DataFrame, seed: int) -> np.ndarray:
    """Each row's keyed 64-bit hash of its values (uint64)."""
    return values.select(pl.struct(values.columns).hash(seed)).to_series().to_numpy()


def tie_hashes(unit_hashes: np.ndarray, key_hashes: np.ndarray) -> np.ndarray:
    """Each (unit, partition) pair's hash, which orders a unit's pairs of equal rows
    (`SortedBounding._ranked_heavy`), from its unit's values' hash (`value_hashes` with the
    run's secret) and its key's (with `key_seed`): the key's times an odd constant, xored into
    the unit's, through MurmurHash3's 64-bit finalizer. Each step is a bijection, so a unit's
    partitions keep distinct hashes where their keys' differ, spread over the whole range, and
    another unit orders them differently."""
    mixed = unit_hashes ^ (key_hashes * np.uint64(0x9E3779B97F4A7C15))
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        mixed ^= mixed >> np.uint64(33)
        mixed *= np.uint64(multiplier)
    mixed ^= mixed >> np.uint64(33)
    return mixed


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


def _rank_within_runs(sorted_values: np.ndarray) -> np.ndarray:
    """0, 1, 2, … within each run of equal values."""
    starts, lengths = _runs(sorted_values)
    return np.arange(sorted_values.size) - np.repeat(starts, lengths)


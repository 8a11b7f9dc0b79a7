"""Execute a plan with Polars' streaming engine.

The steps are [DPP21]'s computation graph in Plume's order ([Plume22]):

1. scan, join the inputs a join names (a public lookup from memory; a private input cut
   first to its rows per unit), keep the needed columns, filter, drop rows whose privacy
   unit is null; public partitions: drop rows of unlisted keys first, so no unit spends its
   L0 on them;
2. per (unit, partition): partial integer sums, each bounded to `max_rows` rows' worth;
3. cross-partition bounding: each unit keeps at most L0 partitions, chosen by a keyed
   hash of (unit, partition) with a fresh secret key per run — uniformly at random and
   independently of every other unit's data;
4. partition selection (private partitions), then, with a separate selection, Plume's
   second bounding: step 3 again on the partials of the selected partitions only;
5. per-partition sums, then the engine-neutral release (`dprun.engines.release_steps`):
   noise from the plan, post-processing (`dprun.postprocess`).

Per-partition bounding (step 2) scales a unit's partial sums by min(rows, m) / rows
instead of sampling m rows: the result is the expected value of sampling m rows
uniformly at random, has the same sensitivity (|partial| ≤ m · max units), needs no
randomness and runs as one streaming group-by. See docs/mechanisms.md.

Steps 2–4 run one of two ways with the same result: by hash group-bys (`HashBounding`,
any column types, quantiles), or, when the unit and the key are single integer
columns, by sorting packed codes (`dprun.engines.sorted_bounding`, much faster).

The engine never computes a sensitivity, a noise scale or a threshold; it reads them
from the plan and calls `dprun.mechanisms` to draw noise and select partitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from dprun.engines import release_steps
from dprun.engines.polars_steps import (
    GLOBAL_KEY,
    LEAF,
    PARTITION,
    UNITS,
    WEIGHT,
    collect,
    row_units,
    scaled_partial,
    sink,
    truncated,
    truncation_key,
)
from dprun.engines.sorted_bounding import SortedBounding, codes_for, packable
from dprun.mechanisms.quantile_tree import unit_weight_expr
from dprun.mechanisms.quantities import Quantity
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import NoisyQuantity, QueryPlan
from dprun.spec.input_schema import InputInfo, lookup_table, scan, with_derived
from dprun.spec.row_expressions import row_filter

HASH = "__dprun_hash__"
SHARD = "__dprun_shard__"
PRESENT = "__dprun_present__"
# Input bytes per shard of units: Parquet expands several-fold in memory, CSV/NDJSON much less.
SHARD_BYTES = 32 * 2**20
TEXT_BYTES_FACTOR = 4
SHARD_SEED_MASK = 0x5DEECE66D


def run_query(plan: QueryPlan, info: InputInfo, source: RandomSource, workdir: Path) -> pl.DataFrame:
    """The DP output of one query: one row per released partition, keys then metrics.

    `workdir` is a private temporary folder for intermediate files (the caller removes it).
    """
    keys = release_steps.partition_keys(plan)
    seed, truncation_seed, _, _ = source.hash_seeds()
    bounding = _bounding(plan, info, keys, (seed, truncation_seed), workdir)
    mode = plan.selection.mode
    if mode == "private" and plan.selection.mechanism != "released_count":
        chosen = release_steps.chosen_partitions(plan, bounding.unit_counts(), source)
        bounding.restrict(chosen, rebound=plan.selection.second_bounding)
        sums = release_steps.with_all_keys(bounding.partition_sums(), chosen, plan)
    elif mode == "private":
        sums = bounding.partition_sums()
    else:
        sums = release_steps.with_all_keys(bounding.partition_sums(), release_steps.public_keys(plan), plan)

    def quantiles(partitions: pl.DataFrame) -> dict[str, dict[float, np.ndarray]]:
        # Only the hash path runs quantiles (`packable` sends them there).
        return bounding.quantiles(partitions, source) if isinstance(bounding, HashBounding) else {}

    return release_steps.release_table(plan, sums, source, quantiles)


def _bounding(plan: QueryPlan, info: InputInfo, keys: list[str], seeds: tuple[int, int], workdir: Path) -> Bounding:
    """The sorted fast path where the unit and key pack into integers, else the general hash path.

    `seeds`: the run's secret keys for the cross-partition choice and for truncating the
    private inputs of a join."""
    seed, truncation_seed = seeds
    rows = _rows(plan, info, keys, truncation_seed)
    if packable(plan, dict(rows.collect_schema()), keys[0]):
        codes = codes_for(rows, plan.privacy_unit[0], keys[0], info, _fan_out(plan))
        if codes is not None:
            return SortedBounding(plan, rows, codes, seed, workdir)
    return HashBounding(plan, rows, info, keys, seed, workdir)


def _fan_out(plan: QueryPlan) -> int:
    """The most rows one row of the query's input becomes in its join: the product of the
    bounds of the private inputs joined to it (a lookup adds at most one row)."""
    return math.prod(join.max_rows_per_unit or 1 for join in plan.joins)


class HashBounding:
    """Both contribution boundings by hash group-bys over per-(unit, partition) partials.

    Works for any column types; also keeps what quantiles (trees or candidates) need.
    """

    def __init__(self, plan: QueryPlan, rows: pl.LazyFrame, info: InputInfo, keys: list[str], seed: int,
                 workdir: Path) -> None:
        self.plan, self.keys, self.seed = plan, keys, seed
        self.shards = _partial_shards(plan, rows, info, keys, seed, workdir)
        # col : (unit, partition keys, partial per quantity), one file per shard of units
        self.partials = [pl.scan_parquet(shard.partials) for shard in self.shards]
        self.bounded = [_cross_partition_bound(shard, plan, keys, seed) for shard in self.partials]

    def unit_counts(self) -> pl.DataFrame:
        """col : (partition keys, privacy units after the first bounding)."""
        counts = _combine([b.group_by(self.keys).agg(pl.len().cast(pl.Int64).alias(UNITS)) for b in self.bounded],
                          self.keys)
        return counts if counts.width else pl.DataFrame(schema={**_key_schema(self.partials, self.keys), UNITS: pl.Int64})

    def restrict(self, chosen: pl.DataFrame, rebound: bool) -> None:
        """Keep the chosen partitions only; with `rebound`, bound again among them (Plume)."""
        if rebound:
            self.bounded = [_cross_partition_bound(_semi(shard, chosen, self.keys), self.plan, self.keys, self.seed)
                            for shard in self.partials]
        else:
            self.bounded = [_semi(frame, chosen, self.keys) for frame in self.bounded]

    def partition_sums(self) -> pl.DataFrame:
        return _partition_sums(self.bounded, self.partials, self.plan, self.keys)

    def quantiles(self, partitions: pl.DataFrame, source: RandomSource) -> dict[str, dict[float, np.ndarray]]:
        """Every quantile quantity's answers for `partitions`, by quantity id."""
        return {q.quantity.id: _quantiles(q, self.plan, self.shards, self.bounded, partitions, self.keys, source)
                for q in self.plan.quantities if q.quantity.is_quantile}


Bounding = HashBounding | SortedBounding


def _semi(frame: pl.LazyFrame, chosen: pl.DataFrame, keys: list[str]) -> pl.LazyFrame:
    return frame.join(chosen.lazy(), on=keys, how="semi", nulls_equal=True)


def _shard_count(info: InputInfo, fan_out: int = 1) -> int:
    """Shards of units so that one shard's (unit, partition) table fits in memory.

    Decided from the input files' sizes only (a public fact), never from their contents; a
    join can make each input row into `fan_out` rows.
    """
    total = sum(path.stat().st_size for path in info.paths) * fan_out
    per_shard = SHARD_BYTES if info.format == "parquet" else SHARD_BYTES * TEXT_BYTES_FACTOR
    return max(1, math.ceil(total / per_shard))


@dataclass(frozen=True)
class Shard:
    """Files of one shard of units: per-(unit, partition) partials, and per-(unit, partition, leaf) tree weights."""

    partials: Path
    trees: dict[str, Path]


def _partial_shards(plan: QueryPlan, rows: pl.LazyFrame, info: InputInfo, keys: list[str], seed: int,
                    workdir: Path) -> list[Shard]:
    """Write the per-(unit, partition) partials of `rows`, sharded by a hash of the unit, to `workdir`.

    Every unit's rows land in one shard, so contribution bounding runs shard by shard
    exactly as on the whole; each shard is one streaming group-by in bounded memory.
    """
    count = _shard_count(info, _fan_out(plan))
    if count == 1:
        return [_write_shard(rows, plan, keys, workdir, 0)]
    rows_dir = workdir / "rows"
    shard_of_unit = pl.struct(list(plan.privacy_unit)).hash(seed ^ SHARD_SEED_MASK) % count
    sink(rows.with_columns(shard_of_unit.alias(SHARD)), pl.PartitionBy(str(rows_dir), key=SHARD, include_key=False),
         workdir)
    shards = []
    for index in range(count):
        files = sorted((rows_dir / f"{SHARD}={index}").glob("*.parquet"))
        if files:
            shards.append(_write_shard(pl.scan_parquet(files), plan, keys, workdir, index))
    return shards


def _write_shard(rows: pl.LazyFrame, plan: QueryPlan, keys: list[str], workdir: Path, index: int) -> Shard:
    partials = workdir / f"partials-{index}.parquet"
    sink(_partials(rows, plan, keys), partials, workdir)
    trees = {}
    for position, noisy in enumerate(plan.quantities):
        if noisy.quantity.is_quantile:
            trees[noisy.quantity.id] = workdir / f"tree-{position}-{index}.parquet"
            sink(_leaf_weights(rows, noisy.quantity, plan, keys), trees[noisy.quantity.id], workdir)
    return Shard(partials, trees)


def _leaf_weights(rows: pl.LazyFrame, quantity: Quantity, plan: QueryPlan, keys: list[str]) -> pl.LazyFrame:
    """col : (unit, partition keys, leaf, weight), one row per value: a unit's n values in a partition weigh min(n, m)/n each."""
    pair = [*plan.privacy_unit, *keys]
    assert quantity.column is not None
    leaf = release_steps.leaf_expr(quantity)
    leaves = rows.select(*pair, leaf.alias(LEAF)).drop_nulls(LEAF)
    per_pair = leaves.group_by(pair).agg(pl.len().cast(pl.Int64).alias(PRESENT))
    weight = unit_weight_expr(pl.col(PRESENT), plan.max_rows)
    return leaves.join(per_pair, on=pair, nulls_equal=True).select(*pair, LEAF, weight.alias(WEIGHT))


def _quantiles(
    noisy: NoisyQuantity, plan: QueryPlan, shards: list[Shard], bounded: list[pl.LazyFrame],
    partitions: pl.DataFrame, keys: list[str], source: RandomSource,
) -> dict[float, np.ndarray]:
    """Every level asked of one quantile quantity (a tree or candidates), answered for every partition."""
    quantity = noisy.quantity
    pair = [*plan.privacy_unit, *keys]
    # col : (partition keys, leaf, weight) of the (unit, partition) pairs that survived bounding
    per_shard = [
        pl.scan_parquet(shard.trees[quantity.id])
        .join(kept.select(pair), on=pair, how="semi", nulls_equal=True)
        .group_by([*keys, LEAF]).agg(pl.col(WEIGHT).cast(pl.Int128).sum())
        for shard, kept in zip(shards, bounded, strict=True)
    ]
    leaf_weights = _combine(per_shard, [*keys, LEAF])
    indexed = partitions.with_row_index(PARTITION).with_columns(pl.col(PARTITION).cast(pl.Int64))
    if leaf_weights.width == 0:
        table = pl.DataFrame(schema={"partition": pl.Int64, "leaf": pl.Int64, "weight": pl.Int128})
    else:
        table = leaf_weights.join(indexed, on=keys, how="inner", nulls_equal=True).select(
            pl.col(PARTITION).alias("partition"), pl.col(LEAF).alias("leaf"), pl.col(WEIGHT).alias("weight"))
    return release_steps.answer_quantile(noisy, plan, table, partitions.height, source)


def _combine(frames: list[pl.LazyFrame], keys: list[str]) -> pl.DataFrame:
    """Per-shard partition aggregates, collected one shard at a time and summed."""
    parts = [collect(frame) for frame in frames]
    if len(parts) <= 1:
        return parts[0] if parts else pl.DataFrame()
    stacked = pl.concat(parts)
    return stacked.group_by(keys).agg(pl.col(c).sum() for c in stacked.columns if c not in keys)


def _key_schema(partials: list[pl.LazyFrame], keys: list[str]) -> dict[str, pl.DataType]:
    schema = dict(partials[0].collect_schema()) if partials else {}
    return {key: schema.get(key, pl.Int8()) for key in keys}


def _rows(plan: QueryPlan, info: InputInfo, keys: list[str], truncation_seed: int) -> pl.LazyFrame:
    columns = {*plan.privacy_unit, *plan.group_by}
    columns |= {q.quantity.column for q in plan.quantities if q.quantity.column is not None}
    frame = with_derived(_joined_input(plan, info, truncation_seed), dict(plan.derive))
    if plan.filter is not None:
        frame = frame.filter(row_filter(plan.filter))
    frame = frame.select(sorted(columns))
    frame = frame.filter(pl.all_horizontal(pl.col(c).is_not_null() for c in plan.privacy_unit))
    if not plan.group_by:
        frame = frame.with_columns(pl.lit(0, dtype=pl.Int8).alias(GLOBAL_KEY))
    if plan.selection.mode == "public":
        frame = frame.join(plan.public_keys.lazy(), on=keys, how="semi", nulls_equal=True)
    value_columns = {q.quantity.column for q in plan.quantities if q.quantity.column is not None}
    # NaN is treated as a missing value: one NaN must never turn a released number into NaN.
    return frame.with_columns(
        pl.col(c).cast(pl.Float64).fill_nan(None) for c in sorted(value_columns)
    )


def _joined_input(plan: QueryPlan, info: InputInfo, seed: int) -> pl.LazyFrame:
    """The query's input: its private input joined with the inputs its spec joins, in order.

    A public lookup is small: joined from memory (`lookup_table`), the private side streams
    past it. A private input joined on the privacy unit is first cut to its rows per unit
    (`truncated`), as is the query's own input when its bound is set.
    """
    units = list(plan.privacy_unit)
    bounds = plan.truncation

    def private(name: str, frame: pl.LazyFrame, position: int) -> pl.LazyFrame:
        bound = bounds.get(name)
        return frame if bound is None else truncated(frame, units, bound, truncation_key(seed, position))

    frame = private(plan.private_input, scan(info), 1)
    for position, joined in enumerate(info.joins, start=2):
        other = lookup_table(joined).lazy() if joined.public else private(joined.info.name, scan(joined.info), position)
        frame = frame.join(other, on=list(joined.on), how=joined.how)
    return frame


def _partials(rows: pl.LazyFrame, plan: QueryPlan, keys: list[str]) -> pl.LazyFrame:
    """One row per (unit, partition): each quantity's partial, bounded to max_rows rows' worth."""
    m = plan.max_rows
    aggregations: list[pl.Expr] = []
    for noisy in plan.quantities:
        q = noisy.quantity
        if q.aggregate == "privacy_units" or q.is_quantile:
            continue
        present = pl.col(q.column).count() if q.column is not None else pl.len()
        if q.aggregate == "rows":
            aggregations.append(pl.min_horizontal(present, pl.lit(m)).cast(pl.Int64).alias(q.id))
            continue
        total = row_units(q).cast(pl.Int128).sum()
        aggregations.append(scaled_partial(total, present, m).alias(q.id))
    if not aggregations:
        aggregations.append(pl.len().alias(UNITS))
    return rows.group_by([*plan.privacy_unit, *keys]).agg(aggregations)


def _cross_partition_bound(partials: pl.LazyFrame, plan: QueryPlan, keys: list[str], seed: int) -> pl.LazyFrame:
    """Keep, for each unit, the L0 partitions with the smallest keyed hash of (unit, partition).

    Which partitions a unit keeps depends only on its own rows and the run's secret key,
    so the L0 bound holds exactly whatever the hash; the key only makes the choice
    unpredictable and fresh per run (Polars' hash takes one 64-bit key). Only units with
    more than L0 partitions need ranking, and they are few, so only they are ranked.
    """
    units = list(plan.privacy_unit)
    hashed = partials.with_columns(pl.struct([*units, *keys]).hash(seed).alias(HASH))
    over_limit = hashed.group_by(units).agg(pl.len().alias(UNITS)).filter(pl.col(UNITS) > plan.max_partitions)
    within = hashed.join(over_limit, on=units, how="anti", nulls_equal=True)
    # An ordinal rank keeps exactly L0 even if two of a unit's partitions hashed alike.
    rank = pl.col(HASH).rank(method="ordinal").over(units)
    cut = hashed.join(over_limit, on=units, how="semi", nulls_equal=True).filter(rank <= plan.max_partitions)
    return pl.concat([within, cut]).drop(HASH)


def _partition_sums(
    bounded: list[pl.LazyFrame], partials: list[pl.LazyFrame], plan: QueryPlan, keys: list[str]
) -> pl.DataFrame:
    """col : (partition keys, units, exact Int128 sum per quantity), summed over shards."""
    aggregations = [pl.len().cast(pl.Int64).alias(UNITS)]
    for noisy in plan.quantities:
        q = noisy.quantity
        if q.is_quantile:
            continue
        column = pl.len() if q.aggregate == "privacy_units" else pl.col(q.id).cast(pl.Int128).sum()
        aggregations.append(column.cast(pl.Int128).alias(q.id))
    sums = _combine([frame.group_by(keys).agg(aggregations) for frame in bounded], keys)
    if sums.width > 0:
        return sums
    schema: dict[str, pl.DataType] = {**_key_schema(partials, keys), UNITS: pl.Int64()}
    schema |= {q.quantity.id: pl.Int128() for q in plan.quantities if not q.quantity.is_quantile}
    return pl.DataFrame(schema=schema)

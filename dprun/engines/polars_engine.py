"""Execute a plan with Polars' streaming engine.

The steps are [DPP21]'s computation graph in Plume's order ([Plume22]):

1. scan, join the inputs a join names (a public lookup from memory; a private input cut
   first to its rows per unit), keep the needed columns, filter, drop rows whose privacy
   unit is null; public partitions: drop rows of unlisted keys first, so no unit spends its
   L0 on them;
2. per (unit, partition): partial integer sums, each bounded to `max_rows` rows' worth;
3. cross-partition bounding: each unit keeps at most L0 partitions, those with the most
   of its rows, ties by a keyed hash of (unit, partition) with a fresh secret key per run —
   from its own rows only, independently of every other unit's data;
4. partition selection (private partitions), then, with a separate selection, Plume's
   second bounding: step 3 again on the partials of the selected partitions only;
5. per-partition sums, then the engine-neutral release (`dprun.engines.release_steps`):
   noise from the plan, post-processing (`dprun.postprocess`).

Per-partition bounding (step 2) scales a unit's partial sums by min(rows, m) / rows
instead of sampling m rows: the result is the expected value of sampling m rows
uniformly at random, has the same sensitivity (|partial| ≤ m · max units) and needs no
randomness. See docs/mechanisms.md.

Steps 2–4 run for every query, whatever its columns' types and metrics, in one way: on
exact integer codes of each row's unit and partition (`dprun.engines.codes`), sorted shard
by shard of units (`dprun.engines.sorted_bounding`, quantile leaves in
`dprun.engines.sorted_quantiles`).

The engine never computes a sensitivity, a noise scale or a threshold; it reads them
from the plan and calls `dprun.mechanisms` to draw noise and select partitions.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import polars as pl

from dprun.engines import release_steps, sorted_bounding
from dprun.engines.codes import Codes, codes_for
from dprun.engines.polars_steps import GLOBAL_KEY, truncated, truncation_key
from dprun.engines.shards import InputSlices
from dprun.engines.sorted_bounding import SortedBounding
from dprun.mechanisms.bound_choice import ContributionProfile
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan
from dprun.spec.input_schema import InputInfo, lookup_table, scan, with_derived
from dprun.spec.row_expressions import row_filter


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

    return release_steps.release_table(plan, sums, source, lambda partitions: bounding.quantiles(partitions, source))


def contribution_profile(plan: QueryPlan, info: InputInfo, source: RandomSource, workdir: Path) -> ContributionProfile:
    """The exact histograms `auto` bounds are chosen from (`bound_choice`), on the sorted path:
    per unit, its number of partitions and the rows of one of its (unit, partition) pairs
    picked by a keyed hash of their values; per partition, the units that picked it. Private:
    the caller adds the noise. `workdir`: a private folder for the shards (the caller removes it)."""
    keys = release_steps.partition_keys(plan)
    shard_seed, truncation_seed, pick_seed, _ = source.hash_seeds()
    rows = _rows(plan, info, keys, truncation_seed)
    codes = _codes(plan, info, keys, truncation_seed, rows)
    return sorted_bounding.contribution_profile(plan, rows, codes, (shard_seed, pick_seed), workdir,
                                                _input_slices(plan, info, keys, truncation_seed))


def _bounding(plan: QueryPlan, info: InputInfo, keys: list[str], seeds: tuple[int, int], workdir: Path
              ) -> SortedBounding:
    """Both contribution boundings of the query's rows, by sorting exact codes of (unit, partition).

    `seeds`: the run's secret keys for the cross-partition choice and for truncating the
    private inputs of a join."""
    seed, truncation_seed = seeds
    rows = _rows(plan, info, keys, truncation_seed)
    codes = _codes(plan, info, keys, truncation_seed, rows)
    return SortedBounding(plan, rows, codes, seed, workdir, _input_slices(plan, info, keys, truncation_seed))


def _codes(plan: QueryPlan, info: InputInfo, keys: list[str], truncation_seed: int, rows: pl.LazyFrame) -> Codes:
    """The codes of the query's `rows`; a pass that finds them reads the rows before those without
    a unit are dropped, without the unit columns where it needs no unit's range (`codes_for`)."""
    return codes_for(rows, plan, keys, info, _fan_out(plan), _rows(plan, info, keys, truncation_seed, with_units=False))


def _input_slices(plan: QueryPlan, info: InputInfo, keys: list[str], truncation_seed: int) -> InputSlices | None:
    """The query's rows from any slice of its input's rows, where each of its rows comes from one
    input row alone: a Parquet input without partition folders, no join, no cut per unit."""
    if info.format != "parquet" or info.partitions or plan.joins or plan.truncation:
        return None
    return InputSlices(info.paths, lambda paths, offset, length: _rows(plan, replace(info, paths=paths), keys,
                                                                      truncation_seed, (offset, length)),
                       in_order=plan.selection.mode != "public")


def _fan_out(plan: QueryPlan) -> int:
    """The most rows one row of the query's input becomes in its join: the product of the
    bounds of the private inputs joined to it (a lookup adds at most one row)."""
    return math.prod(join.max_rows_per_unit or 1 for join in plan.joins)


def _rows(plan: QueryPlan, info: InputInfo, keys: list[str], truncation_seed: int,
          input_rows: tuple[int, int] | None = None, with_units: bool = True) -> pl.LazyFrame:
    """The query's rows, from the input's rows `offset, length` only where `input_rows` gives them;
    without `with_units`, also those whose privacy unit is null (which never count)."""
    columns = {*plan.privacy_unit, *plan.group_by}
    columns |= {q.quantity.column for q in plan.quantities if q.quantity.column is not None}
    frame = with_derived(_joined_input(plan, info, truncation_seed, input_rows), dict(plan.derive))
    if plan.filter is not None:
        frame = frame.filter(row_filter(plan.filter))
    frame = frame.select(sorted(columns))
    if with_units:
        frame = frame.filter(pl.all_horizontal(pl.col(c).is_not_null() for c in plan.privacy_unit))
    if not plan.group_by:
        frame = frame.with_columns(pl.lit(0, dtype=pl.Int8).alias(GLOBAL_KEY))
    if plan.selection.mode == "public":
        frame = frame.join(plan.public_keys.lazy(), on=keys, how="semi", nulls_equal=True)
    value_columns = {q.quantity.column for q in plan.quantities if q.quantity.column is not None}
    schema = frame.collect_schema()
    return frame.with_columns(_as_value(c, schema[c]) for c in sorted(value_columns))


def _as_value(column: str, dtype: pl.DataType) -> pl.Expr:
    """A value column: a number or Boolean as float64, NaN as missing (one NaN must never turn a
    released number into NaN); any other type (a text column a `count` counts, perhaps a key too)
    as it is, since a count only asks whether each row has a value."""
    if dtype.is_numeric() or dtype == pl.Boolean:
        return pl.col(column).cast(pl.Float64).fill_nan(None)
    return pl.col(column)


def _joined_input(plan: QueryPlan, info: InputInfo, seed: int, input_rows: tuple[int, int] | None
                  ) -> pl.LazyFrame:
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

    own = scan(info) if input_rows is None else scan(info).slice(*input_rows)
    frame = private(plan.private_input, own, 1)
    for position, joined in enumerate(info.joins, start=2):
        other = lookup_table(joined).lazy() if joined.public else private(joined.info.name, scan(joined.info), position)
        frame = frame.join(other, on=list(joined.on), how=joined.how)
    return frame

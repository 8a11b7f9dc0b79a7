"""Execute a plan with Polars' streaming engine.

The steps are seed 003's computation graph in Plume's order (seed 004):

1. scan, keep the needed columns, filter, drop rows whose privacy unit is null;
   public partitions: drop rows of unlisted keys first, so no unit spends its L0 on them;
2. per (unit, partition): partial integer sums, each bounded to `max_rows` rows' worth;
3. cross-partition bounding: each unit keeps at most L0 partitions, chosen by a keyed
   hash of (unit, partition) with a fresh secret key per run — uniformly at random and
   independently of every other unit's data;
4. partition selection (private partitions), then, with a separate selection, Plume's
   second bounding: step 3 again on the partials of the selected partitions only;
5. per-partition sums, noise from the plan, post-processing (`dprun.postprocess`).

Per-partition bounding (step 2) scales a unit's partial sums by min(rows, m) / rows
instead of sampling m rows: the result is the expected value of sampling m rows
uniformly at random, has the same sensitivity (|partial| ≤ m · max units), needs no
randomness and runs as one streaming group-by. See docs/mechanisms.md.

The engine never computes a sensitivity, a noise scale or a threshold; it reads them
from the plan and calls `dprun.mechanisms` to draw noise and select partitions.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from dprun.errors import DataError
from dprun.mechanisms import selection
from dprun.mechanisms.noise import add_noise
from dprun.mechanisms.quantities import Quantity
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan
from dprun.postprocess import metric_columns
from dprun.spec.input_schema import InputInfo, scan

GLOBAL_KEY = "__dprun_partition__"
UNITS = "__dprun_units__"
HASH = "__dprun_hash__"
STREAMING = "streaming"


def run_query(plan: QueryPlan, info: InputInfo, source: RandomSource) -> pl.DataFrame:
    """The DP output of one query: one row per released partition, keys then metrics."""
    keys = list(plan.group_by) or [GLOBAL_KEY]
    seed = source.hash_seeds()[0]
    rows = _rows(plan, info, keys)
    partials = _partials(rows, plan, keys)
    bounded = _cross_partition_bound(partials, plan, keys, seed)
    mode = plan.selection.mode
    if mode == "private" and plan.selection.mechanism != "released_count":
        unit_counts = _collect(bounded.group_by(keys).agg(pl.len().alias(UNITS)))
        keep = selection.select_partitions(plan.selection.detail, unit_counts[UNITS].to_numpy(), source)
        chosen = unit_counts.filter(pl.Series(keep)).select(keys)
        if plan.selection.second_bounding:
            bounded = _cross_partition_bound(partials.join(chosen.lazy(), on=keys, how="semi"), plan, keys, seed)
        else:
            bounded = bounded.join(chosen.lazy(), on=keys, how="semi")
        sums = _with_all_keys(_collect(_partition_sums(bounded, plan, keys)), chosen, plan)
    elif mode == "private":
        sums = _collect(_partition_sums(bounded, plan, keys))
    else:
        all_keys = _public_keys(plan, keys)
        sums = _with_all_keys(_collect(_partition_sums(bounded, plan, keys)), all_keys, plan)
    noisy = {q.quantity.id: add_noise(sums[q.quantity.id], q.quantity.unit_exponent, q.noise, source)
             for q in plan.quantities}
    released = np.ones(sums.height, dtype=bool)
    if mode == "private" and plan.selection.mechanism == "released_count":
        released = _released_count_keep(plan, sums, noisy)
    output = sums.select(keys).with_columns(metric_columns(plan, noisy)).filter(pl.Series(released))
    if not plan.group_by:
        output = output.drop(GLOBAL_KEY)
    return output.sort(list(plan.group_by), nulls_last=True) if plan.group_by else output


def _collect(frame: pl.LazyFrame) -> pl.DataFrame:
    try:
        return frame.collect(engine=STREAMING)
    except pl.exceptions.PolarsError as exc:
        # Polars' messages can quote data values; only the kind of failure is passed on.
        raise DataError(f"the data could not be processed ({type(exc).__name__}); "
                        "check the input files and column types") from None


def _rows(plan: QueryPlan, info: InputInfo, keys: list[str]) -> pl.LazyFrame:
    columns = {*plan.privacy_unit, *plan.group_by}
    columns |= {q.quantity.column for q in plan.quantities if q.quantity.column is not None}
    frame = scan(info)
    if plan.filter is not None:
        frame = frame.filter(pl.sql_expr(plan.filter))
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


def _units(quantity: Quantity) -> pl.Expr:
    """A row's value in integer units of the quantity: clamped, centred, rounded, clipped."""
    value = pl.col(quantity.column).clip(quantity.lower, quantity.upper) - quantity.center
    if quantity.aggregate == "centered_sumsq":
        value = value * value
    scaled = (value * math.ldexp(1.0, -quantity.unit_exponent)).round()
    low = 0 if quantity.aggregate == "centered_sumsq" else -quantity.max_units
    return scaled.clip(low, quantity.max_units).cast(pl.Int64)


def _partials(rows: pl.LazyFrame, plan: QueryPlan, keys: list[str]) -> pl.LazyFrame:
    """One row per (unit, partition): each quantity's partial, bounded to max_rows rows' worth."""
    m = plan.max_rows
    aggregations: list[pl.Expr] = []
    for noisy in plan.quantities:
        q = noisy.quantity
        if q.aggregate == "privacy_units":
            continue
        present = pl.col(q.column).count() if q.column is not None else pl.len()
        if q.aggregate == "rows":
            aggregations.append(pl.min_horizontal(present, pl.lit(m)).cast(pl.Int64).alias(q.id))
            continue
        total = _units(q).cast(pl.Int128).sum()
        kept = pl.min_horizontal(present, pl.lit(m)).cast(pl.Int128)
        # floor(total · kept / present) stays within ±kept · max_units, so L∞ = m · max_units holds.
        scaled = pl.when(present > 0).then((total * kept) // present.cast(pl.Int128)).otherwise(0)
        aggregations.append(scaled.cast(pl.Int128).alias(q.id))
    if not aggregations:
        aggregations.append(pl.len().alias(UNITS))
    return rows.group_by([*plan.privacy_unit, *keys]).agg(aggregations)


def _cross_partition_bound(partials: pl.LazyFrame, plan: QueryPlan, keys: list[str], seed: int) -> pl.LazyFrame:
    """Keep, for each unit, the L0 partitions with the smallest keyed hash of (unit, partition).

    Which partitions a unit keeps depends only on its own rows and the run's secret key,
    so the L0 bound holds exactly whatever the hash; the key only makes the choice
    unpredictable and fresh per run (Polars' hash takes one 64-bit key).
    """
    units = list(plan.privacy_unit)
    hashed = partials.with_columns(
        pl.struct([*units, *keys]).hash(seed).alias(HASH)
    )
    rank = pl.col(HASH).rank(method="ordinal").over(units)
    return hashed.filter(rank <= plan.max_partitions).drop(HASH)


def _partition_sums(bounded: pl.LazyFrame, plan: QueryPlan, keys: list[str]) -> pl.LazyFrame:
    aggregations = [pl.len().cast(pl.Int64).alias(UNITS)]
    for noisy in plan.quantities:
        q = noisy.quantity
        if q.aggregate == "privacy_units":
            aggregations.append(pl.len().cast(pl.Int128).alias(q.id))
        else:
            aggregations.append(pl.col(q.id).cast(pl.Int128).sum().alias(q.id))
    return bounded.group_by(keys).agg(aggregations)


def _public_keys(plan: QueryPlan, keys: list[str]) -> pl.DataFrame:
    if plan.public_keys is not None:
        return plan.public_keys
    return pl.DataFrame({GLOBAL_KEY: [0]}, schema={GLOBAL_KEY: pl.Int8})


def _with_all_keys(sums: pl.DataFrame, all_keys: pl.DataFrame, plan: QueryPlan) -> pl.DataFrame:
    """Every listed key, with zero sums where no bounded data fell into it (empty partitions get noise too)."""
    joined = all_keys.join(sums, on=all_keys.columns, how="left", nulls_equal=True)
    value_columns = [UNITS, *(q.quantity.id for q in plan.quantities)]
    return joined.with_columns(pl.col(c).fill_null(0) for c in value_columns)


def _released_count_keep(plan: QueryPlan, sums: pl.DataFrame, noisy: dict[str, np.ndarray]) -> np.ndarray:
    """Keep partitions with at least min_privacy_units units whose released count reaches the plan's threshold."""
    select = plan.selection
    assert select.threshold_quantity is not None and select.threshold is not None
    enough_units = sums[UNITS].to_numpy() >= select.min_privacy_units
    return enough_units & (noisy[select.threshold_quantity] >= select.threshold)

"""The steps after exact per-partition aggregation, the same for every engine.

An engine bounds contributions and sums them per partition exactly (on this machine or
on a cluster); what happens to those sums is decided here, on the driver, on Polars
tables: which partitions a private selection keeps, which listed partitions are added
empty, the noise, the quantile answers and the post-processing into released metrics.
Both `polars_engine` and `spark_engine` call these, so their releases agree step for step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import numpy as np
import polars as pl

from dprun.engines.polars_steps import GLOBAL_KEY, SELECTION_WEIGHTS, UNITS, key_order
from dprun.mechanisms import selection
from dprun.mechanisms.noise import NoisePlan, add_noise
from dprun.mechanisms.quantile_candidates import (
    CandidateGrid,
    CandidatePlan,
    answer_candidates,
)
from dprun.mechanisms.quantile_tree import TreeShape, answer_quantiles
from dprun.mechanisms.quantities import Quantity
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import NoisyQuantity, QueryPlan
from dprun.postprocess import metric_columns

# Private selection draws for this many candidates at a time (`chosen_in_key_order`).
DRAW_CHUNK = 1 << 20
# partitions → {quantile quantity id: {level: answer per partition}}
QuantileAnswers = Callable[[pl.DataFrame], dict[str, dict[float, np.ndarray]]]


def partition_keys(plan: QueryPlan) -> list[str]:
    """The columns a query's partitions are keyed by: its group-by, or one constant column."""
    return list(plan.group_by) or [GLOBAL_KEY]


def chosen_partitions(plan: QueryPlan, unit_counts: pl.DataFrame, source: RandomSource) -> pl.DataFrame:
    """The keys private partition selection keeps, from col : (keys, privacy units after the first
    bounding, and for a weighted selection SELECTION_WEIGHTS), in any order."""
    keys = partition_keys(plan)
    in_order = unit_counts.sort(key_order(unit_counts.select(keys).schema), nulls_last=True)
    return chosen_in_key_order(plan, [in_order], source)


def chosen_in_key_order(plan: QueryPlan, sorted_counts: Iterable[pl.DataFrame], source: RandomSource
                        ) -> pl.DataFrame:
    """`chosen_partitions` of the candidates given as consecutive frames in `key_order`, of any sizes.

    The draws are made DRAW_CHUNK candidates at a time in key order, whatever the engine or the
    sharding: how a sampler consumes random bytes depends on how many draws it makes at once, so
    fixed chunks give every engine the same release under a test seed, and no engine holds more than
    one chunk of draws.
    """
    keys = partition_keys(plan)
    assert plan.selection.detail is not None, "a private selection's plan names its mechanism"
    kept = []
    for chunk in _in_chunks(sorted_counts, DRAW_CHUNK):
        weights = chunk[SELECTION_WEIGHTS].to_numpy() if SELECTION_WEIGHTS in chunk.columns else None
        keep = selection.select_partitions(plan.selection.detail, chunk[UNITS].to_numpy(), source, weights)
        kept.append(chunk.filter(pl.Series(keep, dtype=pl.Boolean)).select(keys))
    return pl.concat(kept)


def _in_chunks(frames: Iterable[pl.DataFrame], size: int) -> Iterator[pl.DataFrame]:
    """The rows of `frames`, in order, as frames of `size` rows but the last; no rows: one empty frame
    (so there must be a frame, which gives the schema)."""
    held: list[pl.DataFrame] = []
    rows = 0
    given = False
    for frame in frames:
        held.append(frame)
        rows += frame.height
        while rows >= size:
            joined = pl.concat(held)
            yield joined.head(size)
            given = True
            held, rows = [joined.slice(size)], rows - size
    assert held, "the candidates come as one frame at least"
    if rows or not given:
        yield pl.concat(held)


def weighs_units(plan: QueryPlan) -> bool:
    """The selection needs each partition's SELECTION_WEIGHTS besides its unit count."""
    return isinstance(plan.selection.detail, selection.WeightedGaussianThreshold)


def public_keys(plan: QueryPlan) -> pl.DataFrame:
    """Every partition a query with public partitions releases (one, without a group-by)."""
    if plan.public_keys is not None:
        return plan.public_keys
    return pl.DataFrame({GLOBAL_KEY: [0]}, schema={GLOBAL_KEY: pl.Int8})


def with_all_keys(sums: pl.DataFrame, all_keys: pl.DataFrame, plan: QueryPlan) -> pl.DataFrame:
    """Every listed key, with zero sums where no bounded data fell into it (empty partitions get noise too)."""
    joined = all_keys.join(sums, on=all_keys.columns, how="left", nulls_equal=True)
    value_columns = [UNITS, *(q.quantity.id for q in plan.quantities if not q.quantity.is_quantile)]
    return joined.with_columns(pl.col(c).fill_null(0) for c in value_columns)


def tree_shape(quantity: Quantity) -> TreeShape:
    assert quantity.lower is not None and quantity.upper is not None
    return TreeShape(quantity.lower, quantity.upper, quantity.branching, quantity.depth)


def candidate_grid(quantity: Quantity) -> CandidateGrid:
    assert quantity.lower is not None and quantity.upper is not None
    return CandidateGrid(quantity.lower, quantity.upper, quantity.candidates)


def leaf_expr(quantity: Quantity) -> pl.Expr:
    """The leaf (tree) or slot (candidates) of each value of a quantile quantity's column; null for null/NaN."""
    assert quantity.column is not None
    if quantity.aggregate == "quantile_candidates":
        return candidate_grid(quantity).slot_expr(quantity.column)
    return tree_shape(quantity).leaf_expr(quantity.column)


def _levels_asked(plan: QueryPlan, noisy: NoisyQuantity) -> list[float]:
    """The levels asked of one quantile quantity, sorted (a tree answers every metric that shares it)."""
    return sorted({level for m in plan.metrics if noisy.quantity.id in m.quantity_ids for level in m.levels})


def answer_quantile(noisy: NoisyQuantity, plan: QueryPlan, leaf_weights: pl.DataFrame, partitions: int,
                    source: RandomSource) -> dict[float, np.ndarray]:
    """One quantile quantity's answers per level, from col : (partition, leaf, weight) of the bounded rows."""
    levels = _levels_asked(plan, noisy)
    quantity, mechanism = noisy.quantity, noisy.noise
    if isinstance(mechanism, CandidatePlan):
        answers = answer_candidates(leaf_weights, partitions, candidate_grid(quantity), list(quantity.levels),
                                    plan.max_rows, mechanism, source)
        by_level = dict(zip(quantity.levels, answers.T, strict=True))
        return {level: by_level[level] for level in levels}
    assert isinstance(mechanism, NoisePlan)
    answers = answer_quantiles(leaf_weights, partitions, tree_shape(quantity), levels, mechanism, source)
    return {level: answers[:, index] for index, level in enumerate(levels)}


def release_table(plan: QueryPlan, sums: pl.DataFrame, source: RandomSource,
                  quantiles: QuantileAnswers) -> pl.DataFrame:
    """The DP output of one query from its exact sums: one row per released partition, keys then metrics.

    `sums` is col : (partition keys, units, exact Int128 sum per quantity), one row per
    partition that may be released, in any order; `quantiles` answers the quantile quantities
    for the partitions it is given, in their order.
    """
    in_order = sums.sort(key_order(sums.select(partition_keys(plan)).schema), nulls_last=True)
    return release_in_key_order(plan, [in_order], source, quantiles)


def release_in_key_order(plan: QueryPlan, sorted_sums: Iterable[pl.DataFrame], source: RandomSource,
                         quantiles: QuantileAnswers) -> pl.DataFrame:
    """`release_table` of sums given as consecutive frames in `key_order`, of any sizes.

    Noise is drawn DRAW_CHUNK partitions at a time, in key order (as `chosen_in_key_order`): per
    chunk, each quantity's noise in the plan's order, then the quantile answers of the partitions
    the chunk releases.
    """
    output = pl.concat([_released_chunk(plan, chunk, source, quantiles)
                        for chunk in _in_chunks(sorted_sums, DRAW_CHUNK)])
    return output.drop(GLOBAL_KEY) if not plan.group_by else output


def _released_chunk(plan: QueryPlan, sums: pl.DataFrame, source: RandomSource,
                    quantiles: QuantileAnswers) -> pl.DataFrame:
    keys = partition_keys(plan)
    # col : (partition keys, exact integer sum per quantity) → noisy real values per quantity
    noisy = {q.quantity.id: add_noise(sums[q.quantity.id], q.quantity.unit_exponent, _noise(q), source)
             for q in plan.quantities if not q.quantity.is_quantile}
    if plan.selection.mode == "private" and plan.selection.mechanism == "released_count":
        # Quantiles are answered for the partitions released only: a partition's answers are
        # independent of whether it is released, so drawing them for the others changes no output.
        released = _released_count_keep(plan, sums, noisy)
        sums = sums.filter(pl.Series(released, dtype=pl.Boolean))
        noisy = {name: values[released] for name, values in noisy.items()}
    partitions = sums.select(keys)
    return partitions.with_columns(metric_columns(plan, noisy, quantiles(partitions)))


def _released_count_keep(plan: QueryPlan, sums: pl.DataFrame, noisy: dict[str, np.ndarray]) -> np.ndarray:
    """Keep partitions with at least min_privacy_units units whose released count reaches the plan's threshold."""
    select = plan.selection
    assert select.threshold_quantity is not None and select.threshold is not None
    enough_units = sums[UNITS].to_numpy() >= select.min_privacy_units
    return enough_units & (noisy[select.threshold_quantity] >= select.threshold)


def _noise(noisy: NoisyQuantity) -> NoisePlan:
    assert isinstance(noisy.noise, NoisePlan), "only quantiles are answered by candidates"
    return noisy.noise

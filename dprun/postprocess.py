"""Metrics from noisy quantities: post-processing only, so it costs no privacy budget.

mean     = mid + S / max(1, C), clamped to [lower, upper]
variance = SS / max(1, C) − (S / max(1, C))², clamped to [0, ((upper − lower)/2)²]
stddev   = √variance
where C is the noisy row count, S the noisy sum of values centred on mid = (lower+upper)/2
and SS the noisy sum of their squares ([DPP21], "Computing MEAN, VARIANCE").
Counts are rounded to integers (exact already under discrete Laplace noise). With
`clamp`, counts and sums are released within their feasible range: counts at least 0,
sums at least 0 when both bounds are (at most 0 when both are at most 0).
Quantiles come from one quantile mechanism per column and bounds (a noisy tree or candidates),
monotone in q; they are clamped to the metric's bounds, and a tree with one leaf per whole
number gives whole numbers (rounded; both are monotone, so the order of the levels stays).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from dprun.plan import MetricPlan, QueryPlan


Answers = dict[str, dict[float, np.ndarray]]


def metric_columns(plan: QueryPlan, noisy: dict[str, np.ndarray], answers: Answers) -> list[pl.Series]:
    columns: list[pl.Series] = []
    for metric in plan.metrics:
        if metric.levels:
            columns += _quantile_columns(plan, metric, answers[metric.quantity_ids[0]])
        else:
            columns.append(_metric(metric, noisy))
    return columns


def _quantile_columns(plan: QueryPlan, metric: MetricPlan, by_level: dict[float, np.ndarray]) -> list[pl.Series]:
    """One column per level, within the metric's bounds; a tree with one leaf per whole number gives whole numbers."""
    assert metric.bounds is not None
    whole = plan.quantity(metric.quantity_ids[0]).quantity.whole
    columns = []
    for name, level in zip(metric.output_columns, metric.levels, strict=True):
        values = np.clip(by_level[level], *metric.bounds)
        columns.append(pl.Series(name, np.rint(values) if whole else values))
    return columns


def _metric(metric: MetricPlan, noisy: dict[str, np.ndarray]) -> pl.Series:
    name = metric.output_columns[0]
    values = [noisy[qid] for qid in metric.quantity_ids]
    if metric.kind in ("count", "privacy_id_count"):
        count = np.rint(values[0]).astype(np.int64)
        return pl.Series(name, np.maximum(count, 0) if metric.clamp else count)
    assert metric.bounds is not None
    lower, upper = metric.bounds
    if metric.kind == "sum":
        feasible = (0.0 if lower >= 0 else -np.inf, 0.0 if upper <= 0 else np.inf)
        return pl.Series(name, np.clip(values[0], *feasible) if metric.clamp else values[0])
    center, half = (lower + upper) / 2, (upper - lower) / 2
    count = np.maximum(1.0, values[0])
    centered_mean = values[1] / count
    if metric.kind == "mean":
        return pl.Series(name, np.clip(center + centered_mean, lower, upper))
    variance = np.clip(values[2] / count - centered_mean**2, 0.0, half * half)
    if metric.kind == "variance":
        return pl.Series(name, variance)
    return pl.Series(name, np.sqrt(variance))


def released_rows(table: pl.DataFrame, plan: QueryPlan) -> pl.DataFrame:
    """The released table after a query's HAVING, ORDER BY and LIMIT (from SQL), which act on the
    released values only: post-processing. Expressions are of the released columns, row-wise
    (`row_expressions` checks them)."""
    from dprun.spec.row_expressions import row_filter

    post = plan.postprocess
    if post is None:
        return table
    if post.having is not None:
        table = table.filter(row_filter(post.having, "postprocess.having"))
    if post.order_by:
        table = table.sort([row_filter(o.column, "postprocess.order_by") for o in post.order_by],
                           descending=[o.descending for o in post.order_by], nulls_last=True, maintain_order=True)
    if post.limit is not None:
        table = table.head(post.limit)
    return table

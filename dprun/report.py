"""The accounting report (report.json and report.md) and the plan's explanation.

Both are rendered from the Plan plus DP quantities of the run (partitions released,
which is post-processing of the DP selection) and public facts (file sizes and
fingerprints, versions, times). Never any raw statistic of the data: no rows read,
dropped or clamped, no units seen, no true counts.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import math
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dprun import __version__
from dprun.errors import DataError
from dprun.mechanisms.bound_choice import (
    ADVISED_SHORTFALL,
    VALUE_MAX_EXPONENT,
    VALUE_MIN_EXPONENT,
    VALUE_TAIL_LIMIT,
    BoundChoicePlan,
    ChosenBounds,
)
from dprun.mechanisms.noise import NoisePlan
from dprun.mechanisms.normal import ndtri
from dprun.mechanisms.quantile_candidates import (
    CandidateGrid,
    CandidatePlan,
    rank_error_scale,
)
from dprun.mechanisms.quantile_tree import TreeShape, rank_error_std
from dprun.plan import MetricPlan, NoisyQuantity, Plan, QueryPlan

if TYPE_CHECKING:
    # Only a type here: importing the schema readers would slow the card helper's start.
    from dprun.spec.input_schema import InputInfo

LIBRARIES = ("polars", "pyarrow", "numpy", "scipy", "dp-accounting", "pydantic")
EXAMPLE_PARTITION_SIZES = (100, 10_000)
CONFIDENCE = 0.95


def explain(plan: Plan) -> dict[str, Any]:
    """What the plan spends and how accurate each released number will be; no data needed."""
    return {
        "spec": plan.spec_name,
        "spec_sha256": plan.spec_sha256,
        "accounting": plan.accounting,
        "budget": {"epsilon": plan.budget_epsilon, "delta": plan.budget_delta},
        "total": {"epsilon": plan.total_epsilon, "delta": plan.total_delta},
        "noise_multiplier": plan.noise_multiplier,
        "queries": [_explain_query(q) for q in plan.queries],
    }


def _explain_query(query: QueryPlan) -> dict[str, Any]:
    select = query.selection
    return {
        "name": query.name,
        "input": query.private_input,
        "joins": [{"input": j.input, "on": list(j.on), "how": j.how, "public": j.public} for j in query.joins],
        "max_rows_per_unit": query.truncation,
        "epsilon_share": query.epsilon,
        "delta_share": query.delta,
        "contribution_bounds": _contribution_bounds(query),
        "auto_bounds": _auto_bounds(query),
        "partitions": {
            "mode": select.mode,
            "public_keys": None if query.public_keys is None else len(query.public_keys),
            "selection": select.mechanism,
            "epsilon": select.epsilon,
            "delta": select.delta,
            "threshold": select.threshold,
            "threshold_on": select.threshold_quantity,
            "min_privacy_units": select.min_privacy_units,
            "second_bounding": select.second_bounding,
            "units_for_50pct_keep": select.units_for_50pct,
            "units_for_95pct_keep": select.units_for_95pct,
        },
        "quantities": [_explain_quantity(q) for q in query.quantities],
        "metrics": [_explain_metric(query, m) for m in query.metrics],
        **_written_in_sql(query),
    }


def _written_in_sql(query: QueryPlan) -> dict[str, Any]:
    """A query written in SQL: its statement, and what it asks of the released table after the noise
    (post-processing, which spends no budget). Nothing for a query written in YAML."""
    written: dict[str, Any] = {} if query.sql is None else {"sql": query.sql}
    post = query.postprocess
    if post is not None:
        written["postprocess"] = {
            "having": post.having, "order_by": [o.model_dump() for o in post.order_by], "limit": post.limit,
            "note": "applied to the released values after the noise: post-processing, no budget"}
    return written


def _contribution_bounds(query: QueryPlan) -> dict[str, int | str]:
    """The bounds, `auto` for those still to be chosen from the data."""
    choice = query.bound_choice if query.chosen_bounds is None else None
    return {
        "max_partitions_contributed": "auto" if choice and choice.l0 is None else query.max_partitions,
        "max_contributions_per_partition": "auto" if choice and choice.rows is None else query.max_rows,
    }


def _auto_bounds(query: QueryPlan) -> dict[str, Any] | None:
    """How the `auto` bounds are chosen (the candidates, the ε), and once chosen, the DP figures they came from."""
    choice = query.bound_choice
    if choice is None:
        return None
    candidates = {"max_partitions_contributed": list(choice.l0_candidates) if choice.l0 is None else None,
                  "max_contributions_per_partition": list(choice.rows_candidates) if choice.rows is None else None}
    chosen = query.chosen_bounds
    return {
        "epsilon": choice.epsilon,
        "method": "permute-and-flip over the candidates, scored by the units' kept shares less the noise; "
                  "shape histograms (discrete Laplace) for the typical partition",
        "candidates": {name: values for name, values in candidates.items() if values is not None},
        "partitions": choice.partitions,
        "min_partition_units": choice.min_units,
        "value_bounds": [{
            "metric": value.metric, "column": value.column,
            "method": "two DP quantiles of the column (permute-and-flip), at the most extreme levels they resolve"
                      + (", and 0" if value.aggregate == "sum" else ""),
            "candidates": f"0 and ±2^k for k = {VALUE_MIN_EXPONENT} … {VALUE_MAX_EXPONENT}",
        } for value in choice.values],
        "chosen": None if chosen is None else {
            "max_partitions_contributed": chosen.l0,
            "max_contributions_per_partition": chosen.rows,
            "units_estimate": chosen.units,
            "partitions_estimate": chosen.partitions,
            "typical_partition_units": chosen.typical_units,
            "dropped_share_estimate": chosen.dropped_share,
            "shortfall": chosen.shortfall if choice.scores_data else None,
            "value_bounds": {value.metric: {"bounds": [value.lower, value.upper],
                                            "quantile_levels": list(value.levels),
                                            "clipped_share_estimate": value.clipped_share}
                             for value in chosen.values},
            "warnings": auto_bounds_warnings(choice, chosen),
        },
    }


def auto_bounds_warnings(choice: BoundChoicePlan, chosen: ChosenBounds) -> list[str]:
    """What the auto step could not see well at its ε, in the user's words, with the share that would."""
    warnings = []

    def advice(factor: float, goal: str) -> str:
        share = choice.share * factor
        if share <= 1:
            return f"auto_budget_share: {share:.2g} (or a larger ε) would {goal}"
        return (f"no share of this ε would {goal}: write the bounds in the spec (`dprun profile` helps), "
                "spend a larger ε, or release over more privacy units")

    if choice.scores_data and not chosen.seen_enough:
        warnings.append(
            f"the auto step saw about {chosen.units:,} privacy units at ε = {choice.contribution_epsilon:.3g}: the "
            f"contribution bounds it chose may have up to {100 * chosen.shortfall:.0f} points more relative error per "
            f"metric than the best candidate's (95% confidence); "
            + advice(chosen.budget_factor, f"bring that to {100 * ADVISED_SHORTFALL:.0f} points"))
    for value in chosen.values:
        if not value.seen_enough:
            warnings.append(
                f"{value.metric}: the auto step could not place the tails of its column's values at ε = "
                f"{choice.quantile_epsilon:.3g} per quantile and about {chosen.units:,} units; its bounds "
                f"[{value.lower:.6g}, {value.upper:.6g}] are its {100 * value.tail:.3g}th and "
                f"{100 * (1 - value.tail):.3g}th percentiles and may clamp many values; "
                + advice(value.budget_factor, f"resolve the {100 * VALUE_TAIL_LIMIT:.3g}th and "
                                              f"{100 * (1 - VALUE_TAIL_LIMIT):.3g}th"))
    return warnings


def _metric_bounds(query: QueryPlan, metric: MetricPlan) -> list[float] | str | None:
    """The metric's value bounds, `auto` while they are still to be chosen from the data."""
    if query.bound_choice is not None and query.chosen_bounds is None and \
            metric.name in {value.metric for value in query.bound_choice.values}:
        return "auto"
    return list(metric.bounds) if metric.bounds else None


def _explain_quantity(noisy: NoisyQuantity) -> dict[str, Any]:
    q, noise = noisy.quantity, noisy.noise
    entry: dict[str, Any] = {
        "id": q.id, "description": q.description, "noise": noise.kind, "epsilon": noise.epsilon,
        "delta": noise.delta, "l0": noise.l0,
        "linf": math.ldexp(q.linf_units, q.unit_exponent),
    }
    if isinstance(noise, CandidatePlan):
        return entry | {"levels": noise.levels, "epsilon_each": list(noise.epsilon_each), "candidates": q.candidates,
                        "std": None, "grid": None}
    return entry | {
        "l1": math.ldexp(noise.l0 * q.linf_units, q.unit_exponent),
        "l2": math.ldexp(math.sqrt(noise.l0) * q.linf_units, q.unit_exponent),
        "std": noise.std,
        "grid": math.ldexp(1.0, noise.grid_exponent),
    }


def _explain_metric(query: QueryPlan, metric: MetricPlan) -> dict[str, Any]:
    noises = [query.quantity(qid).noise for qid in metric.quantity_ids]
    entry: dict[str, Any] = {
        "name": metric.name,
        "kind": metric.kind,
        "column": metric.column,
        "bounds": _metric_bounds(query, metric),
        "clamp": metric.clamp,
        "quantities": list(metric.quantity_ids),
        "noise": "+".join(sorted({n.kind for n in noises})),
        "epsilon": sum(n.epsilon for n in noises),
        "delta": sum(n.delta for n in noises),
    }
    if metric.levels:
        return entry | _quantile_accuracy(query, metric)
    plans = [n for n in noises if isinstance(n, NoisePlan)]
    first = plans[0]
    entry["std"] = first.std if len(plans) == 1 else None
    z = ndtri(0.5 + CONFIDENCE / 2)
    if len(noises) == 1:
        entry["ci95_half_width"] = _half_width(first.kind, first.std, first.parameter, first.grid_exponent)
        return entry
    assert metric.bounds is not None
    half = (metric.bounds[1] - metric.bounds[0]) / 2
    by_size = {}
    for size in EXAMPLE_PARTITION_SIZES:
        std = _ratio_std(metric.kind, [n.std for n in plans], half, size)
        by_size[str(size)] = z * std
    entry["ci95_half_width_at_rows"] = by_size
    return entry


def _quantile_accuracy(query: QueryPlan, metric: MetricPlan) -> dict[str, Any]:
    """The 95% rank error of a quantile (in counts of values), and what it means in the column's units
    at example partition sizes if the values were spread evenly over the bounds."""
    noisy = query.quantity(metric.quantity_ids[0])
    quantity, noise = noisy.quantity, noisy.noise
    assert quantity.lower is not None and quantity.upper is not None and metric.bounds is not None
    width = metric.bounds[1] - metric.bounds[0]
    if isinstance(noise, CandidatePlan):
        # A Laplace variable of scale b exceeds b·ln(1/0.05) with probability 5%.
        rank = rank_error_scale(noise, list(quantity.levels), query.max_rows) * math.log(1 / (1 - CONFIDENCE))
        resolution = CandidateGrid(quantity.lower, quantity.upper, quantity.candidates).step / 2
    else:
        shape = TreeShape(quantity.lower, quantity.upper, quantity.branching, quantity.depth)
        rank = ndtri(0.5 + CONFIDENCE / 2) * rank_error_std(shape, noise)
        resolution = 0.5 if quantity.whole else shape.leaf_width
    return {
        "std": noise.std if isinstance(noise, NoisePlan) else None,
        "levels": list(metric.levels),
        "quantile_method": metric.quantile_method,
        "quantile_method_reason": metric.quantile_reason,
        "predicted_rank_error_by_method": dict(metric.rank_error_by_method),
        "ci95_rank_error": rank,
        "ci95_rank_error_fraction_at_units": {str(n): rank / n for n in EXAMPLE_PARTITION_SIZES},
        # n privacy units with m values each, spread evenly over the bounds: rank error → value error.
        "ci95_value_error_if_even_at_units": {str(n): min(width, rank / (n * query.max_rows) * width + resolution)
                                              for n in EXAMPLE_PARTITION_SIZES},
        "resolution": resolution,
        "unit": metric.value_unit,
    }


def _half_width(kind: str, std: float, parameter: float, grid_exponent: int) -> float:
    """Half-width of the central 95% interval of the noise (exact for discrete Laplace)."""
    if kind == "laplace":
        # P(|X| >= k) = 2 e^{-k/t} / (1 + e^{-1/t}) for the discrete Laplace.
        t = parameter
        k = math.ceil(t * math.log(2 / ((1 - CONFIDENCE) * (1 + math.exp(-1 / t)))))
        return math.ldexp(k, grid_exponent)
    return float(ndtri(0.5 + CONFIDENCE / 2) * std)


def _ratio_std(kind: str, stds: list[float], half: float, rows: int) -> float:
    """Approximate std of mean/variance at `rows` rows (delta method, worst case inside the bounds)."""
    count_std, sum_std = stds[0], stds[1]
    mean_std = math.sqrt(sum_std**2 + (half * count_std) ** 2) / rows
    if kind == "mean":
        return mean_std
    square_std = math.sqrt(stds[2] ** 2 + (half * half * count_std) ** 2) / rows
    variance_std = math.sqrt(square_std**2 + (2 * half * mean_std) ** 2)
    if kind == "variance":
        return variance_std
    # stddev = √variance: by the delta method its std is variance_std / (2·stddev), taken at a
    # typical stddev of half the bounds' half-width (stated in docs/explain-budget.md).
    return variance_std / half


def input_fingerprints(inputs: dict[str, InputInfo]) -> list[dict[str, Any]]:
    """Each input file's fingerprint, for the ledger (private): its content's (`file_fingerprint`), or
    for a file Spark listed (an input named by a URL), its name, size and modification time as Spark's
    file system gave them when the spec was validated (reading it from here is what a URL avoids)."""
    listed = [
        {"name": info.name, "format": info.format, "path": url, "bytes": size,
         "sha256": hashlib.sha256(f"spark-listing:{url}:{size}:{modified}".encode()).hexdigest()}
        for info in inputs.values() for url, size, modified in info.listing
    ]
    try:
        return listed + [
            {"name": info.name, "format": info.format, "path": str(path), "bytes": path.stat().st_size,
             "sha256": file_fingerprint(path, info.format)}
            for info in inputs.values() for path in info.paths
        ]
    except OSError as exc:
        raise DataError(f"an input file could not be read ({exc.strerror or type(exc).__name__}); was it "
                        "changed or removed while dprun ran?") from None


def file_fingerprint(path: Path, fmt: str) -> str:
    """sha256 of the whole file, or of a Parquet file's footer (which holds its statistics and layout)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        if fmt == "parquet":
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 8))
            tail = handle.read(8)
            footer_length = int.from_bytes(tail[:4], "little") if len(tail) == 8 else 0
            handle.seek(max(0, size - 8 - footer_length))
            digest.update(b"parquet-footer:" + str(size).encode())
            digest.update(handle.read())
            return digest.hexdigest()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    found = {"dprun": __version__, "python": platform.python_version()}
    for name in LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


# The Parquet key-value metadata key that holds an output's release id.
RELEASE_ID_KEY = "dprun.release_id"


def release_report(
    plan: Plan,
    released: dict[str, int],
    outputs: dict[str, tuple[str, str]],
    release_id: str,
    released_on: str,
    test_seed: bool,
) -> dict[str, Any]:
    """The published report: the plan's explanation, DP results and public facts only.

    `outputs` maps each query to its output's path relative to the spec's folder and the
    output's sha256 (a function of DP values only). Nothing here depends on the input
    rows except through DP mechanisms: no input size, hash or row count, no run time
    (docs/privacy.md, "The published report"). `partitions_released` is the number of
    partitions the plan's selection released, itself DP (public keys: the list's size).
    """
    report = explain(plan)
    for query in report["queries"]:
        query["partitions_released"] = released[query["name"]]
        query["output"], query["output_sha256"] = outputs[query["name"]]
    report.update(
        {
            "release_id": release_id,
            "released_on": released_on,
            "spec_folder": os.path.relpath(plan.spec_path.resolve().parent, plan.report_path.parent),
            "versions": versions(),
            "privacy_unit": list(plan.queries[0].privacy_unit) if plan.queries else [],
            "non_private_test_seed": test_seed,
        }
    )
    return report

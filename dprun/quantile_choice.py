"""Which mechanism answers a query's quantile metrics, and its shape: tree or candidates.

Per (column, bounds) of a query, from the spec, the input schema and the budget alone
(docs/mechanisms.md, "Choosing: auto"): each method's predicted rank error at the metrics'
share of the query's budget, the tree's branching and depth, the candidate grid's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

from dprun.mechanisms.noise import NoiseKind, gaussian_allowed
from dprun.mechanisms.quantile_candidates import (
    plan_candidates,
    rank_error_scale,
    round_grid_count,
)
from dprun.mechanisms.quantile_tree import TreeShape, rank_error_rms
from dprun.mechanisms.quantities import (
    QuantileMethod,
    Quantity,
    noise_for,
    quantile_tree,
)
from dprun.plan import Unplannable
from dprun.spec.input_schema import query_schema
from dprun.spec.models import QUANTILE_KINDS, Metric, Query
from dprun.spec.rules import quantile_levels
from dprun.spec.validation import ValidatedSpec

# Candidate grids and tree leaves (docs/mechanisms.md, "Quantiles"): one per whole number of an
# integer column with whole bounds at most MAX_WHOLE_VALUES values apart; else DEFAULT_CANDIDATES
# evenly spaced candidates, or at least DEFAULT_LEAVES leaves.
MAX_WHOLE_CANDIDATES = 4096
MAX_WHOLE_LEAVES = 2**16
# `auto` considers candidates only for queries with at most this many partitions known in
# advance (a global query, or public partitions): docs/mechanisms.md, "Choosing: auto".
FEW_PARTITIONS = 16
DEFAULT_CANDIDATES = 1024
DEFAULT_LEAVES = 2**16


@dataclass(frozen=True)
class QuantileChoice:
    """The method of the quantile metrics of one column and bounds, the levels they ask for together,
    the tree and the candidate grid each method would use, and each method's predicted rms rank error."""

    method: QuantileMethod
    reason: str
    levels: tuple[float, ...]
    tree: Quantity | None
    candidates: int
    rank_error: tuple[tuple[str, float], ...]


def quantile_choices(query: Query, epsilon: float, delta: float, validated: ValidatedSpec,
                     known_partitions: float) -> dict[int, QuantileChoice]:
    """The method of each quantile metric (by index); `auto` takes the smaller predicted rank error.

    The quantile metrics of one column and bounds share a method, so that one mechanism answers
    all their levels together and the answers are ordered (min <= median <= max). Both methods
    are predicted at the group's share of the query's budget (a selection's share would lower
    both alike), as a root mean square rank error: the tree by `rank_error_rms` of its planned
    noise (noise and the bias of empty nodes), candidates by √2 times `rank_error_scale` (a
    Laplace variable of that scale). `auto` takes candidates only where their prediction is
    smaller and the query has at most FEW_PARTITIONS partitions known in advance
    (`known_partitions`, infinity for private ones): the
    candidates' error also grows with the log of the grid size once a partition holds few
    values for the noise, which the rank prediction leaves out and which many partitions make
    likely. A method the share cannot pay for is left out, unless the spec forces it.
    """
    l0, m = query.contribution_bounds.fixed()
    schema = query_schema(query, validated.query_inputs[query.name])
    total_share = sum(metric.budget_share for metric in query.metrics)
    few = known_partitions <= FEW_PARTITIONS
    groups: dict[tuple[str | None, tuple[float, float] | None], list[int]] = {}
    for index, metric in enumerate(query.metrics):
        if metric.kind in QUANTILE_KINDS:
            groups.setdefault((metric.column, metric.fixed_bounds()), []).append(index)
    choices: dict[int, QuantileChoice] = {}
    for members in groups.values():
        metrics = [query.metrics[i] for i in members]
        methods = _allowed_methods(metrics, members)
        levels = tuple(sorted({level for metric in metrics for level in quantile_levels(metric.kind, metric.q)}))
        share = sum(metric.budget_share for metric in metrics) / total_share
        whole = _whole_values(metrics[0], schema)
        stds: dict[str, float] = {}
        tree = None
        for method in methods:
            try:
                if method == "tree":
                    tree, stds[method] = _best_tree(query, metrics, members, whole, epsilon * share, delta * share)
                else:
                    plan = plan_candidates(epsilon * share, l0, list(levels))
                    stds[method] = math.sqrt(2) * rank_error_scale(plan, list(levels), m)
            except ValueError:
                if len(methods) == 1:
                    raise Unplannable(("metrics", members[0]), too_small_for_a_tree(metrics[0])) from None
        if not stds:
            raise Unplannable(("metrics", members[0]), too_small_for_a_tree(metrics[0]))
        best: QuantileMethod = min(methods, key=lambda method: stds.get(method, math.inf))
        reason = "the smaller predicted error" if len(stds) > 1 else (
            "set in the spec" if len(methods) == 1 else "the only one its budget allows")
        if len(stds) > 1 and best == "candidates" and not few:
            best, reason = "tree", f"more than {FEW_PARTITIONS} partitions"
        if len(methods) == 1 and metrics[0].quantile_method == "auto":
            reason = "a metric sets noise"
        count = _candidate_count(metrics, members, whole)
        choice = QuantileChoice(best, reason, levels, tree, count, tuple(sorted(stds.items())))
        choices |= dict.fromkeys(members, choice)
    return choices


def too_small_for_a_tree(metric: Metric) -> str:
    """Why a quantile metric cannot be planned, in the spec's words, and what to change."""
    bounds = "auto" if metric.bounds == "auto" else f"[{', '.join(f'{b:g}' for b in metric.fixed_bounds() or ())}]"
    advice = "give it a larger `budget_share`, the spec a larger ε, or the query smaller contribution bounds"
    if metric.noise is None:
        advice += ", or set `quantile_method: candidates`"
    return (f"metric '{metric.name}' ({metric.kind} of {metric.column}, bounds {bounds}): its share of the budget is "
            f"too small for the noise of a quantile tree; {advice}")


def _allowed_methods(metrics: list[Metric], indices: list[int]) -> list[QuantileMethod]:
    """The methods the quantile metrics of one column and bounds allow together."""
    forced: set[QuantileMethod] = {metric.quantile_method for metric in metrics if metric.quantile_method != "auto"}
    if len(forced) > 1:
        raise Unplannable(("metrics", indices[-1], "quantile_method"), "the quantile metrics of one column and "
                          "bounds share one method; give them the same quantile_method")
    if any(metric.noise is not None for metric in metrics):
        if forced == {"candidates"}:
            raise Unplannable(("metrics", indices[-1], "noise"), "noise is for a quantile tree, and a metric of "
                              "this column and bounds asks for candidates")
        return ["tree"]  # noise is a tree's
    return [forced.pop()] if forced else ["tree", "candidates"]


def _whole_values(metric: Metric, schema: dict[str, pl.DataType]) -> int | None:
    """How many whole numbers the bounds hold, for an integer column with whole bounds; else None."""
    bounds = metric.fixed_bounds()
    assert bounds is not None and metric.column is not None
    lower, upper = bounds
    if schema[metric.column].is_integer() and lower.is_integer() and upper.is_integer():
        return int(upper - lower) + 1
    return None


def _one_setting(metrics: list[Metric], indices: list[int], field: str) -> int | None:
    """The value the metrics of one group set for `field` (None if none does); they must agree."""
    wanted: set[int] = {getattr(metric, field) for metric in metrics} - {None}
    if len(wanted) > 1:
        raise Unplannable(("metrics", indices[-1], field), f"the quantile metrics of one column and bounds "
                          f"share one mechanism; give them the same {field}")
    return wanted.pop() if wanted else None


def _best_tree(query: Query, metrics: list[Metric], indices: list[int], whole: int | None, epsilon: float,
               delta: float) -> tuple[Quantity, float]:
    """The tree with the smallest predicted rank error (`rank_error_rms`), and that error.

    Shapes: the spec's branching and depth, or every depth 1..10 with the smallest branching
    (at most 256) that gives enough leaves: one per whole number where `whole` counts at most
    MAX_WHOLE_LEAVES of them (the domain then starts half a unit below the lower bound, so each
    whole number sits in the middle of its own leaf), else at least DEFAULT_LEAVES.
    """
    l0, m = query.contribution_bounds.fixed()
    metric = metrics[0]
    bounds = metric.fixed_bounds()
    assert bounds is not None and metric.column is not None
    lower, upper = bounds
    branching = _one_setting(metrics, indices, "branching")
    depth = _one_setting(metrics, indices, "depth")
    aligned = whole is not None and whole <= MAX_WHOLE_LEAVES and (branching is None or depth is None or
                                                                   branching**depth >= whole)
    needed = whole if aligned and whole is not None else DEFAULT_LEAVES
    if branching is not None and depth is not None:
        shapes = [(branching, depth)]
    elif branching is not None:
        shapes = [(branching, min(10, max(1, math.ceil(math.log(needed) / math.log(branching) - 1e-12))))]
    else:
        depths = [depth] if depth is not None else list(range(1, 11))
        shapes = [(max(2, _root_at_least(needed, d)), d) for d in depths]
        shapes = [(b, d) for b, d in shapes if b <= 256] or [(256, depths[-1])]
    wanted = metric.noise or query.noise
    kinds: list[NoiseKind] = [wanted] if wanted != "auto" else (
        ["laplace", "gaussian"] if gaussian_allowed(delta) else ["laplace"])
    best: tuple[float, Quantity] | None = None
    for b, d in shapes:
        domain = (lower - 0.5, lower - 0.5 + b**d) if aligned else (lower, upper)
        tree = quantile_tree(metric.column, domain, m, b, d, whole=aligned)
        shape = TreeShape(domain[0], domain[1], b, d)
        for kind in kinds:
            try:
                std = rank_error_rms(shape, noise_for(tree, kind, l0, epsilon, delta))
            except ValueError:
                continue
            if best is None or std < best[0]:
                best = (std, tree)
    if best is None:
        raise ValueError("the budget share of this quantile is too small for a quantile tree")
    return best[1], best[0]


def _root_at_least(count: int, depth: int) -> int:
    """The smallest b with b**depth >= count."""
    b = max(1, round(count ** (1 / depth)))
    while b**depth < count:
        b += 1
    while b > 1 and (b - 1) ** depth >= count:
        b -= 1
    return b


def _candidate_count(metrics: list[Metric], indices: list[int], whole: int | None) -> int:
    """The grid's size: the one the metrics set, else one candidate per whole number where there are at
    most MAX_WHOLE_CANDIDATES of them, else at most DEFAULT_CANDIDATES on a round step where the
    bounds allow one (0.1 for [0, 60]), else DEFAULT_CANDIDATES evenly spaced."""
    wanted = _one_setting(metrics, indices, "candidates")
    if wanted is not None:
        return wanted
    if whole is not None and whole <= MAX_WHOLE_CANDIDATES:
        return whole
    bounds = metrics[0].fixed_bounds()
    assert bounds is not None
    return round_grid_count(*bounds, DEFAULT_CANDIDATES) or DEFAULT_CANDIDATES

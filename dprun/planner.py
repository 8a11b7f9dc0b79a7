"""Validated spec → Plan: budget split, noise choice and calibration, partition selection.

Everything here is computed from the spec and the input schemas alone. The budget
is split in two steps (docs/mechanisms.md, "Budget"):

1. across queries in proportion to their `budget_share`;
2. inside a query, ε across the noisy quantities and a separate partition selection
   (each metric's share is spread evenly over the quantities it needs, and a quantity
   needed by several metrics gets the sum), δ across the mechanisms that need δ
   (Gaussian noise, partition selection) with the same weights.

Under `accounting: basic` the guarantees add up ([D20 §2.1.6], Prop. 5). Under `pld` the
planner then shrinks every noise scale by the one factor that keeps the tight
composition (privacy loss distributions, `accounting.pld_epsilon`) within the budget.

A query with `auto` contribution bounds first sets `auto_budget_share` of its ε apart for
choosing them (`dprun.mechanisms.bound_choice`); the rest is split as above. Before the
data is read its plan uses the largest candidates (the most noise the chosen bounds can
give); `run` plans it again with the bounds chosen (`chosen`), at the same budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from dprun.errors import SpecError
from dprun.mechanisms import accounting, bound_choice, selection
from dprun.mechanisms.noise import NoiseKind, NoisePlan, gaussian_allowed
from dprun.mechanisms.quantile_candidates import CandidatePlan, plan_candidates
from dprun.mechanisms.quantities import (
    Quantity,
    metric_quantities,
    noise_for,
    quantile_candidates,
)
from dprun.plan import (
    JoinPlan,
    MetricPlan,
    NoisyQuantity,
    PartitionMode,
    Plan,
    QueryPlan,
    SelectionPlan,
    Unplannable,
)
from dprun.quantile_choice import QuantileChoice, quantile_choices, too_small_for_a_tree
from dprun.spec.input_schema import declared_types, public_keys_frame, query_schema
from dprun.spec.models import BOUND_LIMIT, QUANTILE_KINDS, ContributionBounds, Metric, Query, Spec
from dprun.spec.rules import output_columns, quantile_levels
from dprun.spec.validation import ValidatedSpec

# Each mechanism is calibrated for a hair less than its share so that float rounding in
# the shares can never make the composed total exceed the budget.
SHARE_SAFETY = 1.0 - 2.0**-40
T = TypeVar("T")
SEPARATE_SELECTIONS = ("truncated_geometric", "weighted_gaussian_threshold", "gaussian_threshold", "laplace_threshold")
# Selections by a noisy number against a threshold (their noise is shrunk by tight accounting).
THRESHOLDS = (selection.NoisyThreshold, selection.WeightedGaussianThreshold)
# How many times more units a separate selection (with Plume's second bounding) may need
# than thresholding a released count, and still be preferred by `auto`.
SEPARATE_SELECTION_SLACK = 1.5


@dataclass(frozen=True)
class _Weights:
    """Budget weights of one query's parts, before any calibration."""

    quantities: dict[str, float]
    selection: float  # 0 when there is no private selection


Chosen = dict[str, bound_choice.ChosenBounds]


def make_plan(validated: ValidatedSpec, chosen: Chosen | None = None) -> Plan:
    """The plan of a validated spec; `chosen`: the bounds chosen so far for queries with `auto` bounds, by name."""
    spec = validated.spec
    loaded = validated.loaded
    chosen = chosen or {}
    try:
        shares = _shares(spec, range(len(spec.queries)))
        plans, multiplier = _plan_queries(shares, spec.budget.method, validated, chosen)
        users = [i for i, plan in enumerate(plans) if _uses_delta(plan)]
        if spec.budget.delta > 0 and users and len(users) < len(plans):
            # δ that a query's plan leaves unused (public partitions, Laplace noise) goes to
            # the queries that use it, in proportion to their budget_share.
            plans, multiplier = _plan_queries(_shares(spec, users), spec.budget.method, validated, chosen)
    except Unplannable as exc:
        raise SpecError(validated.loaded.problems([(exc.path, f"cannot plan this spec: {exc}")])) from None
    total_epsilon, total_delta = _total(plans, spec.budget.method, spec.budget.delta)
    return Plan(
        spec_name=spec.name,
        spec_path=loaded.path,
        spec_sha256=loaded.sha256,
        accounting=spec.budget.method,
        budget_epsilon=spec.budget.epsilon,
        budget_delta=spec.budget.delta,
        total_epsilon=total_epsilon,
        total_delta=total_delta,
        noise_multiplier=multiplier,
        queries=tuple(plans),
        report_path=loaded.target(spec.report),
    )


def _shares(spec: Spec, delta_users: Iterable[int]) -> list[tuple[Query, float, float]]:
    """Each query's (ε, δ): ε in proportion to budget_share; δ so among `delta_users` only."""
    users = set(delta_users)
    epsilon_weight = sum(q.budget_share for q in spec.queries)
    delta_weight = sum(q.budget_share for i, q in enumerate(spec.queries) if i in users)
    return [(q, spec.budget.epsilon * q.budget_share / epsilon_weight,
             spec.budget.delta * q.budget_share / delta_weight if i in users else 0.0)
            for i, q in enumerate(spec.queries)]


def _uses_delta(plan: QueryPlan) -> bool:
    selection = plan.selection.delta if plan.selection.mode == "private" else 0.0
    return selection > 0 or any(q.noise.delta > 0 for q in plan.quantities)


def _plan_queries(
    shares: list[tuple[Query, float, float]], method: str, validated: ValidatedSpec, chosen: Chosen
) -> tuple[list[QueryPlan], float]:
    """Plans under basic composition; under `pld`, with every noise scale shrunk by one common factor."""
    parts = [_located(i, _auto_part, q, eps, chosen.get(q.name)) for i, (q, eps, _) in enumerate(shares)]
    shares = [(concrete, eps - (auto.epsilon if auto else 0.0), delta)
              for (_, eps, delta), (concrete, auto) in zip(shares, parts)]
    mechanisms = [_located(i, _choose_selection, q, eps, delta, validated, chosen.get(q.name))
                  for i, (q, eps, delta) in enumerate(shares)]

    def planned(multiplier: float) -> list[QueryPlan]:
        plans = [_located(i, _plan_query, q, eps, delta, mech, multiplier, validated)
                 for i, ((q, eps, delta), mech) in enumerate(zip(shares, mechanisms))]
        return [plan if auto is None else _with_auto(plan, auto, chosen.get(plan.name))
                for plan, (_, auto) in zip(plans, parts)]

    plans = planned(1.0)
    if method != "pld":
        return plans, 1.0
    budget = validated.spec.budget
    try:
        multiplier = _pld_multiplier(plans, budget.epsilon, budget.delta)
    except ValueError as exc:
        raise Unplannable(("budget",), str(exc)) from None
    return planned(multiplier), multiplier


def _auto_part(query: Query, epsilon: float, chosen: bound_choice.ChosenBounds | None
               ) -> tuple[Query, bound_choice.BoundChoicePlan | None]:
    """The query with concrete contribution bounds, and how its `auto` bounds are chosen (None: none is auto).

    The concrete bounds are the chosen ones, or before they are chosen the largest candidates."""
    bounds = query.contribution_bounds
    if not query.has_auto:
        return query, None
    l0 = bounds.max_partitions_contributed
    rows = bounds.max_contributions_per_partition
    auto = bound_choice.BoundChoicePlan(
        epsilon=0.0,
        l0=None if l0 == "auto" else l0,
        rows=None if rows == "auto" else rows,
        partitions=_known_partitions(query),
        l0_candidates=bound_choice.useful_l0(_known_partitions(query)),
        row_metrics=sum(m.kind in ("count", "sum") for m in query.metrics),
        unit_metrics=sum(m.kind == "privacy_id_count" for m in query.metrics),
        rows_matter=any(m.kind != "privacy_id_count" for m in query.metrics),
        samples_rows=any(m.kind in ("mean", "variance", "stddev") for m in query.metrics),
        values=tuple(bound_choice.ValueChoice(m.name, m.column, MAIN_QUANTITY.get(m.kind),
                                              tuple(quantile_levels(m.kind, m.q)) if m.kind in QUANTILE_KINDS else ())
                     for m in query.metrics if m.bounds == "auto" and m.column is not None),
    )
    share = bounds.auto_budget_share or auto.default_share
    auto = replace(auto, epsilon=epsilon * share * SHARE_SAFETY, share=share)
    problem = auto.sampler_problem("give the spec a larger ε or `auto_budget_share`, or fixed bounds")
    if problem is not None:
        raise Unplannable(("contribution_bounds",), problem)
    concrete = ContributionBounds(
        max_partitions_contributed=chosen.l0 if chosen else auto.l0 or auto.l0_candidates[-1],
        max_contributions_per_partition=chosen.rows if chosen else auto.rows or auto.rows_candidates[-1],
    )
    values = {v.metric: (v.lower, v.upper) for v in chosen.values} if chosen else {}
    return _with_value_bounds(query.model_copy(update={"contribution_bounds": concrete}), values), auto


# The value bounds a metric with `bounds: auto` is planned with before they are chosen: its accuracy
# is stated per unit of the bounds' width until then.
PLACEHOLDER_VALUE_BOUNDS = (0.0, 1.0)


def _with_value_bounds(query: Query, chosen: dict[str, tuple[float, float]]) -> Query:
    """The query with each `bounds: auto` replaced by the bounds chosen for it (`chosen`, by metric), else
    PLACEHOLDER_VALUE_BOUNDS."""
    metrics = [m.model_copy(update={"bounds": chosen.get(m.name, PLACEHOLDER_VALUE_BOUNDS)}) if m.bounds == "auto"
               else m for m in query.metrics]
    return query.model_copy(update={"metrics": metrics})


def _known_partitions(query: Query) -> int | None:
    """The number of partitions when it is public before any data is read: 1 without group_by;
    for public partitions, None here (`_with_auto` counts the keys once they are read)."""
    return 1 if _mode(query) == "global" else None


def _with_auto(plan: QueryPlan, auto: bound_choice.BoundChoicePlan, chosen: bound_choice.ChosenBounds | None
               ) -> QueryPlan:
    """A query's plan with its bound choice: its ε is the whole query's again, the choice's share included."""
    if plan.public_keys is not None:
        partitions = max(plan.public_keys.height, 1)
        auto = replace(auto, partitions=partitions, l0_candidates=bound_choice.useful_l0(partitions))
    if plan.selection.units_for_50pct is not None:
        # A private selection drops smaller partitions whatever the bounds: their noise does not count.
        auto = replace(auto, min_units=float(plan.selection.units_for_50pct))
    return replace(plan, epsilon=plan.epsilon + auto.epsilon, bound_choice=auto, chosen_bounds=chosen)


def relative_noise(validated: ValidatedSpec, plan: Plan, index: int) -> bound_choice.RelativeNoise:
    """For query `index` with `auto` bounds: its metrics' noise at given (L0, L∞), each relative to
    its value in a partition of the given rows and units, summed (what `bound_choice.choose_bounds`
    weighs against the rows dropped); the rest of its plan as it is."""

    def noise(l0: int, rows: int, rows_per_partition: float, units_per_partition: float, kept: float) -> float:
        at = _planned_at(validated, plan, index, l0, rows)
        return sum(_relative_std(at, metric, rows_per_partition, units_per_partition, kept)
                   + _estimate_error(metric, rows_per_partition * kept) for metric in at.metrics)

    return noise


def _estimate_error(metric: MetricPlan, kept_rows: float) -> float:
    """A quantile's error at bounds that keep `kept_rows` rows of a partition (its noise is not a
    NoisePlan's std, so `_relative_std` leaves it out): its predicted rank error over k, plus the
    sampling error of a statistic of k values, 1/√k (fewer rows kept, a rougher quantile). 0 for the
    other kinds."""
    if metric.quantile_method is None:
        return 0.0
    kept_rows = max(kept_rows, 1.0)
    return dict(metric.rank_error_by_method).get(metric.quantile_method, 0.0) / kept_rows + 1 / math.sqrt(kept_rows)


def _planned_at(validated: ValidatedSpec, plan: Plan, index: int, l0: int, rows: int) -> QueryPlan:
    """Query `index` planned at contribution bounds (L0, L∞), with its own budget (less the choice's
    share) and selection, and its `auto` value bounds at PLACEHOLDER_VALUE_BOUNDS."""
    planned = plan.queries[index]
    assert planned.bound_choice is not None, "a query with auto bounds"
    bounds = ContributionBounds(max_partitions_contributed=l0, max_contributions_per_partition=rows)
    concrete = _with_value_bounds(validated.spec.queries[index].model_copy(update={"contribution_bounds": bounds}),
                                  {})
    return _plan_query(concrete, planned.epsilon - planned.bound_choice.epsilon, planned.delta,
                       planned.selection.mechanism, plan.noise_multiplier, validated)


# The noisy quantity whose noise a metric's error is judged by, per kind (quantiles: none).
MAIN_QUANTITY = {"count": "rows", "privacy_id_count": "privacy_units", "sum": "sum", "mean": "centered_sum",
                 "variance": "centered_sum", "stddev": "centered_sum"}


def _main_noise(plan: QueryPlan, metric: MetricPlan) -> NoisyQuantity | None:
    """The noisy quantity of MAIN_QUANTITY a metric's error is judged by (None: quantiles)."""
    aggregate = MAIN_QUANTITY.get(metric.kind)
    return next((plan.quantity(qid) for qid in metric.quantity_ids
                 if plan.quantity(qid).quantity.aggregate == aggregate), None)


def _relative_std(plan: QueryPlan, metric: MetricPlan, rows: float, units: float, kept: float = 1.0) -> float:
    """A metric's noise std relative to its value in a partition of `rows` rows and `units` units;
    a value is taken as half the bounds' magnitudes, (|lower| + |upper|) / 2. A total (count, sum)
    is compared with the whole partition's; a mean or a quantile, whose noise is over the rows the
    bounds keep, with the `kept` share of them."""
    main = _main_noise(plan, metric)
    if main is None or not isinstance(main.noise, NoisePlan):
        return 0.0
    aggregate = main.quantity.aggregate
    size = units if aggregate == "privacy_units" else rows
    if aggregate not in ("privacy_units", "rows", "sum"):
        size *= kept
    if metric.bounds is not None and aggregate != "rows":
        size *= max((abs(metric.bounds[0]) + abs(metric.bounds[1])) / 2, 1 / BOUND_LIMIT)
    return main.noise.std / max(size, 1.0)


def _located(index: int, step: Callable[..., T], *args: object) -> T:
    """Run a planning step for query `index`, locating its failures at that query."""
    try:
        return step(*args)
    except Unplannable as exc:
        raise Unplannable(("queries", index, *exc.path), str(exc)) from None
    except OverflowError:
        raise Unplannable(("queries", index), "the numbers are out of range: its share of the budget "
                                              "(epsilon × budget_share) is too small or too large") from None
    except ValueError as exc:
        raise Unplannable(("queries", index), str(exc) or "the numbers are out of range") from None


def _mode(query: Query) -> PartitionMode:
    if not query.group_by:
        return "global"
    return "public" if query.partitions is not None and query.partitions.is_public else "private"


MetricQuantities = list[tuple[Metric, list[Quantity]]]


def _metric_quantities(query: Query, choices: dict[int, QuantileChoice]) -> MetricQuantities:
    """Each metric with its quantities; a quantile metric's follow its method in `choices`."""
    _, m = query.contribution_bounds.fixed()
    out = []
    for index, metric in enumerate(query.metrics):
        choice = choices.get(index)
        if choice is None:
            out.append((metric, metric_quantities(metric.kind, metric.column, metric.fixed_bounds(), m)))
        elif choice.method == "candidates":
            bounds = metric.fixed_bounds()
            assert metric.column is not None and bounds is not None
            candidates = quantile_candidates(metric.column, bounds, m, choice.candidates, choice.levels)
            out.append((metric, [candidates]))
        else:
            assert choice.tree is not None
            out.append((metric, [choice.tree]))
    return out


def _weights(query: Query, quantities: MetricQuantities, mechanism: str | None) -> _Weights:
    weights: dict[str, float] = {}
    for metric, quantities_of_metric in quantities:
        for quantity in quantities_of_metric:
            weights[quantity.id] = weights.get(quantity.id, 0.0) + metric.budget_share / len(quantities_of_metric)
    return _Weights(weights, _selection_share(query, mechanism) if mechanism is not None else 0.0)


# The default weight of a weighted selection in its query: it needs about half the budget of a plain
# count's threshold for as many partitions, and the metrics get the rest (docs/mechanisms.md).
WEIGHTED_SELECTION_SHARE = 0.5


def _selection_share(query: Query, mechanism: str | None) -> float:
    """The weight of partition selection inside its query: `partitions.budget_share`, by default 1,
    or WEIGHTED_SELECTION_SHARE for `weighted_gaussian_threshold`."""
    written = query.partitions.budget_share if query.partitions is not None else None
    if written is not None:
        return written
    return WEIGHTED_SELECTION_SHARE if mechanism == "weighted_gaussian_threshold" else 1.0


def _noise_choices(query: Query, metric_quantities: MetricQuantities) -> dict[str, NoiseKind | None]:
    """Explicit noise per quantity (None = auto); metrics sharing a quantity must agree."""
    chosen: dict[str, NoiseKind | None] = {}
    asked_by: dict[str, str] = {}
    for index, (metric, quantities) in enumerate(metric_quantities):
        wanted = metric.noise or query.noise
        kind: NoiseKind | None = None if wanted == "auto" else wanted
        for quantity in quantities:
            if quantity.id in chosen and chosen[quantity.id] not in (None, kind) and kind is not None:
                raise Unplannable(("metrics", index, "noise"), f"this metric shares its noisy {quantity.description} "
                                  f"with metric '{asked_by[quantity.id]}', which asks "
                                  f"for {chosen[quantity.id]} noise; give both the same `noise`")
            if kind is not None and chosen.get(quantity.id) is None:
                asked_by[quantity.id] = metric.name
            chosen[quantity.id] = chosen.get(quantity.id) or kind
    return chosen


def _plan_query(
    query: Query, epsilon: float, delta: float, mechanism: str | None, multiplier: float, validated: ValidatedSpec
) -> QueryPlan:
    """The plan of one query for a given private selection mechanism (None: public or global)."""
    l0, m = query.contribution_bounds.fixed()
    separate = mechanism in SEPARATE_SELECTIONS
    input_info = validated.query_inputs[query.name]
    mode = _mode(query)
    public_keys = None
    if mode == "public":
        public_keys = public_keys_frame(query, validated.loaded.base_dir, query_schema(query, input_info),
                                        declared_types(input_info))
    # Partitions known before any data is read: one, the public keys, or (private) unknown.
    known = 1 if mode == "global" else public_keys.height if public_keys is not None else math.inf
    # The metrics' part of the query's budget, after a separate selection's share (as `_weights` splits it):
    # a quantile method is chosen among those this part can pay for.
    metric_weight = sum(metric.budget_share for metric in query.metrics)
    epsilon_part = metric_weight / (metric_weight + (_selection_share(query, mechanism) if separate else 0.0))
    delta_part = metric_weight / (metric_weight + (_selection_share(query, mechanism) if mode == "private" else 0.0))
    choices = quantile_choices(query, epsilon * epsilon_part * SHARE_SAFETY, delta * delta_part * SHARE_SAFETY,
                               validated, known)
    metric_quantities = _metric_quantities(query, choices)
    weights = _weights(query, metric_quantities, mechanism if separate else None)
    private = mode == "private"
    epsilon_weight = sum(weights.quantities.values()) + weights.selection
    quantities = {q.id: q for _, qs in metric_quantities for q in qs}
    kinds = _choose_noise(query, metric_quantities, weights, epsilon, delta, mechanism if private else None)
    delta_consumers = {qid: w for qid, w in weights.quantities.items() if kinds[qid] == "gaussian"}
    selection_delta_weight = _selection_share(query, mechanism) if private else 0.0
    delta_weight = sum(delta_consumers.values()) + selection_delta_weight
    noisy = []
    for qid, weight in weights.quantities.items():
        q_eps = epsilon * weight / epsilon_weight * SHARE_SAFETY
        q_delta = delta * weight / delta_weight * SHARE_SAFETY if qid in delta_consumers else 0.0
        quantity = quantities[qid]
        if quantity.aggregate == "quantile_candidates":
            # A pure-ε selection: tight accounting counts it as a fixed cost and leaves it as planned.
            noisy.append(NoisyQuantity(quantity, plan_candidates(q_eps, l0, list(quantity.levels)), weight))
            continue
        try:
            noise = noise_for(quantity, kinds[qid], l0, q_eps, q_delta)
        except ValueError:
            if quantity.aggregate != "quantile_tree":
                raise
            raise _too_small(query, metric_quantities, qid) from None
        if multiplier != 1.0:
            noise = noise.scaled(multiplier)
        noisy.append(NoisyQuantity(quantity, noise, weight))
    selection_eps = epsilon * weights.selection / epsilon_weight * SHARE_SAFETY
    selection_delta = delta * selection_delta_weight / delta_weight * SHARE_SAFETY if private else 0.0
    select = _selection_plan(query, mechanism, selection_eps, selection_delta, tuple(noisy), multiplier)
    metric_plans = tuple(
        MetricPlan(
            name=metric.name,
            kind=metric.kind,
            column=metric.column,
            bounds=metric.fixed_bounds(),
            quantity_ids=tuple(q.id for q in qs),
            output_columns=tuple(output_columns(metric.name, metric.kind, metric.q)),
            integer=metric.kind in ("count", "privacy_id_count"),
            levels=tuple(quantile_levels(metric.kind, metric.q)),
            clamp=metric.clamp,
            quantile_method=choices[index].method if index in choices else None,
            quantile_reason=choices[index].reason if index in choices else None,
            rank_error_by_method=choices[index].rank_error if index in choices else (),
            value_unit=metric.unit,
        )
        for index, (metric, qs) in enumerate(metric_quantities)
    )
    output_path = validated.loaded.target(query.output.path)
    return QueryPlan(
        name=query.name,
        input=query.input_name,
        filter=query.filter,
        group_by=tuple(query.group_by),
        privacy_unit=tuple(validated.spec.privacy_unit_columns),
        max_partitions=l0,
        max_rows=m,
        selection=select,
        quantities=tuple(noisy),
        metrics=metric_plans,
        output_path=output_path,
        output_format=query.output.format or ("csv" if output_path.suffix.lower() == ".csv" else "parquet"),
        overwrite=query.output.overwrite,
        public_keys=public_keys,
        epsilon=epsilon,
        delta=delta,
        derive=tuple(query.derive.items()),
        joins=_join_plans(query, validated),
        input_max_rows_per_unit=None if isinstance(query.input, str) else query.input.max_rows_per_unit.get(
            query.private_input),
        sql=query.sql,
        postprocess=query.postprocess,
    )


def _join_plans(query: Query, validated: ValidatedSpec) -> tuple[JoinPlan, ...]:
    if isinstance(query.input, str):
        return ()
    join = query.input
    return tuple(JoinPlan(name, tuple(join.on_columns(name)), join.how, public=validated.inputs[name].reading.public,
                          max_rows_per_unit=join.max_rows_per_unit.get(name))
                 for name in join.join[1:])


def _choose_noise(
    query: Query, metric_quantities: MetricQuantities, weights: _Weights, epsilon: float, delta: float,
    mechanism: str | None,
) -> dict[str, NoiseKind]:
    """Per quantity, the explicit noise, or (auto) the kind with the smaller standard deviation
    (`mechanism`: the private selection's, None for public or global partitions).

    For the comparison every quantity is assumed to take a δ share; the final split gives
    the Gaussian ones more δ than assumed, which only lowers their noise further.
    """
    l0, _ = query.contribution_bounds.fixed()
    explicit = _noise_choices(query, metric_quantities)
    quantities = {q.id: q for _, qs in metric_quantities for q in qs}
    total = sum(weights.quantities.values()) + weights.selection
    all_delta = sum(weights.quantities.values()) + (_selection_share(query, mechanism) if mechanism else 0.0)
    kinds: dict[str, NoiseKind] = {}
    for qid, weight in weights.quantities.items():
        wanted = explicit[qid]
        if wanted is not None:
            kinds[qid] = wanted
            continue
        q = quantities[qid]
        if q.aggregate == "quantile_candidates":
            kinds[qid] = "laplace"  # stands for pure ε: candidates take no δ
            continue
        q_eps = epsilon * weight / total
        q_delta = delta * weight / all_delta if delta > 0 else 0.0
        stds: dict[NoiseKind, float] = {}
        for kind in ("laplace", "gaussian") if gaussian_allowed(q_delta) else ("laplace",):
            try:
                stds[kind] = noise_for(q, kind, l0, q_eps, q_delta if kind == "gaussian" else 0.0).std
            except ValueError:
                if q.aggregate != "quantile_tree":
                    raise
                # A tree whose noise of this kind this share cannot pay for: the other kind may.
        if not stds:
            raise _too_small(query, metric_quantities, qid)
        kinds[qid] = min(stds, key=lambda kind: stds[kind])
    return kinds


def _too_small(query: Query, metric_quantities: MetricQuantities, qid: str) -> Unplannable:
    """A quantile tree its share cannot pay for, located at the first metric that uses it."""
    index = next(i for i, (_, quantities) in enumerate(metric_quantities) if any(q.id == qid for q in quantities))
    return Unplannable(("metrics", index), too_small_for_a_tree(query.metrics[index]))


def _threshold_quantity(noisy: tuple[NoisyQuantity, ...]) -> NoisyQuantity | None:
    """The released count to threshold on: the privacy-unit count if released, else a row count."""
    for aggregate in ("privacy_units", "rows"):
        for candidate in noisy:
            if candidate.quantity.aggregate == aggregate:
                return candidate
    return None


def _selection_plan(
    query: Query, mechanism: str | None, epsilon: float, delta: float,
    noisy: tuple[NoisyQuantity, ...], multiplier: float,
) -> SelectionPlan:
    mode = _mode(query)
    if mode != "private":
        return SelectionPlan(mode=mode)
    partitions = query.partitions
    min_units = partitions.min_privacy_units if partitions else 1
    l0, _ = query.contribution_bounds.fixed()
    threshold_on = None
    if mechanism == "released_count":
        target = _threshold_quantity(noisy)
        if target is None:
            raise ValueError("released_count selection needs a count or privacy_id_count metric")
        if min_units > 1 and target.quantity.aggregate != "privacy_units":
            raise ValueError("min_privacy_units with released_count needs a privacy_id_count metric")
        assert isinstance(target.noise, NoisePlan), "counts get noise"
        detail: selection.SelectionMechanism = selection.released_count_threshold(
            target.noise, delta, target.quantity.linf_units, min_units)
        threshold_on, epsilon, second = target.quantity.id, 0.0, False
    else:
        detail = _separate_mechanism(mechanism, epsilon, delta, l0, min_units)
        if isinstance(detail, THRESHOLDS) and multiplier != 1.0:
            detail = selection.with_noise(detail, detail.noise.scaled(multiplier), delta - detail.noise.delta)
        second = partitions.second_bounding if partitions else True
    return SelectionPlan(
        mode="private",
        mechanism=mechanism,
        detail=detail,
        epsilon=epsilon,
        delta=delta,
        threshold_quantity=threshold_on,
        threshold=detail.threshold if isinstance(detail, THRESHOLDS) else None,
        min_privacy_units=min_units,
        second_bounding=second,
        units_for_50pct=selection.units_to_keep(detail, 0.5),
        units_for_95pct=selection.units_to_keep(detail, 0.95),
    )


def _separate_mechanism(
    name: str | None, epsilon: float, delta: float, l0: int, min_units: int
) -> selection.SelectionMechanism:
    if name == "truncated_geometric":
        return selection.TruncatedGeometric(epsilon, delta, l0, min_units)
    if name == "laplace_threshold":
        return selection.laplace_threshold(epsilon, delta, l0, min_units)
    if name == "weighted_gaussian_threshold":
        return selection.weighted_gaussian_threshold(epsilon, delta, l0, min_units)
    return selection.gaussian_threshold(epsilon, delta, l0, min_units)


def _choose_selection(query: Query, epsilon: float, delta: float, validated: ValidatedSpec,
                      chosen: bound_choice.ChosenBounds | None = None) -> str | None:
    """The private selection mechanism for `auto`.

    Among the mechanisms with their own budget, the one that needs the fewest
    privacy units for a 50% keep chance. Thresholding a released count needs no
    selection budget, so it keeps smaller partitions, but its metrics come from
    the first contribution bounding. With `chosen` (the query's auto bounds, chosen
    from DP histograms of the data) the two are compared by the estimated share of
    the data's rows they misreport, the first bounding's bias included
    (`_misreported_rows`); without, a separate selection is preferred while it needs
    at most SEPARATE_SELECTION_SLACK times as many units, because Plume's second
    bounding then removes most of the bounding bias (docs/mechanisms.md). The choice is
    made with plain unit counts; a Gaussian threshold is then run on weighted counts.
    """
    if _mode(query) != "private":
        return None
    wanted = query.partitions.selection if query.partitions else "auto"
    if wanted != "auto":
        return wanted
    chosen_name = _choose_plain_selection(query, epsilon, delta, validated, chosen)
    # Weighted counts need as many units as plain ones at the same budget when every unit is in L0
    # partitions (up to rounding), and fewer when units are in fewer: they replace the plain ones.
    return "weighted_gaussian_threshold" if chosen_name == "gaussian_threshold" else chosen_name


def _choose_plain_selection(query: Query, epsilon: float, delta: float, validated: ValidatedSpec,
                            chosen: bound_choice.ChosenBounds | None) -> str:
    """`_choose_selection` among the mechanisms that count each unit once, and released_count."""
    candidates = [name for name in SEPARATE_SELECTIONS if name != "weighted_gaussian_threshold"]
    if not gaussian_allowed(delta / 4):
        candidates.remove("gaussian_threshold")
    plans = {name: _planned_with(query, epsilon, delta, name, validated) for name in candidates}
    scores = {name: plan.selection.units_for_50pct or math.inf for name, plan in plans.items()}
    best_separate = min(candidates, key=lambda name: scores[name])
    min_units = query.partitions.min_privacy_units if query.partitions else 1
    counts = {m.kind for m in query.metrics} & {"count", "privacy_id_count"}
    if not counts or (min_units > 1 and "privacy_id_count" not in counts):
        return best_separate
    counted = _planned_with(query, epsilon, delta, "released_count", validated)
    released = counted.selection.units_for_50pct or math.inf
    second = query.partitions.second_bounding if query.partitions else True
    if second and chosen is not None and chosen.partition_sizes:
        separate = _misreported_rows(plans[best_separate], chosen, chosen.per_partition_dropped)
        return best_separate if separate <= _misreported_rows(counted, chosen, chosen.dropped_share) \
            else "released_count"
    if second and scores[best_separate] <= SEPARATE_SELECTION_SLACK * released:
        return best_separate
    return best_separate if scores[best_separate] < released else "released_count"


def _misreported_rows(plan: QueryPlan, chosen: bound_choice.ChosenBounds, bias: float) -> float:
    """The estimated share of the data's rows a plan misreports: per size of partition (the DP size
    histogram `chosen` was made from), a partition released (its keep chance) with the relative error
    `bias` plus its metrics' noise over their values, capped at 1; not released, 1; weighed by rows."""
    assert plan.selection.detail is not None, "a private selection"
    units = np.array([size for size, _ in chosen.partition_sizes])
    partitions = np.array([count for _, count in chosen.partition_sizes])
    rows_per_unit = chosen.typical_rows / chosen.typical_units if chosen.typical_units > 0 else 1.0
    keep = selection.keep_probability(plan.selection.detail, np.floor(units))
    noise = np.array([sum(_relative_std(plan, metric, n * rows_per_unit, n) for metric in plan.metrics)
                      for n in units])
    error = keep * np.minimum(bias + noise, 1.0) + (1.0 - keep)
    weights = partitions * units
    return float((weights * error).sum() / weights.sum())


def _planned_with(query: Query, epsilon: float, delta: float, mechanism: str, validated: ValidatedSpec
                  ) -> QueryPlan:
    """The query planned with `mechanism`, under the spec's accounting applied to this query alone."""
    plan = _plan_query(query, epsilon, delta, mechanism, 1.0, validated)
    if validated.spec.budget.method == "pld":
        multiplier = _pld_multiplier([plan], epsilon, delta, rough=True)
        plan = _plan_query(query, epsilon, delta, mechanism, multiplier, validated)
    return plan


def _costs(plans: list[QueryPlan]) -> tuple[list[accounting.NoiseCost], list[accounting.ApproxCost]]:
    """Noise whose scale tight accounting may shrink, and costs known only by (ε, δ)."""
    noise = [_noise_cost(q.noise) for plan in plans for q in plan.quantities if isinstance(q.noise, NoisePlan)]
    fixed = [accounting.ApproxCost(q.noise.epsilon, 0.0)
             for plan in plans for q in plan.quantities if isinstance(q.noise, CandidatePlan)]
    fixed += [accounting.ApproxCost(plan.bound_choice.epsilon, 0.0) for plan in plans if plan.bound_choice]
    for plan in plans:
        select = plan.selection
        if select.mode != "private":
            continue
        if isinstance(select.detail, THRESHOLDS) and select.mechanism != "released_count":
            noise.append(_noise_cost(select.detail.noise))
            fixed.append(accounting.ApproxCost(0.0, select.delta - select.detail.noise.delta))
        else:
            fixed.append(accounting.ApproxCost(select.epsilon, select.delta))
    return noise, fixed


def _noise_cost(noise: NoisePlan) -> accounting.NoiseCost:
    return accounting.NoiseCost(noise.kind, noise.parameter, noise.sensitivity, noise.l0)


def _pld_multiplier(plans: list[QueryPlan], epsilon: float, delta: float, rough: bool = False) -> float:
    noise, fixed = _costs(plans)
    if delta == 0 or not noise:
        return 1.0
    return min(1.0, accounting.pld_noise_multiplier(noise, fixed, epsilon * SHARE_SAFETY, delta, rough))


def _total(plans: list[QueryPlan], method: str, delta: float) -> tuple[float, float]:
    """The plan's guarantee: basic composition, or under `pld` the tighter of the two (both are valid)."""
    parts = [(q.noise.epsilon, q.noise.delta) for plan in plans for q in plan.quantities]
    parts += [(plan.selection.epsilon, plan.selection.delta) for plan in plans if plan.selection.mode == "private"]
    parts += [(plan.bound_choice.epsilon, 0.0) for plan in plans if plan.bound_choice]
    basic = accounting.compose_basic(parts)
    if method != "pld":
        return basic
    noise, fixed = _costs(plans)
    costs: list[accounting.Cost] = [*noise, *fixed]
    tight = accounting.pld_epsilon(costs, delta) if costs and delta > 0 else math.inf
    return (tight, delta) if tight < basic[0] else basic

"""The planner: budget split, sensitivities, noise choice, accounting — from the spec alone."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest
import json
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dprun.api import plan as make_plan
from dprun.errors import SpecError
from dprun.api import validate
from dprun.mechanisms import accounting
from dprun.mechanisms.calibration import analytic_gaussian_sigma, exact_gaussian_budget, gaussian_delta
from dprun.mechanisms.quantile_candidates import CandidatePlan
from dprun.plan import Plan, SelectionPlan

DATA = pl.DataFrame({"uid": ["a", "b"], "region": ["x", "y"], "value": [1.0, 2.0]})


def write_spec(folder: Path, body: dict) -> Path:
    DATA.write_csv(folder / "data.csv")
    document = {"version": 1, "privacy_unit": "uid", "inputs": {"data": {"path": "data.csv"}}, **body}
    path = folder / "spec.yaml"
    path.write_text(json.dumps(document))
    return path


def query(name: str, metrics: list[dict], **extra: object) -> dict:
    return {
        "name": name,
        "input": "data",
        "contribution_bounds": {"max_partitions_contributed": extra.pop("l0", 1),
                                "max_contributions_per_partition": extra.pop("m", 1)},
        "metrics": metrics,
        "output": {"path": f"out/{name}.parquet"},
        **extra,
    }


def planned(tmp_path: Path, body: dict) -> Plan:
    return make_plan(validate(write_spec(tmp_path, body)))


def test_count_laplace_scale_is_l0_times_m_over_epsilon(tmp_path: Path) -> None:
    plan = planned(tmp_path, {
        "budget": {"epsilon": 0.5},
        "queries": [query("q", [{"name": "n", "kind": "count"}], l0=3, m=2, group_by=["region"],
                          partitions={"public": ["x", "y"]})],
    })
    noise = plan.queries[0].quantities[0].noise
    assert noise.kind == "laplace" and noise.grid_exponent == 0
    assert noise.linf == 2 and noise.l0 == 3
    assert noise.parameter == pytest.approx(3 * 2 / 0.5, rel=1e-9)


def test_sum_sensitivity_uses_the_larger_bound_in_fixed_point(tmp_path: Path) -> None:
    plan = planned(tmp_path, {
        "budget": {"epsilon": 1.0},
        "queries": [query("q", [{"name": "s", "kind": "sum", "column": "value", "bounds": [-80, 20]}], m=3)],
    })
    q = plan.queries[0].quantities[0]
    real_linf = math.ldexp(q.quantity.linf_units, q.quantity.unit_exponent)
    assert real_linf == pytest.approx(3 * 80, rel=2**-29)
    assert real_linf >= 3 * 80
    assert q.noise.std == pytest.approx(math.sqrt(2) * 3 * 80 / 1.0, rel=1e-6)


def test_variance_uses_centred_squares_not_the_uncentred_range(tmp_path: Path) -> None:
    plan = planned(tmp_path, {
        "budget": {"epsilon": 1.0},
        "queries": [query("q", [{"name": "v", "kind": "variance", "column": "value", "bounds": [0, 50]}], m=2)],
    })
    by_kind = {q.quantity.aggregate: q.quantity for q in plan.queries[0].quantities}
    assert set(by_kind) == {"rows", "centered_sum", "centered_sumsq"}
    sumsq = by_kind["centered_sumsq"]
    assert math.ldexp(sumsq.linf_units, sumsq.unit_exponent) == pytest.approx(2 * 25.0**2, rel=2**-29)
    centred = by_kind["centered_sum"]
    assert math.ldexp(centred.linf_units, centred.unit_exponent) == pytest.approx(2 * 25.0, rel=2**-29)


def test_shared_count_is_one_noisy_quantity(tmp_path: Path) -> None:
    metrics = [
        {"name": "n", "kind": "count", "column": "value"},
        {"name": "mean", "kind": "mean", "column": "value", "bounds": [0, 10]},
        {"name": "var", "kind": "variance", "column": "value", "bounds": [0, 10]},
    ]
    plan = planned(tmp_path, {"budget": {"epsilon": 1.0}, "queries": [query("q", metrics)]})
    ids = [q.quantity.id for q in plan.queries[0].quantities]
    assert len(ids) == len(set(ids)) == 3
    assert plan.total_epsilon <= 1.0


def test_gaussian_sigma_is_the_analytic_one_for_l2_sqrt_l0_times_linf(tmp_path: Path) -> None:
    plan = planned(tmp_path, {
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "queries": [query("q", [{"name": "n", "kind": "count", "noise": "gaussian"}], l0=16, m=1,
                          group_by=["region"], partitions={"public": ["x"]})],
    })
    noise = plan.queries[0].quantities[0].noise
    expected = analytic_gaussian_sigma(math.sqrt(16), *exact_gaussian_budget(noise.epsilon, noise.delta, 16))
    assert noise.std == pytest.approx(expected, rel=1e-6)
    assert gaussian_delta(noise.std, math.sqrt(16) * (1 + 2.0**noise.grid_exponent), noise.epsilon) <= noise.delta


def test_auto_noise_prefers_gaussian_at_large_l0_and_laplace_at_small(tmp_path: Path) -> None:
    def kind(l0: int) -> str:
        folder = tmp_path / str(l0)
        folder.mkdir()
        plan = planned(folder, {
            "budget": {"epsilon": 1.0, "delta": 1e-5},
            "queries": [query("q", [{"name": "n", "kind": "count"}], l0=l0, group_by=["region"],
                              partitions={"public": ["x"]})],
        })
        return plan.queries[0].quantities[0].noise.kind

    assert kind(1) == "laplace"
    assert kind(64) == "gaussian"


def test_pld_gives_strictly_less_noise_than_basic(tmp_path: Path) -> None:
    def stds(method: str) -> list[float]:
        folder = tmp_path / method
        folder.mkdir()
        metrics = [{"name": f"n{i}", "kind": "sum", "column": "value", "bounds": [0, i + 1.0]} for i in range(4)]
        plan = planned(folder, {
            "budget": {"epsilon": 1.0, "delta": 1e-6, "accounting": method},
            "queries": [query("q", metrics, l0=8, group_by=["region"], partitions={"public": ["x"]}, noise="gaussian")],
        })
        assert plan.total_epsilon <= 1.0 and plan.total_delta <= 1e-6
        return [q.noise.std for q in plan.queries[0].quantities]

    basic, tight = stds("basic"), stds("pld")
    assert all(t < 0.9 * b for t, b in zip(tight, basic, strict=True))


metric_kinds = st.sampled_from(["count", "privacy_id_count", "sum", "mean", "variance", "stddev", "median",
                                "quantile"])


@st.composite
def specs(draw: st.DrawFn) -> dict:
    delta = draw(st.sampled_from([0.0, 1e-9, 1e-6, 1e-3]))
    queries = []
    for index in range(draw(st.integers(1, 3))):
        metrics = []
        for m_index in range(draw(st.integers(1, 3))):
            kind = draw(metric_kinds)
            metric: dict = {"name": f"m{m_index}", "kind": kind,
                            "budget_share": draw(st.sampled_from([0.5, 1.0, 3.0]))}
            if kind not in ("count", "privacy_id_count"):
                lower = draw(st.sampled_from([-100.0, 0.0, 1.5]))
                metric |= {"column": "value", "bounds": [lower, lower + draw(st.sampled_from([0.1, 10.0, 1e6]))]}
            if kind in ("median", "quantile"):
                metric["quantile_method"] = draw(st.sampled_from(["auto", "tree", "candidates"]))
                metric["q"] = [0.1, 0.9] if kind == "quantile" else None
            elif delta > 0:
                metric["noise"] = draw(st.sampled_from(["auto", "laplace", "gaussian"]))
            metrics.append({k: v for k, v in metric.items() if v is not None})
        private = delta > 0 and draw(st.booleans())
        extra: dict = {"group_by": ["region"], "budget_share": draw(st.sampled_from([1.0, 2.0]))}
        extra["partitions"] = {"selection": draw(st.sampled_from(
            ["auto", "truncated_geometric", "laplace_threshold", "gaussian_threshold"]))} if private else {
            "public": ["x", "y"]}
        queries.append(query(f"q{index}", metrics, l0=draw(st.integers(1, 100)), m=draw(st.integers(1, 10)), **extra))
    return {"budget": {"epsilon": draw(st.sampled_from([0.1, 1.0, 8.0])), "delta": delta,
                       "accounting": draw(st.sampled_from(["basic", "pld"]))}, "queries": queries}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=specs())
def test_every_plan_spends_at_most_its_budget(tmp_path_factory: pytest.TempPathFactory, body: dict) -> None:
    try:
        plan = planned(tmp_path_factory.mktemp("spec"), body)
    except SpecError as exc:
        # Specs the budget cannot serve are refused with a located reason, never mis-planned.
        assert all(p.line is not None and "cannot plan this spec" in p.message for p in exc.problems()), str(exc)
        assume(False)
    budget = body["budget"]
    assert plan.total_epsilon <= budget["epsilon"]
    assert plan.total_delta <= budget["delta"]
    parts = [(q.noise.epsilon, q.noise.delta) for query in plan.queries for q in query.quantities]
    parts += [(query.selection.epsilon, query.selection.delta) for query in plan.queries
              if query.selection.mode == "private"]
    if budget["accounting"] == "basic":
        assert accounting.compose_basic(parts) == (plan.total_epsilon, plan.total_delta)
    for query in plan.queries:
        for q in query.quantities:
            if q.noise.kind == "laplace":
                assert q.noise.sensitivity / q.noise.parameter <= q.noise.epsilon * (1 + 1e-12)
            if isinstance(q.noise, CandidatePlan):
                assert q.noise.epsilon <= query.epsilon and q.noise.delta == 0


@pytest.mark.parametrize("accounting", ["basic", "pld"])
def test_delta_goes_to_the_queries_that_use_it(tmp_path: Path, accounting: str) -> None:
    """Public partitions with Laplace noise use no δ: their share goes to the private selection (#19)."""
    plan = planned(tmp_path, {
        "budget": {"epsilon": 1.0, "delta": 1e-6, "accounting": accounting},
        "queries": [
            query("public", [{"name": "n", "kind": "count"}], group_by=["region"], partitions={"public": ["x", "y"]},
                  budget_share=3),
            query("private", [{"name": "n", "kind": "count", "noise": "laplace"}], group_by=["region"],
                  partitions={"selection": "laplace_threshold"}),
        ],
    })
    public, private = plan.queries
    assert public.delta == 0.0 and all(q.noise.delta == 0 for q in public.quantities)
    assert private.delta == 1e-6 and private.epsilon == pytest.approx(0.25)
    assert private.selection.delta == pytest.approx(1e-6, rel=1e-9)
    assert plan.total_delta == pytest.approx(1e-6, rel=1e-9) and plan.total_delta <= 1e-6


def test_delta_stays_split_when_every_query_uses_it(tmp_path: Path) -> None:
    plan = planned(tmp_path, {
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "queries": [query(name, [{"name": "n", "kind": "count"}], group_by=["region"]) for name in ("a", "b")],
    })
    assert [q.delta for q in plan.queries] == [5e-7, 5e-7]


def quantile_plan(tmp_path: Path, metrics: list[dict], **extra: object) -> Plan:
    return planned(tmp_path, {"budget": {"epsilon": 1.0}, "queries": [
        query("q", metrics, l0=3, m=10, group_by=["region"], partitions={"public": ["x", "y"]}, **extra)]})


def test_auto_takes_candidates_for_a_few_levels_and_the_tree_for_many(tmp_path: Path) -> None:
    few = quantile_plan(tmp_path, [{"name": "p", "kind": "quantile", "column": "value", "bounds": [0, 100],
                                    "q": [0.25, 0.75]}]).queries[0]
    many = quantile_plan(tmp_path, [{"name": "p", "kind": "quantile", "column": "value", "bounds": [0, 100],
                                     "q": [i / 100 for i in range(1, 100)]}]).queries[0]
    assert few.metrics[0].quantile_method == "candidates"
    assert many.metrics[0].quantile_method == "tree"
    for plan in (few, many):
        stds = dict(plan.metrics[0].rank_error_by_method)
        assert set(stds) == {"tree", "candidates"}
        assert stds[plan.metrics[0].quantile_method] == min(stds.values())


def test_auto_keeps_candidates_for_few_partitions_known_in_advance(tmp_path: Path) -> None:
    metric = {"name": "p", "kind": "median", "column": "value", "bounds": [0, 100]}
    body = {"budget": {"epsilon": 1.0, "delta": 1e-6}, "queries": [
        query("global", [metric], l0=3, m=10),
        query("few", [metric], l0=3, m=10, group_by=["region"], partitions={"public": ["x", "y"]}),
        query("many", [metric], l0=3, m=10, group_by=["region"], partitions={"public": [f"k{i}" for i in range(17)]}),
        query("private", [metric], l0=3, m=10, group_by=["region"]),
    ]}
    plans = {q.name: q.metrics[0] for q in planned(tmp_path, body).queries}
    assert {name: m.quantile_method for name, m in plans.items()} == {
        "global": "candidates", "few": "candidates", "many": "tree", "private": "tree"}
    assert plans["many"].quantile_reason == "more than 16 partitions"
    assert plans["few"].quantile_reason == "the smaller predicted error"


def test_candidates_spend_the_share_over_l0_and_levels(tmp_path: Path) -> None:
    plan = quantile_plan(tmp_path, [{"name": "p", "kind": "quantile", "column": "value", "bounds": [0, 100],
                                     "q": [0.25, 0.75], "quantile_method": "candidates", "candidates": 101}])
    noisy = plan.queries[0].quantities[0]
    assert isinstance(noisy.noise, CandidatePlan)
    assert noisy.quantity.candidates == 101 and noisy.quantity.levels == (0.25, 0.75)
    assert noisy.noise.l0 == 3 and noisy.noise.levels == 2 and noisy.noise.epsilon_each[0] == noisy.noise.epsilon_each[1]
    assert noisy.noise.epsilon == pytest.approx(1.0, rel=1e-8) and noisy.noise.epsilon <= 1.0
    assert plan.total_epsilon == noisy.noise.epsilon


def test_quantile_metrics_of_one_column_share_one_candidate_mechanism(tmp_path: Path) -> None:
    metrics = [{"name": "lo", "kind": "min", "column": "value", "bounds": [0, 100], "quantile_method": "candidates"},
               {"name": "mid", "kind": "median", "column": "value", "bounds": [0, 100]}]
    plan = quantile_plan(tmp_path, metrics).queries[0]
    assert len(plan.quantities) == 1 and plan.quantities[0].quantity.levels == (0.0, 0.5)
    assert [m.quantile_method for m in plan.metrics] == ["candidates", "candidates"]


def test_conflicting_quantile_methods_on_one_column_are_located(tmp_path: Path) -> None:
    metrics = [{"name": "lo", "kind": "min", "column": "value", "bounds": [0, 100], "quantile_method": "candidates"},
               {"name": "mid", "kind": "median", "column": "value", "bounds": [0, 100], "quantile_method": "tree"}]
    with pytest.raises(SpecError) as caught:
        quantile_plan(tmp_path, metrics)
    (problem,) = caught.value.problems()
    assert "quantile_method" in problem.message and problem.line is not None


def test_a_quantile_with_private_partitions_and_auto_contribution_bounds_plans(tmp_path: Path) -> None:
    """Before its bounds are chosen, such a query is planned at the largest candidates (L0 = 128, m = 256),
    where the selection's share left the tree too little ε for a noise grid no coarser than its
    weights: planning failed, naming an internal quantity. The method is now chosen at the share the
    metrics really get, and a noise kind that share cannot pay for is left out."""
    metrics = [{"name": "n", "kind": "count"}, {"name": "avg", "kind": "mean", "column": "value", "bounds": "auto"},
               {"name": "med", "kind": "median", "column": "value", "bounds": "auto"},
               {"name": "typical", "kind": "median", "column": "value", "bounds": [0, 60]}]
    plan = planned(tmp_path, {"budget": {"epsilon": 1.0, "delta": 1e-6}, "queries": [query(
        "q", metrics, l0="auto", m="auto", group_by=["region"])]})
    assert [m.quantile_method for m in plan.queries[0].metrics[2:]] == ["tree", "tree"]


def test_a_quantile_its_share_cannot_pay_for_is_refused_in_the_spec_words(tmp_path: Path) -> None:
    metrics = [{"name": "n", "kind": "count", "budget_share": 10**6},
               {"name": "mid", "kind": "median", "column": "value", "bounds": [-60, 240], "quantile_method": "tree"}]
    with pytest.raises(SpecError) as caught:
        planned(tmp_path, {"budget": {"epsilon": 1.0, "delta": 1e-6}, "queries": [
            query("q", metrics, l0=100, m=1000, group_by=["region"])]})
    (problem,) = caught.value.problems()
    assert problem.field == "queries[0].metrics[1]" and problem.line is not None, problem
    assert "metric 'mid' (median of value, bounds [-60, 240]): its share of the budget is too small for the noise " \
        "of a quantile tree; give it a larger `budget_share`" in problem.message, problem.message
    assert "set `quantile_method: candidates`" in problem.message
    assert "quantile_tree(" not in problem.message


@pytest.mark.parametrize(("dtype", "bounds", "expected"), [
    (pl.Int64, [-60, 240], 301), (pl.Float64, [-60, 240], 601), (pl.Int64, [0, 10_000], 1001),
    (pl.Int64, [0.5, 10], 951), (pl.Float64, [0, 1 / 3], 1024)])
def test_the_default_grid_is_whole_numbers_or_a_round_step(tmp_path: Path, dtype: pl.DataType,
                                                                   bounds: list[float], expected: int) -> None:
    metrics = [{"name": "p", "kind": "median", "column": "value", "bounds": bounds, "quantile_method": "candidates"}]
    path = write_spec(tmp_path, {"budget": {"epsilon": 1.0}, "queries": [
        query("q", metrics, group_by=["region"], partitions={"public": ["x", "y"]})]})
    DATA.with_columns(pl.col("value").cast(dtype)).write_parquet(tmp_path / "data.parquet")
    document = json.loads(path.read_text())
    document["inputs"]["data"]["path"] = "data.parquet"
    path.write_text(json.dumps(document))
    plan = make_plan(validate(path))
    assert plan.queries[0].quantities[0].quantity.candidates == expected


def test_auto_selection_weighs_the_first_boundings_bias_once_auto_bounds_are_chosen(tmp_path: Path) -> None:
    """With DP histograms of the data (auto bounds chosen), `auto` compares released_count with a
    separate selection by the share of rows each misreports. 100 partitions of 10^5 units: both keep
    them all and the noise is tiny, so the first bounding's bias decides. Partitions of a size
    released_count keeps more often than the separate selection: released_count wins despite a bias."""
    from dprun.mechanisms.bound_choice import ChosenBounds
    from dprun.planner import SEPARATE_SELECTIONS
    from dprun.planner import make_plan as plan_with

    body = {"budget": {"epsilon": 1.0, "delta": 1e-6, "accounting": "basic"},
            "queries": [query("q", [{"name": "n", "kind": "count"}], group_by=["region"], l0="auto", m=1)]}
    validated = validate(write_spec(tmp_path, body))

    def selection(dropped: float, sizes: tuple[tuple[float, float], ...]) -> SelectionPlan:
        units = sum(size * count for size, count in sizes)
        chosen = ChosenBounds(8, 1, int(units), int(sum(c for _, c in sizes)), sizes[0][0], dropped, sizes[0][0],
                              partition_sizes=sizes)
        return plan_with(validated, {"q": chosen}).queries[0].selection

    large = ((1e5, 100.0),)
    assert selection(0.01, large).mechanism in SEPARATE_SELECTIONS
    released = selection(0.0, large)
    assert released.mechanism == "released_count"
    separate = selection(0.01, large)
    assert released.units_for_50pct is not None and separate.units_for_50pct is not None
    assert released.units_for_50pct < separate.units_for_50pct
    # Halfway between their 50% sizes released_count keeps more than half, the separate selection less.
    middle = (released.units_for_50pct + separate.units_for_50pct) / 2
    assert selection(0.05, ((middle, 1e5),)).mechanism == "released_count"


@pytest.mark.parametrize(("delta", "expected"), [(1e-6, "weighted_gaussian_threshold"), (1e-11, "truncated_geometric")])
def test_auto_selection_prefers_weighted_counts_to_plain_gaussian_ones(tmp_path: Path, delta: float,
                                                                       expected: str) -> None:
    """At the same budget weighted counts need as many units as plain ones at worst (every unit in L0
    partitions) and fewer otherwise, so `auto` takes them where Gaussian noise is allowed (δ/4 ≥ 2^-30),
    with half the weight of a plain selection by default."""
    def selection_of(partitions: dict[str, object] | None) -> SelectionPlan:
        extra = {"partitions": partitions} if partitions else {}
        return planned(tmp_path, {
            "budget": {"epsilon": 1.0, "delta": delta, "accounting": "basic"},
            "queries": [query("q", [{"name": "s", "kind": "sum", "column": "value", "bounds": [0, 10]}], l0=8,
                              group_by=["region"], **extra)],
        }).queries[0].selection

    chosen = selection_of(None)
    assert chosen.mechanism == expected
    if expected != "weighted_gaussian_threshold":
        return
    plain = selection_of({"selection": "gaussian_threshold"})
    same_budget = selection_of({"selection": "weighted_gaussian_threshold", "budget_share": 1})
    # Weights 1 (sum) and 0.5 (selection): the selection gets 1/3 of ε by default, 1/2 with budget_share 1.
    assert chosen.epsilon == pytest.approx(1 / 3, rel=1e-9) and plain.epsilon == pytest.approx(0.5, rel=1e-9)
    assert same_budget.epsilon == pytest.approx(plain.epsilon, rel=1e-12)
    assert same_budget.units_for_50pct is not None and plain.units_for_50pct is not None
    assert same_budget.units_for_50pct <= 1.02 * plain.units_for_50pct
    assert same_budget.threshold is not None and plain.threshold is not None
    assert same_budget.threshold < plain.threshold / 2  # in counts of weight: 1/√8 per unit at worst

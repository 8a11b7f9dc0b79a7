"""`auto` contribution bounds end to end through the CLI: explain-budget before any data is read,
the run that chooses them with DP, the report and the accounting.

Every one of 3,000 users visits exactly 3 of 12 shops 10 times each, so the bounds that drop
nothing and add the least noise are L0 = 4 and L∞ = 16 (the powers of two just above 3 and 10);
dropping anything costs thousands of units' worth of score, far more than 12 partitions' noise.
Larger bounds that drop nothing score within a few units of (4, 16): permute-and-flip may take
them, and the tests ask what any of them gives.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import everything, invoke, no_ambient_ledger

from dprun import api

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")
assert no_ambient_ledger  # the fixture is used by name above

SHOPS = [f"s{i:02d}" for i in range(12)]
USERS, VISITS = 3000, 10


COUNTS = [{"name": "visits", "kind": "count"}, {"name": "people", "kind": "privacy_id_count"}]


def write_spec(folder: Path, bounds: dict[str, Any], public: bool = True, accounting: str = "auto",
               metrics: list[dict[str, Any]] = COUNTS, epsilon: float = 1.0) -> Path:
    """The visits, each with a spend between 17 and 31 (in the value bin (16, 32])."""
    rng = np.random.default_rng(5)
    shops = np.concatenate([rng.choice(12, 3, replace=False) for _ in range(USERS)])
    frame = pl.DataFrame({"user": np.repeat([f"user-{u}" for u in range(USERS)], 3 * VISITS),
                          "shop": np.repeat([SHOPS[s] for s in shops], VISITS),
                          "spend": rng.uniform(17, 31, USERS * 3 * VISITS).round(2)})
    frame.sample(fraction=1.0, shuffle=True, seed=1).write_csv(folder / "visits.csv")
    query: dict[str, Any] = {
        "name": "q", "input": "visits", "group_by": ["shop"], "contribution_bounds": bounds,
        "metrics": metrics, "output": {"path": "out/q.parquet"},
    }
    if public:
        query["partitions"] = {"public": SHOPS}
    spec = {"version": 1, "privacy_unit": "user", "budget": {"epsilon": epsilon, "delta": 1e-6, "accounting": accounting},
            "inputs": {"visits": {"path": "visits.csv"}}, "queries": [query], "report": "out/report.json"}
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec))
    return path


AUTO = {"max_partitions_contributed": "auto", "max_contributions_per_partition": "auto"}


def spent(query: dict[str, Any]) -> float:
    auto = query["auto_bounds"]["epsilon"] if query["auto_bounds"] else 0.0
    return sum(q["epsilon"] for q in query["quantities"]) + query["partitions"]["epsilon"] + auto


def keeps_everything(bounds: dict[str, Any]) -> bool:
    return bounds["max_partitions_contributed"] >= 4 and bounds["max_contributions_per_partition"] >= 16


@pytest.mark.parametrize(("public", "accounting"), [(True, "basic"), (False, "auto")], ids=["public", "private"])
def test_auto_bounds_are_chosen_from_the_data_and_accounted(tmp_path: Path, public: bool, accounting: str) -> None:
    """At ε = 10 (1.5 for the auto step, 1 of it for the choice) a choice that drops rows scores at least
    600 units below (4, 16): permute-and-flip takes one with probability below e^-100."""
    spec = write_spec(tmp_path, AUTO, public, accounting, epsilon=10.0)
    explained = invoke("explain-budget", str(spec), "--format", "json")
    assert explained.exit_code == 0, everything(explained)
    before = json.loads(explained.stdout)["queries"][0]
    assert before["contribution_bounds"] == AUTO
    assert before["auto_bounds"]["epsilon"] == pytest.approx(1.5, rel=1e-9)  # 15% where a count weighs the choice
    # 12 public partitions: no unit is in more, and L0 = 16 keeps what any larger one would.
    largest = 16 if public else 128
    assert before["auto_bounds"]["candidates"]["max_partitions_contributed"][-1] == largest
    assert before["auto_bounds"]["chosen"] is None
    assert before["auto_bounds"]["partitions"] == (12 if public else None)
    text = invoke("explain-budget", str(spec))
    assert f"auto bounds: max_partitions_contributed among 1…{largest}" in text.stdout

    result = invoke("run", str(spec))
    assert result.exit_code == 0, everything(result)
    assert "choosing the contribution bounds of query q" in result.stderr + result.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    query = report["queries"][0]
    assert keeps_everything(query["contribution_bounds"]), query["contribution_bounds"]
    chosen = query["auto_bounds"]["chosen"]
    assert {k: chosen[k] for k in query["contribution_bounds"]} == query["contribution_bounds"]
    # The mean of three histograms' totals, 22 or 50 cells of discrete Laplace noise of scale 3 or 5.
    assert abs(chosen["units_estimate"] - USERS) < 200
    assert 0 < chosen["shortfall"] < 0.02
    # The auto step's ε is part of the total, within the budget. Under basic accounting the parts add up,
    # so explain-budget and the report agree exactly; under pld (`auto` with δ > 0) each is a tight bound.
    total = report["total"]["epsilon"]
    if accounting == "basic":
        assert spent(query) == pytest.approx(spent(before), rel=1e-12)
        assert total == pytest.approx(json.loads(explained.stdout)["total"]["epsilon"], rel=1e-12)
        assert spent(query) == pytest.approx(total, rel=1e-12)
    else:
        assert report["accounting"] == "pld" and report["noise_multiplier"] < 1
    assert 9.995 < total <= 10.0
    assert f"bounds chosen from the data (ε=1.5): max_partitions_contributed {chosen['max_partitions_contributed']}" in \
        (tmp_path / "out" / "report.md").read_text()
    released = pl.read_parquet(tmp_path / "out" / "q.parquet")
    truth = pl.read_csv(tmp_path / "visits.csv").group_by("shop").agg(pl.len().alias("truth"))
    # Nothing is dropped: the counts are within their noise of the truth (Laplace or Gaussian: 12 stds
    # in any of 12 partitions in far less than one run in 10^6).
    assert released.height == 12
    std = {m["name"]: m["std"] for m in query["metrics"]}
    joined = released.join(truth, on="shop")
    assert (joined["visits"] - joined["truth"]).abs().max() < 12 * std["visits"], joined
    # The dropped share is estimated from the noisy shape histograms, where a lone noisy cell far
    # from the data stays visible with probability SIZE_FALSE_ALARM (10^-3) per histogram by design
    # and then stands for many rows at the top of the grid (0.38 seen once in CI). A run without
    # one estimates little and warns of nothing: at least one of three fresh runs is such a run
    # but with probability below (2·10^-3)^3 < 10^-8.
    estimates = [(chosen["dropped_share_estimate"], chosen["warnings"])]
    while not (estimates[-1][0] < 0.2 and estimates[-1][1] == []) and len(estimates) < 3:
        again = invoke("run", str(spec), "--overwrite")
        assert again.exit_code == 0, everything(again)
        rerun = json.loads((tmp_path / "out" / "report.json").read_text())["queries"][0]["auto_bounds"]["chosen"]
        estimates.append((rerun["dropped_share_estimate"], rerun["warnings"]))
    assert estimates[-1][0] < 0.2 and estimates[-1][1] == [], estimates


def test_a_fixed_bound_stays_and_a_unit_count_needs_only_l0(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, {"max_partitions_contributed": "auto", "max_contributions_per_partition": 8,
                                 "auto_budget_share": 0.2}, epsilon=10.0)
    result = invoke("run", str(spec))
    assert result.exit_code == 0, everything(result)
    query = json.loads((tmp_path / "out" / "report.json").read_text())["queries"][0]
    assert query["contribution_bounds"]["max_contributions_per_partition"] == 8
    assert query["contribution_bounds"]["max_partitions_contributed"] >= 4
    assert query["auto_bounds"]["epsilon"] == pytest.approx(2.0, rel=1e-9)
    assert list(query["auto_bounds"]["candidates"]) == ["max_partitions_contributed"]


@pytest.mark.parametrize(("kind", "samples", "share"), [("mean", True, 0.05), ("stddev", True, 0.05),
                                                       ("sum", False, 0.15), ("median", False, 0.05)])
def test_the_kind_of_metric_sets_what_the_choice_weighs_and_spends(tmp_path: Path, kind: str, samples: bool,
                                                                    share: float) -> None:
    """A mean, a variance or a standard deviation is over the rows kept: its query's choice takes the most
    rows near the least noise (`bound_choice._least_noise`); a total or a quantile weighs its own error.
    A sum's choice scores the data and spends 15% of the query's ε by default; the others read the shape
    alone and spend 5%."""
    metric = {"name": "m", "kind": kind, "column": "spend", "bounds": [0, 40]}
    validated = api.validate(write_spec(tmp_path, AUTO, metrics=[metric], epsilon=2.0))
    choice = api.plan(validated).queries[0].bound_choice
    assert choice is not None and choice.samples_rows is samples
    assert choice.share == pytest.approx(share) and choice.epsilon == pytest.approx(2.0 * share, rel=1e-9)


def test_a_run_whose_auto_step_saw_too_little_says_so_everywhere(tmp_path: Path) -> None:
    """100 users at ε = 1: the choice may be far from the best. The run still publishes (the bounds
    are the mechanism's best guess and every number is DP), and says so in the run's output, the
    report (JSON and Markdown), the card and the JSON summary, with the share that would see enough."""
    folder = tmp_path
    spec = write_spec(folder, AUTO)
    document = json.loads(spec.read_text())
    visits = pl.read_csv(folder / "visits.csv")
    visits.filter(pl.col("user").is_in([f"user-{u}" for u in range(100)])).write_csv(folder / "visits.csv")
    spec.write_text(json.dumps(document))
    result = invoke("run", str(spec))
    assert result.exit_code == 0, everything(result)
    report = json.loads((folder / "out" / "report.json").read_text())
    [warning] = report["queries"][0]["auto_bounds"]["chosen"]["warnings"]
    assert "the auto step saw about" in warning and "privacy units" in warning
    assert "auto_budget_share" in warning or "no share of this ε would" in warning
    assert f"WARNING: query q: {warning}" in everything(result).replace("\n", " ")
    assert f"**WARNING: {warning}**" in (folder / "out" / "report.md").read_text()
    assert "The automatic bounds saw too little" in (folder / "out" / "report.html").read_text()
    again = invoke("run", str(spec), "--overwrite", "--format", "json")
    assert again.exit_code == 0, everything(again)
    [summary] = json.loads(again.stdout)["queries"]
    assert len(summary["warnings"]) == 1 and "the auto step saw about" in summary["warnings"][0]


@pytest.mark.parametrize(("bounds", "message"), [
    ({"max_partitions_contributed": 3, "max_contributions_per_partition": 2, "auto_budget_share": 0.1},
     "`auto_budget_share` is for `auto` bounds"),
    ({"max_partitions_contributed": "automatic", "max_contributions_per_partition": 2},
     "max_partitions_contributed: must be a whole number or `auto`"),
    ({"max_partitions_contributed": "auto", "max_contributions_per_partition": 2, "auto_budget_share": 0.9},
     "auto_budget_share"),
])
def test_a_wrong_auto_field_is_a_spec_error_naming_it(tmp_path: Path, bounds: dict[str, Any], message: str) -> None:
    spec = write_spec(tmp_path, bounds)
    result = invoke("validate", str(spec))
    assert result.exit_code == 1, everything(result)
    assert message in everything(result) and "spec.yaml:1:" in everything(result)


VALUES = [{"name": "visits", "kind": "count"},
          {"name": "spend", "kind": "sum", "column": "spend", "bounds": "auto"},
          {"name": "avg", "kind": "mean", "column": "spend", "bounds": "auto"},
          {"name": "typical", "kind": "median", "column": "spend", "bounds": "auto"},
          {"name": "fixed_avg", "kind": "mean", "column": "spend", "bounds": [0, 100]}]


def test_value_bounds_are_chosen_from_the_data_next_to_fixed_ones(tmp_path: Path) -> None:
    """Every spend lies in (16, 32]: both quantiles of the column are that cell, so a mean's and a median's
    bounds are [16, 32] and a sum's [0, 32]. At ε = 20 the released numbers show the bounds drop nothing."""
    spec = write_spec(tmp_path, AUTO, metrics=VALUES, epsilon=20.0)
    explained = invoke("explain-budget", str(spec), "--format", "json")
    assert explained.exit_code == 0, everything(explained)
    before = json.loads(explained.stdout)["queries"][0]
    assert [m["bounds"] for m in before["metrics"]] == [None, "auto", "auto", "auto", [0, 100]]
    assert [v["metric"] for v in before["auto_bounds"]["value_bounds"]] == ["spend", "avg", "typical"]
    assert "metrics with auto value bounds show their accuracy at bounds [0, 1]" in \
        invoke("explain-budget", str(spec)).stdout

    result = invoke("run", str(spec))
    assert result.exit_code == 0, everything(result)
    query = json.loads((tmp_path / "out" / "report.json").read_text())["queries"][0]
    chosen = query["auto_bounds"]["chosen"]
    assert keeps_everything(query["contribution_bounds"])
    assert {metric: value["bounds"] for metric, value in chosen["value_bounds"].items()} == {
        "spend": [0.0, 32.0], "avg": [16.0, 32.0], "typical": [16.0, 32.0]}
    levels = chosen["value_bounds"]["avg"]["quantile_levels"]
    assert 0.001 <= levels[0] < 0.25 and levels[1] == pytest.approx(1 - levels[0])
    assert [m["bounds"] for m in query["metrics"]] == [None, [0, 32], [16, 32], [16, 32], [0, 100]]
    assert "spend bounds [0, 32], the " in (tmp_path / "out" / "report.md").read_text()
    assert "Value bounds chosen from the data with ε = 4: spend [0, 32], avg [16, 32], typical [16, 32]" in \
        (tmp_path / "out" / "report.html").read_text()
    released = pl.read_parquet(tmp_path / "out" / "q.parquet")
    truth = pl.read_csv(tmp_path / "visits.csv").group_by("shop").agg(
        pl.col("spend").sum(), pl.col("spend").mean().alias("avg"), pl.col("spend").median().alias("typical"))
    joined = released.join(truth, on="shop", suffix="_true")
    # About 7,500 visits of 24 per shop. Laplace noise beyond 12 std: 12 values together in far less than 1e-6.
    std = {m["name"]: m["std"] for m in query["metrics"]}
    assert std["spend"] < 2000
    assert ((joined["spend"] - joined["spend_true"]).abs() < 12 * std["spend"]).all(), joined
    assert ((joined["avg"] - joined["avg_true"]).abs() < 0.5).all(), joined
    assert ((joined["typical"] - joined["typical_true"]).abs() < 1.0).all(), joined


def test_a_value_bound_of_a_text_column_is_a_located_spec_error(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, AUTO, metrics=[{"name": "s", "kind": "sum", "column": "shop", "bounds": "auto"}])
    document = json.loads(spec.read_text())
    document["inputs"]["visits"]["columns"] = {"shop": "string"}
    spec.write_text(json.dumps(document))
    result = invoke("validate", str(spec))
    assert result.exit_code == 1, everything(result)
    assert "spec.yaml:1:" in result.output and "queries[0].metrics[0].column: column 'shop' is String, not numeric" \
        in everything(result)
    wrong = write_spec(tmp_path, AUTO, metrics=[{"name": "s", "kind": "sum", "column": "spend", "bounds": "autom"}])
    result = invoke("validate", str(wrong))
    assert result.exit_code == 1 and "queries[0].metrics[0].bounds: must be `[lower, upper]`" in everything(result)

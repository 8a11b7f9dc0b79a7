"""`auto` contribution bounds end to end through the CLI: explain-budget before any data is read,
the run that chooses them with DP, the report and the accounting.

Every one of 3,000 users visits exactly 3 of 12 shops 10 times each, so the bounds that drop
nothing and add the least noise are L0 = 4 and L∞ = 16 (the powers of two just above 3 and 10);
dropping anything costs tens of thousands of rows, far more than 12 partitions' noise. The
histograms' noise (scale 3/0.1 = 30) is small next to the 3,000 units of the one cell they fill.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import everything, invoke, no_ambient_ledger

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


@pytest.mark.parametrize(("public", "accounting"), [(True, "basic"), (False, "auto")], ids=["public", "private"])
def test_auto_bounds_are_chosen_from_the_data_and_accounted(tmp_path: Path, public: bool, accounting: str) -> None:
    spec = write_spec(tmp_path, AUTO, public, accounting)
    explained = invoke("explain-budget", str(spec), "--format", "json")
    assert explained.exit_code == 0, everything(explained)
    before = json.loads(explained.stdout)["queries"][0]
    assert before["contribution_bounds"] == AUTO
    assert before["auto_bounds"]["epsilon"] == pytest.approx(0.1, rel=1e-9)
    assert before["auto_bounds"]["candidates"]["max_partitions_contributed"][-1] == 128
    assert before["auto_bounds"]["chosen"] is None
    assert before["auto_bounds"]["partitions"] == (12 if public else None)
    text = invoke("explain-budget", str(spec))
    assert "auto bounds: max_partitions_contributed among 1…128" in text.stdout

    result = invoke("run", str(spec))
    assert result.exit_code == 0, everything(result)
    assert "choosing the contribution bounds of query q" in result.stderr + result.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    query = report["queries"][0]
    assert query["contribution_bounds"] == {"max_partitions_contributed": 4, "max_contributions_per_partition": 16}
    chosen = query["auto_bounds"]["chosen"]
    assert (chosen["max_partitions_contributed"], chosen["max_contributions_per_partition"]) == (4, 16)
    assert chosen["dropped_share_estimate"] == 0.0
    # One cell's noise (scale 30, P(|noise| ≥ 500) < 1e-7); the others are below the floor.
    assert abs(chosen["units_estimate"] - USERS) < 500
    # The auto step's ε is part of the total, within the budget. Under basic accounting the parts add up,
    # so explain-budget and the report agree exactly; under pld (`auto` with δ > 0) each is a tight bound.
    total = report["total"]["epsilon"]
    if accounting == "basic":
        assert spent(query) == pytest.approx(spent(before), rel=1e-12)
        assert total == pytest.approx(json.loads(explained.stdout)["total"]["epsilon"], rel=1e-12)
        assert spent(query) == pytest.approx(total, rel=1e-12)
    else:
        assert report["accounting"] == "pld" and report["noise_multiplier"] < 1
    assert 0.999 < total <= 1.0
    assert "bounds chosen from the data (ε=0.1): max_partitions_contributed 4" in \
        (tmp_path / "out" / "report.md").read_text()
    released = pl.read_parquet(tmp_path / "out" / "q.parquet")
    truth = USERS * 3 * VISITS / 12
    # Nothing is dropped at (4, 16): the counts are within the noise (std ~200) of about 7,500 each.
    assert released.height == 12
    assert (released["visits"] - truth).abs().max() < 0.25 * truth, released


def test_a_fixed_bound_stays_and_a_unit_count_needs_only_l0(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, {"max_partitions_contributed": "auto", "max_contributions_per_partition": 8,
                                 "auto_budget_share": 0.2})
    result = invoke("run", str(spec))
    assert result.exit_code == 0, everything(result)
    query = json.loads((tmp_path / "out" / "report.json").read_text())["queries"][0]
    assert query["contribution_bounds"] == {"max_partitions_contributed": 4, "max_contributions_per_partition": 8}
    assert query["auto_bounds"]["epsilon"] == pytest.approx(0.2, rel=1e-9)
    assert list(query["auto_bounds"]["candidates"]) == ["max_partitions_contributed"]


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
    """Every spend lies in (16, 32]: a sum keeps it all at [0, 32]; a mean's noise grows with the width,
    so [16, 32]; a median's range covers the values, [16, 32]. The contribution bounds choose (4, 16).
    At ε = 20 the released numbers show the bounds drop nothing."""
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
    assert (chosen["max_partitions_contributed"], chosen["max_contributions_per_partition"]) == (4, 16)
    assert chosen["value_bounds"] == {"spend": {"bounds": [0.0, 32.0], "clipped_share_estimate": 0.0},
                                      "avg": {"bounds": [16.0, 32.0], "clipped_share_estimate": 0.0},
                                      "typical": {"bounds": [16.0, 32.0], "clipped_share_estimate": 0.0}}
    assert [m["bounds"] for m in query["metrics"]] == [None, [0, 32], [16, 32], [16, 32], [0, 100]]
    assert "spend bounds [0, 32], clipping an estimated 0.0%" in (tmp_path / "out" / "report.md").read_text()
    assert "Value bounds chosen from the data with ε = 2: spend [0, 32], avg [16, 32], typical [16, 32]" in \
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

"""`dprun profile SPEC --epsilon E` through the real command line: the DP contribution profile, the
bounds `auto` would choose, and its spend in the ledger.

The data is `test_auto_bounds`': 3,000 users, each visiting 3 of 12 shops 10 times.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from dprun_testing import everything, invoke, no_ambient_ledger
from test_auto_bounds import COUNTS, write_spec

from dprun import api

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")
assert no_ambient_ledger  # the fixture is used by name above

HAND = {"max_partitions_contributed": 2, "max_contributions_per_partition": 5}


SPEND = {"name": "spend", "kind": "sum", "column": "spend", "bounds": [0, 100]}


def test_the_profile_shows_the_contribution_shape_and_the_bounds_auto_would_choose(tmp_path: Path) -> None:
    """At ε = 20 every percentile but the partition sizes' is told, in its power-of-two bin, and the
    bounds auto would choose keep every row."""
    spec = write_spec(tmp_path, HAND, public=False, metrics=[*COUNTS, SPEND])
    result = invoke("profile", str(spec), "--epsilon", "20", "--format", "json")
    assert result.exit_code == 0, everything(result)
    found = json.loads(result.stdout)
    assert (found["epsilon"], found["delta"]) == (20.0, 0.0)
    [query] = found["queries"]

    def told(name: str) -> dict[str, object]:
        return {level: stated["at_most"] for level, stated in query[name].items()}

    assert told("partitions_per_unit") == {"p50": 4, "p90": 4, "p99": 4}  # 3, in the bin (2, 4]
    assert told("rows_per_unit_and_partition") == {"p50": 16, "p90": 16, "p99": 16}  # 10, in (8, 16]
    assert told("rows_per_unit") == {"p50": 32, "p90": 32, "p99": 32}  # 30, in (16, 32]
    assert all(0 < stated["band"] < 0.5 for stated in query["partitions_per_unit"].values())
    assert abs(query["units_estimate"] - 3000) < 30
    # Every spend is in (16, 32]: both quantiles are that cell, and a sum keeps it all at [0, 32].
    stated = query["values"]["spend"]
    assert sorted(value for name, value in stated.items() if name.startswith("p")) == [16.0, 32.0]
    assert 0 < stated["band"] < 1
    would = query["auto_would_choose"]
    assert would["max_partitions_contributed"] >= 4 and would["max_contributions_per_partition"] >= 16
    assert would["value_bounds"] == {"spend": [0.0, 32.0]} and would["epsilon_needed"] is None
    assert query["spec_bounds"] == {**HAND, "value_bounds": {"spend": [0, 100]}}
    assert not (tmp_path / "out").exists(), "a profile publishes no file"

    text = invoke("profile", str(spec), "--epsilon", "20")
    assert text.exit_code == 0, everything(text)
    assert "profile: spends ε=20 (δ=0) of this data" in text.stdout
    assert text.stdout.index("spends ε=20") < text.stdout.index("query q")
    assert "auto would choose max_partitions_contributed" in text.stdout
    assert "the spec says 2 and 5" in text.stdout
    assert "values of spend (each unit's rows weighed as one)" in text.stdout
    assert "auto would choose spend bounds: [0, 32]; the spec says [0, 100]" in text.stdout


def test_a_profile_that_cannot_see_says_so_and_recommends_nothing(tmp_path: Path) -> None:
    """300 users at ε = 0.1: every distribution's tail and the bounds are beyond what this ε can tell;
    the profile says so, with the ε that would, instead of recommending bounds it could not see."""
    spec = write_spec(tmp_path, HAND, public=False, metrics=[*COUNTS, SPEND])
    visits = pl.read_csv(tmp_path / "visits.csv")
    visits.filter(pl.col("user").is_in([f"user-{u}" for u in range(300)])).write_csv(tmp_path / "visits.csv")
    result = invoke("profile", str(spec), "--epsilon", "0.1", "--format", "json")
    assert result.exit_code == 0, everything(result)
    [query] = json.loads(result.stdout)["queries"]
    assert query["partitions_per_unit"]["p99"]["cannot_tell"] and query["partitions_per_unit"]["p99"]["epsilon_needed"] > 0.1
    would = query["auto_would_choose"]
    assert would["max_partitions_contributed"] is None and would["max_contributions_per_partition"] is None
    assert would["epsilon_needed"] > 0.1 and would["value_bounds"] == {"spend": None}
    assert query["values"]["spend"]["cannot_tell"]
    text = invoke("profile", str(spec), "--epsilon", "0.1")
    assert "auto cannot recommend contribution bounds at this ε" in text.stdout
    assert "auto would choose spend bounds: cannot tell at this ε" in text.stdout
    assert "cannot tell at this ε, its noise is too wide; --epsilon" in text.stdout


def test_the_profile_runs_on_a_hand_bounded_spec_with_a_median(tmp_path: Path) -> None:
    """Planned with every bound auto, a median's budget share must not be refused as too small."""
    median = {"name": "typical", "kind": "median", "column": "spend", "bounds": [0, 100]}
    spec = write_spec(tmp_path, HAND, metrics=[*COUNTS, median])
    assert invoke("validate", str(spec)).exit_code == 0
    result = invoke("profile", str(spec), "--epsilon", "0.1", "--format", "json")
    assert result.exit_code == 0, everything(result)
    assert "typical" in json.loads(result.stdout)["queries"][0]["values"]


def test_the_profile_is_recorded_in_the_ledger_and_does_not_block_the_release(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, HAND)
    ledger = str(tmp_path / "ledger.db")
    first = invoke("profile", str(spec), "--epsilon", "0.5", "--ledger", ledger, "--format", "json")
    assert first.exit_code == 0, everything(first)
    [entry] = api.read_ledger(ledger)
    assert (entry["kind"], entry["state"], entry["epsilon"], entry["delta"]) == ("profile", "published", "0.5", "0")
    assert json.loads(first.stdout)["ledger"]["status"]["spent"]["epsilon"] == "0.5"
    again = invoke("profile", str(spec), "--epsilon", "0.5", "--ledger", ledger)
    assert again.exit_code == 5 and "already released" in everything(again)
    assert invoke("profile", str(spec), "--epsilon", "0.5", "--ledger", ledger, "--new-release").exit_code == 0
    released = invoke("run", str(spec), "--ledger", ledger)
    assert released.exit_code == 0, everything(released)
    spent = [float(e["epsilon"]) for e in api.read_ledger(ledger)]
    assert spent[:2] == [0.5, 0.5] and 0.999 < spent[2] <= 1.0  # the release's total under its (pld) accounting


def test_a_profile_past_the_lifetime_budget_is_refused_before_reading(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, HAND)
    document = json.loads(spec.read_text())
    document["budget"]["lifetime"] = {"epsilon": 0.3}
    spec.write_text(json.dumps(document))
    result = invoke("profile", str(spec), "--epsilon", "0.5", "--ledger", str(tmp_path / "ledger.db"))
    assert result.exit_code == 4, everything(result)
    assert "exceed the lifetime budget" in everything(result)
    assert [e["state"] for e in api.read_ledger(str(tmp_path / "ledger.db"))] == []


@pytest.mark.parametrize("epsilon", ["0", "-1", "nan", "x"])
def test_a_wrong_epsilon_is_a_usage_error(tmp_path: Path, epsilon: str) -> None:
    result = invoke("profile", str(write_spec(tmp_path, HAND)), "--epsilon", epsilon)
    assert result.exit_code == 2, everything(result)
    assert "--epsilon" in everything(result) or "epsilon" in everything(result)

"""Joins of two private inputs on the privacy unit, end to end through the CLI: each input's
rows per unit are cut to `max_rows_per_unit` before the join, so a person with many rows on
both sides adds at most the product of the bounds, and the query's contribution bounds then
cap what those rows add to the outputs.

Counts are released with ε = 10^4 per query, so the discrete Laplace noise is 0 except with
probability below 1e-12 per count: a released count is the count of the bounded joined rows.
"""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dprun_testing import everything, fresh_seed, invoke, released_column
from scipy import stats

from dprun.engines import polars_steps
from dprun.engines.polars_steps import truncated

COUNTRIES = [f"c{i:02d}" for i in range(60)]
# 30 light users: one users row each (countries c00..c02), 1 to 3 events each.
USERS = pl.DataFrame({"uid": [f"u{i}" for i in range(30)], "country": [COUNTRIES[i % 3] for i in range(30)]})
EVENTS = pl.DataFrame({"uid": [f"u{i}" for i in range(30) for _ in range(1 + i % 3)]}).with_columns(
    pl.lit("view").alias("kind"))
# The heavy person: 50 users rows, each in its own country (c10..c59), and 20 events.
HEAVY_USERS = pl.DataFrame({"uid": ["heavy"] * 50, "country": COUNTRIES[10:]})
HEAVY_EVENTS = pl.DataFrame({"uid": ["heavy"] * 20, "kind": [f"k{i}" for i in range(20)]})


def write(folder: Path, join: dict[str, Any], *, heavy: bool = False, m: int = 20, l0: int = 3,
          partitions: dict[str, Any] | None = None) -> Path:
    users, events = (pl.concat([USERS, HEAVY_USERS]), pl.concat([EVENTS, HEAVY_EVENTS])) if heavy else (USERS, EVENTS)
    users.write_csv(folder / "users.csv")
    events.write_csv(folder / "events.csv")
    spec = {
        "version": 1, "privacy_unit": "uid", "budget": {"epsilon": 10_000.0, "delta": 1e-6},
        "inputs": {"events": {"path": "events.csv"}, "users": {"path": "users.csv"}},
        "queries": [{
            "name": "q", "input": join, "group_by": ["country"], "partitions": partitions or {"public": COUNTRIES},
            "contribution_bounds": {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
            "metrics": [{"name": "events", "kind": "count"}], "output": {"path": "out/q.csv"},
        }],
        "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def released(spec: Path) -> dict[str, int]:
    """The released events per country, countries with none left out."""
    return {country: events for country, events in released_column(spec, "events").items() if events != 0}


def join(users: int = 1, events: int | None = None, how: str = "inner") -> dict[str, Any]:
    bounds = {"users": users} | ({"events": events} if events is not None else {})
    return {"join": ["events", "users"], "on": "uid", "how": how, "max_rows_per_unit": bounds}


def test_events_per_country_are_the_joined_counts(tmp_path: Path) -> None:
    # Light users: 10 per country with 1, 2 and 3 events: 20 events per country.
    assert released(write(tmp_path, join())) == {"c00": 10, "c01": 20, "c02": 30}


def test_a_left_join_keeps_events_of_users_without_a_users_row(tmp_path: Path) -> None:
    # Private partitions: five users without a users row, two events each, under a null country
    # (five units pass the threshold at this ε with probability above 1 − 1e-12).
    spec = write(tmp_path, join(how="left"), partitions={"selection": "laplace_threshold"})
    ghosts = pl.DataFrame({"uid": [f"g{i}" for i in range(5) for _ in range(2)], "kind": ["view"] * 10})
    pl.concat([EVENTS, ghosts]).write_csv(tmp_path / "events.csv")
    result = invoke("run", str(spec), "--overwrite")
    assert result.exit_code == 0, everything(result)
    table = pl.read_csv(tmp_path / "out" / "q.csv")
    assert dict(zip(table["country"], table["events"], strict=True)) == {"c00": 10, "c01": 20, "c02": 30, None: 10}


@pytest.mark.parametrize(("users", "events", "per_country"), [(1, None, [20]), (2, 5, [5, 5]), (3, 7, [7, 7, 7])])
def test_a_person_with_many_rows_on_both_sides_adds_at_most_the_product_of_the_bounds(
        tmp_path: Path, users: int, events: int | None, per_country: list[int]) -> None:
    light = released(write(tmp_path, join(users, events)))
    with_heavy = released(write(tmp_path, join(users, events), heavy=True))
    # The light users' counts are untouched; the heavy person adds their `events` (or all 20) rows
    # to each of `users` countries, chosen among their 50.
    assert {k: v for k, v in with_heavy.items() if k in light} == light
    added = sorted(v for k, v in with_heavy.items() if k not in light)
    assert added == per_country


def test_one_query_joins_a_private_input_and_a_lookup_each_on_its_own_columns(tmp_path: Path) -> None:
    spec = write(tmp_path, {"join": ["events", "users", "kinds"], "on": {"users": "uid", "kinds": "kind"},
                            "max_rows_per_unit": {"users": 1}})
    pl.DataFrame({"kind": ["view", "buy"], "family": ["browse", "order"]}).write_csv(tmp_path / "kinds.csv")
    document = json.loads(spec.read_text())
    document["inputs"]["kinds"] = {"path": "kinds.csv", "public": True}
    document["queries"][0] |= {"group_by": ["country", "family"], "partitions": {"selection": "laplace_threshold"}}
    spec.write_text(json.dumps(document))
    result = invoke("run", str(spec), "--overwrite")
    assert result.exit_code == 0, everything(result)
    table = pl.read_csv(tmp_path / "out" / "q.csv").sort("country")
    assert table.rows() == [("c00", "browse", 10), ("c01", "browse", 20), ("c02", "browse", 30)]


def chained(folder: Path) -> Path:
    """Events joined with users on uid, then with a public regions lookup on the country users added."""
    spec = write(folder, {"join": ["events", "users", "regions"], "on": {"users": "uid", "regions": "country"},
                          "max_rows_per_unit": {"users": 1}})
    pl.DataFrame({"country": COUNTRIES, "region": ["north" if c < "c02" else "south" for c in COUNTRIES]}).write_csv(
        folder / "regions.csv")
    document = json.loads(spec.read_text())
    document["inputs"]["regions"] = {"path": "regions.csv", "public": True}
    document["queries"][0] |= {"group_by": ["region"], "partitions": {"public": ["north", "south"]}}
    spec.write_text(json.dumps(document))
    return spec


def test_a_lookup_can_join_on_a_column_an_earlier_input_added(tmp_path: Path) -> None:
    spec = chained(tmp_path)
    assert released_column(spec, "events") == {"north": 30, "south": 30}
    document = json.loads(spec.read_text())
    document["queries"][0]["input"]["on"]["regions"] = "continent"
    spec.write_text(json.dumps(document))
    result = invoke("validate", str(spec))
    assert result.exit_code == 1
    assert "join column 'continent' is not in the inputs before 'regions'" in everything(result)


def test_the_query_bounds_still_cap_the_joined_rows(tmp_path: Path) -> None:
    # users: 3 rows (3 countries) × all 20 events = 60 joined rows; L0 = 2 and m = 4 keep 2 × 4.
    light = released(write(tmp_path, join(3), l0=2))
    with_heavy = released(write(tmp_path, join(3), heavy=True, m=4, l0=2))
    light_capped = released(write(tmp_path, join(3), m=4, l0=2))
    assert light_capped == {"c00": 10, "c01": 20, "c02": 30} == light
    assert sorted(v for k, v in with_heavy.items() if k not in light) == [4, 4]


def test_the_kept_rows_are_a_uniform_choice_among_a_person_s_rows() -> None:
    """Cut to 1 row of 10, each unit's kept row is uniform: χ² over 3,000 units, p > 1e-7."""
    seed = fresh_seed()
    units = 3000
    frame = pl.DataFrame({"uid": [u for u in range(units) for _ in range(10)], "row": list(range(10)) * units})
    kept = truncated(frame.lazy(), ["uid"], 1, seed).collect()
    assert kept.height == units and kept["uid"].n_unique() == units, f"seed={seed}"
    counts = kept["row"].value_counts().sort("row")["count"].to_list()
    assert len(counts) == 10, f"seed={seed}: {counts}"
    assert stats.chisquare(counts).pvalue > 1e-7, f"seed={seed}: {counts}"


@pytest.mark.parametrize(("uid", "kept"), [
    ([1, 2, 5, 9], [1, 2, 5, 9]),  # one row per unit, in order: nothing to cut
    ([1, 2, 2, 2, 9], [1, 2, 9]),  # in order, but unit 2 has three rows
    ([9, 2, 1, 2, 2], [1, 2, 9]),
    (["a", "b", "u10", "u9"], ["a", "b", "u10", "u9"]),  # text, in order
    (["a", "b", "b", "c"], ["a", "b", "c"]),
])
def test_a_cut_to_one_row_keeps_one_row_of_every_unit(uid: list[Any], kept: list[Any]) -> None:
    frame = pl.LazyFrame({"uid": uid, "row": range(len(uid))})
    assert sorted(truncated(frame, ["uid"], 1, fresh_seed()).collect()["uid"].to_list()) == kept


@pytest.mark.parametrize(("columns", "in_order"), [
    ({"uid": [1, 2, 5]}, True), ({"uid": ["a", "b", "u10", "u9"]}, True),
    ({"uid": [date(2026, 1, 1), date(2026, 1, 2)]}, True),
    ({"uid": [1, 2, 2]}, False), ({"uid": ["b", "a"]}, False), ({"uid": [1, 2], "day": [1, 1]}, False),
])
def test_a_table_sorted_by_its_single_unit_column_is_seen_to_need_no_cut(columns: dict[str, list[Any]],
                                                                          in_order: bool) -> None:
    units = list(columns)
    assert polars_steps._one_row_per_unit_in_order(pl.LazyFrame(columns), units) is in_order


def test_explain_budget_shows_the_join_and_the_cut(tmp_path: Path) -> None:
    spec = write(tmp_path, join(1, 50))
    result = invoke("explain-budget", str(spec))
    assert result.exit_code == 0, everything(result)
    assert ("input: events (at most 50 rows per privacy unit), joined with private users (at most 1 row per "
            "privacy unit) on uid (inner: rows without a match dropped)") in " ".join(result.output.split())
    data = json.loads(invoke("explain-budget", str(spec), "--format", "json").output)["queries"][0]
    assert data["max_rows_per_unit"] == {"events": 50, "users": 1}
    assert data["joins"] == [{"input": "users", "on": ["uid"], "how": "inner", "public": False}]
    result = invoke("run", str(spec), "--overwrite")
    assert result.exit_code == 0, everything(result)
    report = json.loads((tmp_path / "out" / "report.json").read_text())["queries"][0]
    assert report["input"] == "events" and report["max_rows_per_unit"] == {"events": 50, "users": 1}


@pytest.mark.parametrize(("join_spec", "where", "expected"), [
    ({"join": ["events", "users"], "on": "kind", "max_rows_per_unit": {"users": 1}}, "input.on",
     "a join of private inputs must be on the privacy unit: add 'uid' to `on`"),
    ({"join": ["events", "users"], "on": "uid"}, "input", "give private input 'users' a bound"),
    ({"join": ["events", "users"], "on": "uid", "max_rows_per_unit": {"users": 1, "shops": 2}},
     "input.max_rows_per_unit.shops", "not an input of this join"),
    ({"join": ["events", "users"], "on": "uid", "max_rows_per_unit": {"users": 0}},
     "input.max_rows_per_unit.users", "greater than or equal to 1"),
    ({"join": ["events", "users"], "on": {"users": "kind"}, "max_rows_per_unit": {"users": 1}}, "input.on.users",
     "must be on the privacy unit: add 'uid' to `on` for users"),
    ({"join": ["events", "users"], "on": {"events": "uid"}, "max_rows_per_unit": {"users": 1}}, "input.on.events",
     "'events' is not an input joined to 'events' here"),
    ({"join": ["events", "users"], "on": {}, "max_rows_per_unit": {"users": 1}}, "input.on",
     "give the join column(s) of input 'users'"),
])
def test_private_joins_without_the_unit_or_a_bound_are_refused(
        tmp_path: Path, join_spec: dict[str, Any], where: str, expected: str) -> None:
    result = invoke("validate", str(write(tmp_path, join_spec)))
    assert result.exit_code == 1, everything(result)
    message = everything(result)
    assert "Traceback" not in message and "spec.yaml:" in message
    assert expected in message and f"queries[0].{where}" in message, message


def test_a_missing_unit_column_on_one_side_is_refused(tmp_path: Path) -> None:
    spec = write(tmp_path, join())
    USERS.rename({"uid": "user"}).write_csv(tmp_path / "users.csv")
    result = invoke("validate", str(spec))
    assert result.exit_code == 1
    assert "join column 'uid' is not in input 'users'" in everything(result)

"""Joins with public lookup tables, end to end through the CLI: what the join keeps, what validate refuses.

Counts are released with a budget so large (ε = 10^4 per query, L∞ large enough for every row)
that the discrete Laplace noise is 0 except with probability below 1e-12 per count, so a
released count is the count of the rows the join kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dprun_testing import everything, invoke, released_column

SHOPS = pl.DataFrame({"shop": ["s0", "s1", "s2"], "city": ["Lyon", "Lyon", "Nantes"]})
# Four kinds of unit, five of each: u3's shop s9 is not in the lookup; u1 has rows in two shops of Lyon.
VISITS = pl.concat([
    pl.DataFrame({
        "uid": [f"{u}-{copy}" for u in ("u0", "u0", "u1", "u1", "u2", "u3", "u3")],
        "shop": ["s0", "s0", "s0", "s1", "s2", "s9", "s9"],
        "spend": [10.0, 20.0, 5.0, 7.0, 30.0, 1.0, 2.0],
    })
    for copy in range(5)
])


def write(folder: Path, join: dict[str, Any] | str, *, shops: pl.DataFrame = SHOPS, group_by: list[str] | None = None,
          partitions: dict[str, Any] | None = None, public: bool = True) -> Path:
    VISITS.write_csv(folder / "visits.csv")
    shops.write_csv(folder / "shops.csv")
    query: dict[str, Any] = {
        "name": "q", "input": join, "group_by": group_by if group_by is not None else ["city"],
        "contribution_bounds": {"max_partitions_contributed": 5, "max_contributions_per_partition": 10},
        "metrics": [{"name": "visits", "kind": "count"}], "output": {"path": "out/q.csv"},
    }
    if partitions is not None:
        query["partitions"] = partitions
    spec = {
        "version": 1, "privacy_unit": "uid", "budget": {"epsilon": 10_000.0, "delta": 1e-6},
        "inputs": {"visits": {"path": "visits.csv"}, "shops": {"path": "shops.csv", "public": public}},
        "queries": [query], "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def released(spec: Path) -> dict[Any, int]:
    return released_column(spec, "visits")


def test_an_inner_join_drops_rows_whose_key_the_lookup_lacks(tmp_path: Path) -> None:
    spec = write(tmp_path, {"join": ["visits", "shops"], "on": "shop", "how": "inner"},
                 partitions={"public": ["Lyon", "Nantes"]})
    assert released(spec) == {"Lyon": 20, "Nantes": 5}


def test_a_left_join_keeps_them_under_a_null_key(tmp_path: Path) -> None:
    # Private partitions: the null city is a partition like any other (its five units pass the
    # threshold at this ε with probability above 1 − 1e-12).
    spec = write(tmp_path, {"join": ["visits", "shops"], "on": "shop", "how": "left"},
                 partitions={"selection": "laplace_threshold"})
    assert released(spec) == {"Lyon": 20, "Nantes": 5, None: 10}


def test_explain_budget_shows_the_join(tmp_path: Path) -> None:
    spec = write(tmp_path, {"join": ["visits", "shops"], "on": ["shop"]}, partitions={"public": ["Lyon"]})
    result = invoke("explain-budget", str(spec))
    assert result.exit_code == 0, everything(result)
    assert "input: visits, joined with public shops on shop (inner: rows without a match dropped)" in result.output
    data = json.loads(invoke("explain-budget", str(spec), "--format", "json").output)
    assert data["queries"][0]["input"] == "visits"
    assert data["queries"][0]["joins"] == [{"input": "shops", "on": ["shop"], "how": "inner", "public": True}]
    assert data["queries"][0]["max_rows_per_unit"] == {}


def refusal(spec: Path) -> str:
    result = invoke("validate", str(spec))
    assert result.exit_code == 1, everything(result)
    assert "Traceback" not in everything(result)
    return everything(result)


def test_a_lookup_with_a_duplicate_key_is_refused_without_showing_it(tmp_path: Path) -> None:
    twice = pl.concat([SHOPS, pl.DataFrame({"shop": ["s1"], "city": ["Nantes"]})])
    message = refusal(write(tmp_path, {"join": ["visits", "shops"], "on": "shop"}, shops=twice,
                            partitions={"public": ["Lyon"]}))
    assert "spec.yaml:" in message and "queries[0].input.join[1]" in message
    assert "not unique" in message and "s1" not in message


def test_a_duplicate_key_added_after_validate_fails_the_run(tmp_path: Path) -> None:
    spec = write(tmp_path, {"join": ["visits", "shops"], "on": "shop"}, partitions={"public": ["Lyon"]})
    result = invoke("run", str(spec), "--overwrite", env={"DPRUN_TEST_BEFORE_RUN": None})
    assert result.exit_code == 0
    pl.concat([SHOPS, SHOPS.head(1)]).write_csv(tmp_path / "shops.csv")
    result = invoke("run", str(spec), "--overwrite")
    assert result.exit_code != 0 and "not unique" in everything(result)


@pytest.mark.parametrize(("join", "public", "expected"), [
    ({"join": ["visits", "shops"], "on": "shop"}, False, "a join of private inputs must be on the privacy unit"),
    ({"join": ["shops", "visits"], "on": "shop"}, True, "is a public input"),
    ("shops", True, "is a public input"),
    ({"join": ["visits", "shops"], "on": "city"}, True, "join column 'city' is not in input 'visits'"),
    ({"join": ["visits", "nope"], "on": "shop"}, True, "no input named 'nope'"),
])
def test_joins_that_are_not_a_private_input_with_lookups_or_on_the_unit_are_refused(
        tmp_path: Path, join: dict[str, Any] | str, public: bool, expected: str) -> None:
    message = refusal(write(tmp_path, join, public=public, group_by=["shop"], partitions={"public": ["s0"]}))
    assert expected in message and "queries[0].input" in message


def test_join_columns_of_different_types_are_refused(tmp_path: Path) -> None:
    numbered = pl.DataFrame({"shop": [0, 1, 2], "city": ["Lyon", "Lyon", "Nantes"]})
    spec = write(tmp_path, {"join": ["visits", "shops"], "on": "shop"}, shops=numbered, partitions={"public": ["Lyon"]})
    document = json.loads(spec.read_text())
    document["inputs"]["shops"]["columns"] = {"shop": "int64"}
    spec.write_text(json.dumps(document))
    message = refusal(spec)
    assert "join column 'shop' is String in 'visits' but Int64 in 'shops'" in message
    assert "a CSV column is read as text unless the input's `columns:` gives its type" in message

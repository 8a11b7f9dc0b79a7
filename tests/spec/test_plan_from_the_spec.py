"""The plan, the schema and the public keys come from the spec and the files' declarations, never
from data rows (docs/privacy.md, "What the plan reads").

Each reproduction runs on D and on D' = D plus one privacy unit, with the same test seed: no
released value may move by more than the plan's bound, and `explain-budget --format json` must be
the same. Before the fix, one unit's row within the first 1,000 lines of a CSV file turned a
column to text, so that public keys written with a leading zero stopped matching (every count fell
by about 100), and one non-integer value turned a quantile's grid from 301 to 601 candidates.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from dprun import api
from dprun.ledger.spend import Spend
from dprun_testing import everything, fresh_seed, invoke, no_ambient_ledger

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")
assert no_ambient_ledger  # the fixture is used by name above

UNITS = 200
INTRUDER = "SECRET-INTRUDER"


def write_spec(folder: Path, query: dict[str, Any], reading: dict[str, Any] | None = None,
               budget: dict[str, Any] | None = None) -> Path:
    spec = {
        "version": 1, "name": "neighbours", "privacy_unit": "uid",
        "budget": budget or {"epsilon": 1.0, "delta": 0.0, "accounting": "basic"},
        "inputs": {"d": {"path": "d.csv", **(reading or {})}},
        "queries": [{"name": "q", "input": "d", "output": {"path": "out/q.parquet"},
                     "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                     **query}],
        "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec))
    return path


def keyed_rows(intruder: bool) -> str:
    """200 units, each with one row of key 1 or 2; D' puts one more unit's row, with a key that is
    not a number, on the file's second line."""
    rows = [f"u{i},{1 + i % 2}" for i in range(UNITS)]
    if intruder:
        rows.insert(0, f"{INTRUDER},x")
    return "uid,k\n" + "\n".join(rows) + "\n"


def explain_and_run(spec: Path, data: str, seed: int) -> tuple[dict[str, Any], pl.DataFrame]:
    (spec.parent / "d.csv").write_text(data)
    explained = invoke("explain-budget", str(spec), "--format", "json")
    assert explained.exit_code == 0, everything(explained)
    ran = invoke("run", str(spec), "--seed", str(seed), "--overwrite")
    assert ran.exit_code == 0, f"seed={seed}: {everything(ran)}"
    assert INTRUDER not in everything(ran)
    return json.loads(explained.stdout), pl.read_parquet(spec.parent / "out" / "q.parquet").sort("k")


def test_public_keys_match_the_same_way_whatever_one_unit_writes(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["01", "02"]},
                                 "metrics": [{"name": "units", "kind": "privacy_id_count"}]})
    plan_d, on_d = explain_and_run(spec, keyed_rows(False), seed)
    plan_d2, on_d2 = explain_and_run(spec, keyed_rows(True), seed)
    assert plan_d == plan_d2
    assert on_d["k"].to_list() == on_d2["k"].to_list() == ["01", "02"]
    # Undeclared, `k` is text: "01" is not "1" on either dataset, and the intruder moves nothing.
    moved = (on_d["units"] - on_d2["units"]).abs().max()
    assert moved is not None and moved <= 1, f"seed={seed}: one unit moved a count by {moved}:\n{on_d}\n{on_d2}"


def test_a_declared_key_type_matches_leading_zeros_and_a_row_that_does_not_parse_is_located(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["01", "02"]},
                                 "metrics": [{"name": "units", "kind": "privacy_id_count"}]},
                      reading={"columns": {"k": "int64"}})
    _, released = explain_and_run(spec, keyed_rows(False), seed)
    assert released["k"].to_list() == [1, 2]
    # 100 units per key, Laplace noise of scale 1: 30 away has probability e^-30.
    assert ((released["units"] - UNITS / 2).abs() < 30).all(), f"seed={seed}: {released}"

    (tmp_path / "d.csv").write_text(keyed_rows(True))
    refused = invoke("validate", str(spec))
    assert refused.exit_code == 1, everything(refused)
    assert "d.csv: line 2: column 'k' does not parse as int64" in refused.stderr, refused.stderr
    assert INTRUDER not in everything(refused) and ",x" not in everything(refused)


def valued_rows(value: str) -> str:
    return "uid,k,v\n" + "\n".join(f"u{i},a,{value if i == 0 else i % 90}" for i in range(UNITS)) + "\n"


def test_a_quantile_grid_does_not_depend_on_a_value(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["a"]}, "metrics": [
        {"name": "mid", "kind": "median", "column": "v", "bounds": [0, 100], "quantile_method": "candidates"}]})
    plan_d, on_d = explain_and_run(spec, valued_rows("7"), seed)
    plan_d2, on_d2 = explain_and_run(spec, valued_rows("3.5"), seed)
    assert plan_d == plan_d2
    assert "1001 candidates" in json.dumps(plan_d), "an undeclared metric column is float64: the 0.1 grid"
    assert on_d.schema == on_d2.schema

    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["a"]}, "metrics": [
        {"name": "mid", "kind": "median", "column": "v", "bounds": [0, 100], "quantile_method": "candidates"}]},
        reading={"columns": {"v": "int64"}})
    whole, _ = explain_and_run(spec, valued_rows("7"), seed)
    assert "101 candidates" in json.dumps(whole), "a declared int64 column: the whole numbers"


def test_an_ndjson_input_has_the_columns_its_spec_declares(tmp_path: Path) -> None:
    rows = [{"uid": f"u{i}", "k": "ab"[i % 2], "v": i % 10} for i in range(UNITS)]
    odd = [{"uid": 12345, "k": "a", "v": 1.5, "extra": {"nested": [1]}}, *rows]
    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["a", "b"]},
                                 "metrics": [{"name": "n", "kind": "count"}]}, reading={"path": "d.ndjson"})
    (tmp_path / "d.ndjson").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    refused = invoke("validate", str(spec))
    assert refused.exit_code == 1 and "inputs.d: an NDJSON file declares no schema" in refused.stderr, \
        everything(refused)

    declared = {"uid": "string", "k": "string", "v": "float64"}
    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["a", "b"]},
                                 "metrics": [{"name": "n", "kind": "count"}]},
                      reading={"path": "d.ndjson", "columns": declared})
    plans = []
    for data in (rows, odd):
        (tmp_path / "d.ndjson").write_text("\n".join(json.dumps(r) for r in data) + "\n")
        explained = invoke("explain-budget", str(spec), "--format", "json")
        assert explained.exit_code == 0, everything(explained)
        plans.append(json.loads(explained.stdout))
        assert {name: str(dtype) for name, dtype in api.validate(spec).inputs["d"].schema.items()} == \
            {"uid": "String", "k": "String", "v": "Float64"}
    assert plans[0] == plans[1]


def test_dates_without_a_format_are_iso_8601_whatever_the_first_row_holds(tmp_path: Path) -> None:
    rows = ["uid,day,at", "u0,2020-01-02,2020-01-02T10:00:00", "u1,2021-03-04,2021-03-04 11:30:00.25"]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    spec = write_spec(tmp_path, {"derive": {"year": "EXTRACT(YEAR FROM day)", "hour": "EXTRACT(HOUR FROM at)"},
                                 "group_by": ["year", "hour"], "partitions": {"public": [[2020, 10], [2021, 11]]},
                                 "metrics": [{"name": "n", "kind": "count"}]},
                      reading={"columns": {"day": "date", "at": "datetime"}}, budget={"epsilon": 1000.0})
    ran = invoke("run", str(spec), "--seed", "1")
    assert ran.exit_code == 0, everything(ran)
    released = pl.read_parquet(tmp_path / "out" / "q.parquet").sort("year")
    assert released["n"].round().to_list() == [1, 1], released

    # Day first: not ISO 8601, so not a date, however many rows hold it (never a format guessed from them).
    (tmp_path / "d.csv").write_text("uid,day,at\n" + "".join(f"u{i},11/12/2010,2020-01-02 10:00:00\n" for i in range(50)))
    refused = invoke("validate", str(spec))
    assert refused.exit_code == 1 and "line 2: column 'day' does not parse as date" in refused.stderr, \
        everything(refused)


def test_a_public_input_with_the_privacy_unit_is_refused_where_it_says_public(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text(keyed_rows(False))
    (tmp_path / "people.csv").write_text("uid,city\nu1,Lyon\n")
    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["1"]},
                                 "metrics": [{"name": "n", "kind": "count"}]})
    document = json.loads(spec.read_text())
    document["inputs"]["people"] = {"path": "people.csv", "public": True}
    spec.write_text(json.dumps(document))
    result = invoke("validate", str(spec), "--format", "json")
    problems = [(p["field"], p["message"]) for p in json.loads(result.stdout)["problems"]]
    assert result.exit_code == 1 and problems == [(
        "inputs.people.public", "a public input holds no privacy unit, and this one has the column 'uid': a file "
        "with the privacy unit is private (remove `public: true`)")], problems


@pytest.mark.parametrize("where", ["file", "input derive", "query derive", "unit"])
def test_a_column_named_like_dprun_own_columns_is_refused_at_validate(tmp_path: Path, where: str) -> None:
    internal = "__dprun_unit_code__"
    header = f"{internal},k" if where == "unit" else f"uid,k,{internal}" if where == "file" else "uid,k"
    rows = [f"u{i},a" + (",1" if where == "file" else "") for i in range(5)]
    (tmp_path / "d.csv").write_text("\n".join([header, *rows]) + "\n")
    query: dict[str, Any] = {"group_by": ["k"], "partitions": {"public": ["a"]},
                             "metrics": [{"name": "n", "kind": "count"}]}
    if where == "query derive":
        query["derive"] = {internal: "k"}
    spec = write_spec(tmp_path, query, reading={"derive": {internal: "k"}} if where == "input derive" else None)
    if where == "unit":
        document = json.loads(spec.read_text())
        document["privacy_unit"] = internal
        spec.write_text(json.dumps(document))
    result = invoke("validate", str(spec), "--format", "json")
    assert result.exit_code == 1, everything(result)
    (problem,) = json.loads(result.stdout)["problems"]
    assert "names beginning with `__dprun_` are dprun's own columns" in problem["message"], problem
    assert problem["line"] is not None and problem["field"] == {
        "file": "inputs.d.path", "unit": "inputs.d.path", "input derive": f"inputs.d.derive.{internal}",
        "query derive": f"queries[0].derive.{internal}"}[where]


def test_the_ledger_records_no_less_than_a_release_with_auto_bounds_spends(tmp_path: Path) -> None:
    seed = fresh_seed()
    (tmp_path / "d.csv").write_text("uid,k,v\n" + "".join(f"u{i % 500},{'abc'[i % 3]},{i % 40}\n" for i in range(3000)))
    spec = write_spec(tmp_path, {"group_by": ["k"], "partitions": {"public": ["a", "b", "c"]},
                                 "contribution_bounds": {"max_partitions_contributed": "auto",
                                                         "max_contributions_per_partition": "auto"},
                                 "metrics": [{"name": "n", "kind": "count"},
                                             {"name": "s", "kind": "sum", "column": "v", "bounds": [0, 40]}]},
                      budget={"epsilon": 1.0, "delta": 1e-6, "accounting": "pld"})
    ledger = tmp_path / "ledger.db"
    ran = invoke("run", str(spec), "--seed", str(seed), "--ledger", str(ledger))
    assert ran.exit_code == 0, f"seed={seed}: {everything(ran)}"
    total = json.loads((tmp_path / "out" / "report.json").read_text())["total"]
    (entry,) = api.read_ledger(ledger)
    recorded = Spend.of(entry["epsilon"], entry["delta"])
    assert Spend.of(total["epsilon"], total["delta"]).within(recorded), \
        f"seed={seed}: the ledger recorded {recorded}, the report states {total}"

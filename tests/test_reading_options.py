"""Inputs as their sources publish them: CSV reading options, column types, located row errors (issue #19).

Each test writes a small file, runs the real CLI on a spec, and reads the outputs back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import everything, fresh_seed, invoke
from planted_secrets import SECRET_ID, leaks, write_spec

ROWS = 3000


def flights(rng: np.random.Generator, rows: int = ROWS) -> list[list[str]]:
    """Rows of (tailnum, carrier, arr_delay, day) as R writes them: NA for a missing delay."""
    delay = rng.integers(-30, 200, rows).astype(str)
    delay[rng.random(rows) < 0.1] = "NA"
    return [[f"N{n:04d}", ["AA", "B6", "UA"][c], d, f"2013-01-{day:02d}"]
            for n, c, d, day in zip(rng.integers(0, rows // 5, rows), rng.integers(0, 3, rows), delay,
                                    rng.integers(1, 29, rows))]


def write_csv(path: Path, header: list[str] | None, rows: list[list[str]], separator: str = ",") -> None:
    lines = ([separator.join(header)] if header else []) + [separator.join(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def flights_spec(folder: Path, reading: dict[str, Any], metric_column: str = "arr_delay",
                 unit: str = "tailnum") -> Path:
    return write_spec(folder, {
        "version": 1, "name": "flights", "privacy_unit": unit, "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"flights": {"path": "flights.csv", **reading}},
        "queries": [{
            "name": "delays", "input": "flights", "group_by": ["carrier"],
            "partitions": {"public": ["AA", "B6", "UA"]},
            "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 5},
            "metrics": [{"name": "flights", "kind": "count"},
                        {"name": "delay", "kind": "sum", "column": metric_column, "bounds": [-60, 240]}],
            "output": {"path": "out/delays.parquet"},
        }],
        "report": "out/report.json",
    })


def test_na_nulls_and_a_semicolon_separator_are_read_as_the_source_writes_them(tmp_path: Path) -> None:
    seed = fresh_seed()
    rows = flights(np.random.default_rng(seed))
    write_csv(tmp_path / "flights.csv", ["tailnum", "carrier", "arr_delay", "day"], rows, separator=";")
    plain = invoke("validate", str(flights_spec(tmp_path, {"separator": ";"})))
    assert plain.exit_code == 1, f"seed={seed}: {everything(plain)}"
    assert re.search(r"flights\.csv: line \d+: column 'arr_delay' holds `NA`, a usual missing-value token, where a "
                     r"float64 is expected; list it in the input's `null_values` \(e\.g\. `null_values: \['NA'\]`\)",
                     plain.stderr), f"seed={seed}: {plain.stderr}"
    typed = invoke("validate", str(flights_spec(tmp_path, {"separator": ";", "columns": {"arr_delay": "int64"}})))
    assert typed.exit_code == 1 and "holds `NA`, a usual missing-value token, where an int64 is expected" in \
        typed.stderr, f"seed={seed}: {typed.stderr}"

    spec = flights_spec(tmp_path, {"separator": ";", "null_values": ["NA"]})
    assert invoke("validate", str(spec)).exit_code == 0, f"seed={seed}"
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    released = pl.read_parquet(tmp_path / "out" / "delays.parquet").sort("carrier")
    assert released["carrier"].to_list() == ["AA", "B6", "UA"]
    # Each aircraft counts in one carrier (L0 = 1), up to 5 flights: hundreds per carrier, noise of scale 5.
    assert all(100 < n < ROWS / 2 for n in released["flights"].to_list()), f"seed={seed}: {released}"


def test_a_typed_column_is_checked_as_that_type_in_validate(tmp_path: Path) -> None:
    rows = flights(np.random.default_rng(fresh_seed()))
    write_csv(tmp_path / "flights.csv", ["tailnum", "carrier", "arr_delay", "day"], rows)
    spec = flights_spec(tmp_path, {"null_values": ["NA"], "columns": {"arr_delay": "float64",
                                                                       "day": {"type": "date", "format": "%Y-%m-%d"}}})
    checked = invoke("validate", str(spec), "--format", "json")
    assert checked.exit_code == 0, everything(checked)
    bad = flights_spec(tmp_path, {"null_values": ["NA"], "columns": {"carrier": "int64"}})
    refused = invoke("validate", str(bad))
    assert refused.exit_code == 1, everything(refused)
    assert "column 'carrier' does not parse as int64" in refused.stderr and "line 2" in refused.stderr


@pytest.mark.parametrize(("kind", "bad_line", "message"), [
    ("a value that is not its type", lambda r: r[:2] + ["12x", r[3]],
     r"line 2001: column 'arr_delay' does not parse as int64"),
    ("a field too many", lambda r: [*r, SECRET_ID], r"line 2001 has 5 fields, the header has 4"),
    ("a field too few", lambda r: r[:3], r"line 2001 has 3 fields, the header has 4"),
    # The quote runs to the end of the file, which is where the row that cannot be read ends.
    ("an unterminated quote", lambda r: [r[0], '"' + SECRET_ID, r[2], r[3]], r"line 3001 has 2 fields"),
])
def test_a_malformed_row_past_the_sample_stops_the_run_naming_file_line_and_column(
        tmp_path: Path, kind: str, bad_line: Any, message: str) -> None:
    seed = fresh_seed()
    rows = flights(np.random.default_rng(seed))
    write_csv(tmp_path / "flights.csv", ["tailnum", "carrier", "arr_delay", "day"], rows)
    spec = flights_spec(tmp_path, {"null_values": ["NA"], "columns": {"arr_delay": "int64"}})
    assert invoke("run", str(spec), "--seed", str(seed)).exit_code == 0, f"seed={seed}"
    before = (tmp_path / "out" / "delays.parquet").read_bytes()
    rows[1999] = bad_line(rows[1999])  # line 2001 of the file, after the header
    write_csv(tmp_path / "flights.csv", ["tailnum", "carrier", "arr_delay", "day"], rows)
    assert invoke("validate", str(spec)).exit_code == 0, f"seed={seed}: {kind} is past the rows validate reads"
    result = invoke("run", str(spec), "--seed", str(seed), "--overwrite")
    assert result.exit_code == 3, f"seed={seed}: {kind}: {everything(result)}"
    assert result.stderr.startswith("error: flights.csv: line "), f"seed={seed}: the path as the spec wrote it: " \
        f"{result.stderr}"
    assert re.search(message, result.stderr), f"seed={seed}: {result.stderr}"
    assert not leaks(everything(result)) and "12x" not in everything(result), f"seed={seed}: a value was printed"
    assert (tmp_path / "out" / "delays.parquet").read_bytes() == before, f"seed={seed}: the release changed"


def test_no_header_and_comment_lines(tmp_path: Path) -> None:
    seed = fresh_seed()
    rows = flights(np.random.default_rng(seed), rows=600)
    lines = ["# exported 2013-02-01"] + [",".join(row) for row in rows[:300]] + ["# page 2"] + \
        [",".join(row) for row in rows[300:]]
    (tmp_path / "flights.csv").write_text("\n".join(lines) + "\n")
    spec = flights_spec(tmp_path, {"has_header": False, "comment_prefix": "#", "null_values": ["NA"]},
                        metric_column="column_2", unit="column_0")
    document = json.loads(spec.read_text())
    document["queries"][0]["group_by"] = ["column_1"]
    spec.write_text(json.dumps(document))
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    assert pl.read_parquet(tmp_path / "out" / "delays.parquet")["column_1"].sort().to_list() == ["AA", "B6", "UA"]


@pytest.mark.parametrize(("reading", "field", "message"), [
    ({"separator": ";"}, "inputs.flights.separator", "`separator` is a reading option for CSV inputs; this input is parquet"),
    ({"columns": {"no_such": "int64"}}, "inputs.flights.columns.no_such", "column 'no_such' is not in the input"),
])
def test_reading_options_that_do_not_fit_are_refused_where_they_are(tmp_path: Path, reading: dict[str, Any],
                                                                      field: str, message: str) -> None:
    pl.DataFrame({"tailnum": ["N1"], "carrier": ["AA"], "arr_delay": [1.0]}).write_parquet(tmp_path / "f.parquet")
    spec = flights_spec(tmp_path, reading)
    document = json.loads(spec.read_text())
    document["inputs"]["flights"]["path"] = "f.parquet"
    spec.write_text(json.dumps(document))
    result = invoke("validate", str(spec), "--format", "json")
    problems = json.loads(result.stdout)["problems"]
    assert result.exit_code == 1 and [(p["field"], p["message"]) for p in problems] == [(field, message)]


@pytest.mark.parametrize(("reading", "message"), [
    ({"separator": ";;"}, "at most 1 character"),
    ({"separator": "\n"}, "one ASCII character other than a line break"),
    ({"columns": {"x": {"type": "int64", "format": "%Y"}}}, "only for date and datetime columns"),
    ({"encoding": "latin1"}, "'utf8' or 'utf8-lossy'"),
])
def test_reading_options_are_validated(tmp_path: Path, reading: dict[str, Any], message: str) -> None:
    write_csv(tmp_path / "flights.csv", ["tailnum", "carrier", "arr_delay", "day"], [["N1", "AA", "1", "2013-01-01"]])
    result = invoke("validate", str(flights_spec(tmp_path, reading)))
    assert result.exit_code == 1 and message in result.stderr, everything(result)


def derived_spec(folder: Path, rng: np.random.Generator, input_derive: dict[str, str],
                 query_changes: dict[str, Any]) -> Path:
    write_csv(folder / "flights.csv", ["tailnum", "carrier", "arr_delay", "day"], flights(rng))
    spec = flights_spec(folder, {"null_values": ["NA"], "columns": {"day": "date", "arr_delay": "int64"},
                                 "derive": input_derive})
    document = json.loads(spec.read_text())
    document["queries"][0].update(query_changes)
    spec.write_text(json.dumps(document))
    return spec


def test_derived_columns_in_the_privacy_unit_group_by_filter_and_metrics(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = derived_spec(tmp_path, np.random.default_rng(seed),
                        {"aircraft": "UPPER(tailnum)", "delay_or_zero": "COALESCE(arr_delay, 0)",
                         "late": "arr_delay > 15"},
                        {"derive": {"week": "EXTRACT(DAY FROM day) / 7"}, "group_by": ["week"],
                         "filter": "late", "partitions": {"public": [0, 1, 2, 3, 4]},
                         "metrics": [{"name": "late_flights", "kind": "count"},
                                     {"name": "delay", "kind": "sum", "column": "delay_or_zero",
                                      "bounds": [0, 240]}]})
    document = json.loads(spec.read_text())
    document["privacy_unit"] = "aircraft"
    document["budget"]["epsilon"] = 100.0  # little noise: the test looks at what the columns mean
    spec.write_text(json.dumps(document))
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    released = pl.read_parquet(tmp_path / "out" / "delays.parquet").sort("week")
    assert released["week"].to_list() == [0, 1, 2, 3, 4], f"seed={seed}: {released}"
    # Only late flights count: their delays are above 15 (about 107 on average), and so is each week's mean.
    weeks = released.filter(pl.col("late_flights") > 30)
    assert weeks.height >= 3 and ((weeks["delay"] / weeks["late_flights"]) > 15).all(), f"seed={seed}: {released}"


@pytest.mark.parametrize(("input_derive", "query_changes", "field", "message"), [
    ({"n": "count(*) over (partition by carrier)"}, {}, "inputs.flights.derive.n", "must depend on its own row only"),
    ({}, {"derive": {"avg_delay": "avg(arr_delay)"}}, "queries[0].derive.avg_delay", "must depend on its own row"),
    ({"carrier": "UPPER(carrier)"}, {}, "inputs.flights.derive.carrier", "is a column already"),
    ({"x": "no_such + 1"}, {}, "inputs.flights.derive.x", "names unknown column(s) no_such"),
    ({"x": "day + 'x'"}, {}, "inputs.flights.derive.x", "the derived column does not apply"),
])
def test_a_derived_column_that_reads_other_rows_or_does_not_fit_is_refused_where_it_is(
        tmp_path: Path, input_derive: dict[str, str], query_changes: dict[str, Any], field: str, message: str) -> None:
    spec = derived_spec(tmp_path, np.random.default_rng(fresh_seed()), input_derive, query_changes)
    result = invoke("validate", str(spec), "--format", "json")
    problems = [(p["field"], p["message"]) for p in json.loads(result.stdout)["problems"]]
    assert result.exit_code == 1 and any(f == field and message in m for f, m in problems), problems


@pytest.mark.parametrize("fmt", ["csv", "ndjson"])
def test_a_value_past_the_sample_that_does_not_fit_its_type_is_located(tmp_path: Path, fmt: str) -> None:
    """A metric's column of a CSV input is read as float64 (an NDJSON input's as `columns` says); a
    value past the 1,000 rows `validate` checks that does not fit it is named by file, line and column,
    never shown."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    frame = pl.DataFrame({"tailnum": [f"N{i % 300}" for i in range(2000)], "carrier": ["AA"] * 2000,
                          "arr_delay": rng.integers(0, 100, 2000)})
    if fmt == "csv":
        frame.write_csv(tmp_path / "flights.csv")
        lines = (tmp_path / "flights.csv").read_text().splitlines()
        lines[1499] = f"N1,AA,{SECRET_ID}"  # line 1500 of the file, the header being line 1
        (tmp_path / "flights.csv").write_text("\n".join(lines) + "\n")
    else:
        frame.write_ndjson(tmp_path / "flights.csv")  # the spec below names the format
        lines = (tmp_path / "flights.csv").read_text().splitlines()
        lines[1499] = json.dumps({"tailnum": "N1", "carrier": "AA", "arr_delay": SECRET_ID})
        (tmp_path / "flights.csv").write_text("\n".join(lines) + "\n")
    spec = flights_spec(tmp_path, {} if fmt == "csv" else {
        "format": "ndjson", "columns": {"tailnum": "string", "carrier": "string", "arr_delay": "int64"}})
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 3, f"seed={seed}: {everything(result)}"
    assert "line 1500: column 'arr_delay'" in result.stderr and not leaks(result.stderr), f"seed={seed}: {result.stderr}"


def test_a_parquet_column_that_does_not_convert_to_its_declared_type_is_named(tmp_path: Path) -> None:
    seed = fresh_seed()
    delays = [str(d) for d in np.random.default_rng(seed).integers(0, 100, 2000)]
    delays[1700] = SECRET_ID
    pl.DataFrame({"tailnum": [f"N{i % 300}" for i in range(2000)], "carrier": ["AA"] * 2000,
                  "arr_delay": delays}).write_parquet(tmp_path / "f.parquet")
    spec = flights_spec(tmp_path, {"columns": {"arr_delay": "int64"}})
    document = json.loads(spec.read_text())
    document["inputs"]["flights"]["path"] = "f.parquet"
    spec.write_text(json.dumps(document))
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 3, f"seed={seed}: {everything(result)}"
    assert "f.parquet: column 'arr_delay' holds a value that does not convert to int64" in result.stderr
    assert not leaks(result.stderr), f"seed={seed}: {result.stderr}"

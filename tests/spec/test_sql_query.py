"""Queries written in SQL (dprun/spec/sql_query.py): each example spec's SQL twin plans exactly as
the spec does, and what SQL can say that dprun cannot bound is refused, located inside the statement.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from ruamel.yaml import YAML

from dprun_testing import everything, example_copy, invoke, no_ambient_ledger

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")
assert no_ambient_ledger  # the fixture is used by name above

YAML_FIELDS = ("input", "derive", "filter", "group_by", "metrics")

# Each example spec's queries, written in SQL: (the statement, the fields that stay in YAML beside it).
TWINS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "restaurants_public": [(
        "SELECT restaurant_id, COUNT(*) AS visits, SUM(spend_eur) AS spend, AVG(spend_eur) AS avg_spend\n"
        "FROM visits\nWHERE spend_eur >= 0\nGROUP BY restaurant_id",
        {"bounds": {"spend_eur": [0, 60]}, "metric_options": {"spend": {"budget_share": 2},
                                                              "avg_spend": {"budget_share": 2}}})],
    "restaurants_private": [(
        "SELECT restaurant_id, weekday, COUNT(DISTINCT visitor_id) AS visitors, AVG(spend_eur) AS avg_spend\n"
        "FROM visits GROUP BY restaurant_id, weekday", {"bounds": {"spend_eur": [0, 60]}})],
    "restaurants_by_cuisine": [(
        "SELECT cuisine, COUNT(*) AS visits, AVG(spend_eur) AS avg_spend\n"
        "FROM visits JOIN restaurants USING (restaurant_id) GROUP BY cuisine", {"bounds": {"spend_eur": [0, 60]}})],
    "restaurants_spend_quantiles": [(
        "SELECT restaurant_id,\n"
        "  PERCENTILE_CONT(0.1) WITHIN GROUP (ORDER BY spend_eur) AS spend_p10,\n"
        "  QUANTILE_CONT(spend_eur, 0.5) AS spend_p50,\n"
        "  PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY spend_eur) AS spend_p90\n"
        "FROM visits GROUP BY restaurant_id",
        {"bounds": {"spend_eur": [0, 60]}, "metric_options": {"spend": {"unit": "EUR"}}})],
    "visits_by_home_city": [(
        "SELECT home_city, COUNT(*) AS visits, COUNT(DISTINCT visitor_id) AS visitors\n"
        "FROM visits JOIN visitors ON visits.visitor_id = visitors.visitor_id GROUP BY home_city",
        {"max_rows_per_unit": {"visitors": 1}})],
    "restaurants_multi": [
        ("SELECT COUNT(*) AS visits, COUNT(DISTINCT visitor_id) AS visitors, AVG(spend_eur) AS avg_spend FROM visits",
         {"bounds": {"spend_eur": [0, 100]}}),
        ("SELECT restaurant_id, COUNT(*) AS visits, SUM(spend_eur) AS spend FROM visits GROUP BY restaurant_id",
         {"bounds": {"spend_eur": [0, 60]}}),
        ("SELECT day, COUNT(DISTINCT visitor_id) AS visitors FROM visits GROUP BY day", {}),
        ("SELECT AVG(spend_eur) AS avg_spend, STDDEV(spend_eur) AS spend_stddev FROM visits WHERE spend_eur < 120",
         {"bounds": {"spend_eur": [0, 100]}}),
    ],
}


def yaml() -> YAML:
    loader = YAML(typ="safe", pure=True)
    loader.default_flow_style = False
    return loader


def twin(spec: Path, folder: Path) -> Path:
    """The spec with every query written in SQL, in a copy of the specs folder."""
    document = yaml().load(spec.read_text())
    for query, (sql, beside) in zip(document["queries"], TWINS[spec.stem], strict=True):
        for field in YAML_FIELDS:
            query.pop(field, None)
        query.update({"sql": sql, **beside})
    path = folder / "specs" / f"{spec.stem}_sql.yaml"
    with path.open("w") as handle:
        yaml().dump(document, handle)
    return path


def explained(spec: Path) -> dict[str, Any]:
    result = invoke("explain-budget", str(spec), "--format", "json")
    assert result.exit_code == 0, everything(result)
    document = json.loads(result.stdout)
    document.pop("spec_sha256")
    for query in document["queries"]:
        query.pop("sql", None)  # the source text: the one difference allowed
    return document


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    return example_copy(tmp_path)


@pytest.mark.parametrize("name", sorted(TWINS))
def test_every_example_spec_written_in_sql_plans_identically(examples: Path, name: str) -> None:
    spec = examples / "specs" / f"{name}.yaml"
    sql = twin(spec, examples)
    assert explained(sql) == explained(spec)
    raw = json.loads(invoke("explain-budget", str(sql), "--format", "json").stdout)
    assert [q["sql"] for q in raw["queries"]] == [statement for statement, _ in TWINS[name]]


def test_the_sql_example_runs_and_post_processes_its_release(examples: Path) -> None:
    result = invoke("run", str(examples / "specs" / "restaurants_sql.yaml"), "--seed", "3")
    assert result.exit_code == 0, everything(result)
    released = pl.read_csv(examples / "out" / "sql" / "top_cuisines.csv")
    assert released.columns == ["cuisine", "visits", "visitors", "median_spend"]
    assert released.height <= 3 and released["visits"].is_sorted(descending=True), released
    assert (released["visits"] > 1000).all(), released
    report = json.loads((examples / "out" / "sql" / "report.json").read_text())
    post = report["queries"][0]["postprocess"]
    assert post["having"] == "visits > 1000" and post["limit"] == 3 and "no budget" in post["note"]


SPEC = """version: 1
privacy_unit: uid
budget: {{epsilon: 1.0, delta: 1.0e-6}}
inputs:
  d: {{path: d.csv, columns: {{v: float64, n: int64}}}}
  e: {{path: d.csv}}
  lookup: {{path: lookup.csv, public: true}}
queries:
  - name: q
    sql: |
{sql}
    bounds: {{v: [0, 10]}}
    contribution_bounds: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
    output: {{path: out/q.csv}}
"""
SQL_LINE = 11  # the file line of the statement's first line
SQL_INDENT = 6

REFUSED = [
    # (statement, what the message says, line and column in the statement)
    ("SELECT k, COUNT(*) AS n FROM (SELECT * FROM d) GROUP BY k", "sub-query reads rows", (1, 45)),
    ("SELECT k, COUNT(*) AS n FROM d WHERE v > (SELECT AVG(v) FROM d) GROUP BY k", "sub-query reads rows", (1, 54)),
    ("SELECT k, COUNT(*) OVER (PARTITION BY k) AS n FROM d GROUP BY k", "window function (OVER", (1, 39)),
    ("SELECT k, COUNT(DISTINCT v) AS n FROM d GROUP BY k", "COUNT(DISTINCT …) is only for the privacy unit", (1, 26)),
    ("SELECT DISTINCT k FROM d", "SELECT DISTINCT releases the distinct keys", (1, 1)),
    ("SELECT k, COUNT(*) AS n FROM d GROUP BY k\nUNION\nSELECT k, COUNT(*) AS n FROM d GROUP BY k",
     "UNION, INTERSECT and EXCEPT", (1, 8)),
    ("SELECT k, COUNT(*) AS n FROM d CROSS JOIN lookup GROUP BY k", "CROSS JOIN cannot be bounded", (1, 43)),
    ("SELECT k, COUNT(*) AS n FROM d JOIN lookup ON d.k < lookup.k GROUP BY k", "on equal columns", (1, 37)),
    ("SELECT k, SUM(n) AS s FROM d GROUP BY k", "sum of 'n' needs bounds", (1, 15)),
    ("SELECT k, v, COUNT(*) AS n FROM d GROUP BY k", "'v' is neither grouped nor aggregated", (1, 11)),
    ("SELECT * FROM d", "SELECT * would release every column", (1, 1)),
    ("SELECT k FROM d GROUP BY k", "the SELECT list has no aggregate", (1, 1)),
    ("SELECT k, SUM(v) / COUNT(*) AS m FROM d GROUP BY k", "an expression of aggregates is not a metric", (1, 15)),
    ("SELECT k, SUM(v * 2) AS s FROM d GROUP BY k", "aggregate a column: derive an expression first", (1, 15)),
    ("SELECT k, COUNT(*) AS n FROM d GROUP BY 1", "GROUP BY by position", (1, 1)),
    ("WITH x AS (SELECT * FROM d) SELECT k, COUNT(*) AS n FROM x GROUP BY k", "WITH (a common table expression)",
     (1, 6)),
    ("SELECT k, COUNT(*) AS n FROM d WHERE COUNT(*) > 3 GROUP BY k", "aggregate in WHERE reads other rows", (1, 1)),
    ("SELECT k, COUNT(*) AS n FROM d GROUP BY k HAVING SUM(v) > 3", "HAVING uses an aggregate the SELECT list does "
     "not release", (1, 54)),
    ("SELECT k, COUNT(*) AS n FROM d GROUP BY k ORDER BY v", "ORDER BY can only use the released columns", (1, 52)),
    ("SELECT k, STRING_AGG(k, ',') AS s FROM d GROUP BY k", "is not an aggregate dprun releases", (1, 22)),
    ("SELECT k, COUNT(*) AS n FROM d GROUP BY k LIMIT 3 OFFSET 2", "OFFSET is not supported", (1, 1)),
    ("SELECT k, COUNT(*) AS n FROM d RIGHT JOIN lookup USING (k) GROUP BY k", "RIGHT JOIN cannot be bounded", (1, 43)),
    ("SELECT k, COUNT(*) AS n FROM d GROUP BY k; SELECT 1", "give one SELECT statement", (1, 1)),
    ("SELECT k, COUNT(* AS n FROM d GROUP BY k", "the SQL does not parse", (1, 20)),
    ("DELETE FROM d", "only SELECT is supported", (1, 1)),
]


def write(folder: Path, sql: str) -> Path:
    (folder / "d.csv").write_text("uid,k,v,n\n" + "".join(f"u{i},{'ab'[i % 2]},{i % 10},{i}\n" for i in range(40)))
    (folder / "lookup.csv").write_text("k,name\na,A\nb,B\n")
    body = "\n".join(" " * SQL_INDENT + line for line in sql.splitlines())
    path = folder / "spec.yaml"
    path.write_text(SPEC.format(sql=body))
    return path


def test_the_refusals_are_many() -> None:
    assert len(REFUSED) >= 15


@pytest.mark.parametrize(("sql", "message", "at"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_sql_dprun_cannot_bound_is_refused_inside_the_statement(tmp_path: Path, sql: str, message: str,
                                                                at: tuple[int, int]) -> None:
    result = invoke("validate", str(write(tmp_path, sql)), "--format", "json")
    assert result.exit_code == 1, everything(result)
    (problem,) = json.loads(result.stdout)["problems"]
    assert problem["field"] == "queries[0].sql" and message in problem["message"], problem
    line, column = at
    assert problem["message"].endswith(f"(line {line}, column {column} of the SQL)"), problem["message"]
    assert (problem["line"], problem["column"]) == (SQL_LINE + line - 1, SQL_INDENT + column), problem


def test_a_problem_with_a_compiled_field_is_located_in_the_statement(tmp_path: Path) -> None:
    """Columns are checked against the input as in YAML; the location is the column in the SQL."""
    result = invoke("validate", str(write(tmp_path, "SELECT k,\n  COUNT(nope) AS n\nFROM d GROUP BY k")), "--format",
                    "json")
    assert result.exit_code == 1, everything(result)
    (problem,) = json.loads(result.stdout)["problems"]
    assert problem["field"] == "queries[0].metrics[0].column" and "column 'nope' is not in input 'd'" in \
        problem["message"], problem
    assert (problem["line"], problem["column"]) == (SQL_LINE + 1, SQL_INDENT + 9), problem  # at `nope`


def test_a_query_with_sql_takes_no_yaml_form_of_the_same_fields(tmp_path: Path) -> None:
    spec = write(tmp_path, "SELECT k, COUNT(*) AS n FROM d GROUP BY k")
    spec.write_text(spec.read_text().replace("    bounds:", "    group_by: [k]\n    bounds:"))
    result = invoke("validate", str(spec), "--format", "json")
    (problem,) = json.loads(result.stdout)["problems"]
    assert result.exit_code == 1 and problem["field"] == "queries[0].group_by", problem
    assert "takes its `group_by` from the statement" in problem["message"]


def test_a_where_clause_faces_the_row_wise_check(tmp_path: Path) -> None:
    """WHERE is a filter: a window hidden in it is refused as in YAML."""
    result = invoke("validate", str(write(tmp_path, "SELECT k, COUNT(*) AS n FROM d WHERE v > 1 AND LENGTH(k) > 0 "
                                                    "GROUP BY k")))
    assert result.exit_code == 0, everything(result)
    spec = write(tmp_path, "SELECT k, COUNT(*) AS n FROM d WHERE date(k) IS NULL GROUP BY k")
    refused = invoke("validate", str(spec))
    assert refused.exit_code == 1 and "queries[0].filter" in refused.stderr and "without a format" in refused.stderr

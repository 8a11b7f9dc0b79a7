"""The row-wise check (`dprun.spec.row_expressions`): table-driven, for the shared check and for
`filter` through `validate`; and a filter with a sub-query never makes dprun open a file.

Each refused family is one reason a row could be kept because of other rows (aggregates,
windows, row numbers, ranks, shifts, unnesting, selectors) or a node outside the allow-list.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import polars as pl
import pytest

from dprun.errors import SpecError
from dprun.spec.row_expressions import NotRowWise, parse_row_expression, row_filter
from dprun.spec.validation import validate_spec

ROW_WISE = [
    "x > 1",
    "x >= 0 AND y < 3",
    "NOT (x = 1) OR y <> 2",
    "x BETWEEN 1 AND 5",
    "x NOT BETWEEN 1 AND 5",
    "y IN (1, 2, 3)",
    "s NOT IN ('a', 'b')",
    "x IS NULL OR s IS NOT NULL",
    "b IS TRUE",
    "b IS NOT FALSE",
    "x IS DISTINCT FROM y",
    "x + y * 2 - 1 > 0",
    "y % 2 = 0",
    "-x < 1",
    "x / 2 > 1",
    "y & 1 = 1",
    "CASE WHEN x > 1 THEN 'hi' ELSE 'lo' END = 'hi'",
    "CASE y WHEN 1 THEN true ELSE false END",
    "COALESCE(x, 0) > 1",
    "IFNULL(x, 0) > 1",
    "NULLIF(y, 0) > 1",
    "IF(x > 1, 1, 0) = 1",
    "GREATEST(x, y) > 2",
    "LEAST(x, y) < 2",
    "CAST(y AS DOUBLE) > 1.5",
    "TRY_CAST(s AS INT) > 3",
    "y::float > 1.5",
    "ABS(x) > 1",
    "ROUND(x, 1) = 1.5",
    "FLOOR(x) = 1 AND CEIL(x) = 2",
    "SQRT(ABS(x)) + LN(ABS(x) + 1) + EXP(0) > 1",
    "POW(x, 2) > 4",
    "SIGN(x) = -1",
    "SIN(x) > 0 OR ATAN2(x, y) > 0",
    "UPPER(s) = 'A'",
    "LOWER(s) LIKE 'a%'",
    "s ILIKE '%b'",
    "s ~ '^a.*'",
    "LENGTH(s) > 3",
    "SUBSTR(s, 1, 2) = 'ab'",
    "LEFT(s, 1) = 'a' OR RIGHT(s, 1) = 'z'",
    "TRIM(s) = 'a' OR LTRIM(s) = 'a'",
    "REPLACE(s, 'a', 'b') = 'b'",
    "CONCAT(s, 'x') = 'ax'",
    "s || 'x' = 'ax'",
    "STARTS_WITH(s, 'a') OR ENDS_WITH(s, 'z')",
    "STRPOS(s, 'a') = 1",
    "SPLIT_PART(s, '-', 1) = 'a'",
    "EXTRACT(MONTH FROM t) = 3",
    "EXTRACT(DOW FROM t) = 1",
    "DATE_PART('year', d) = 2024",
    "STRFTIME(t, '%Y') = '2024'",
    "d > '2024-01-01'::date",
    "t < now()",
    "t + INTERVAL '1 day' > t",
    "a[1] = 2",
    "ARRAY_LENGTH(a) > 1",
    "ARRAY_CONTAINS(a, 3)",
    "st.field = 1",
    "true",
]

REFUSED = {
    # aggregates over all rows
    "x > avg(x)": "aggregate function",
    "x > AVG(x) * 2": "aggregate function",
    "y = max(y)": "aggregate function",
    "x < median(x)": "aggregate function",
    "count(*) > 10": "aggregate function",
    "count(x) > 10": "aggregate function",
    "count(DISTINCT s) > 1": "aggregate function",
    "sum(x) > 0": "aggregate function",
    "x > min(x) + 1": "aggregate function",
    "first(x) = x": "aggregate function",
    "stddev(x) > 1": "aggregate function",
    "quantile_cont(x, 0.9) < x": "aggregate function",
    "x BETWEEN 0 AND max(x)": "aggregate function",
    "string_agg(s, ',') = 'a'": "aggregate function",
    "COALESCE(x, avg(x)) > 1": "aggregate function",
    "corr(x, y) > 0": "aggregate function",
    # windows
    "count(*) over (partition by k) >= 50": "window function",
    "sum(x) over (partition by k) > 10": "window function",
    "x - lag(x) over (order by x) > 0": "window function",
    "lead(x) over (order by x) > x": "window function",
    "first_value(x) over (partition by k) = x": "window function",
    "ntile(2) over (order by x) = 1": "window function",
    "cume_dist() over (order by x) < 0.5": "window function",
    # row numbers, ranks, positions
    "row_number() over (order by x) <= 3": "window function",
    "row_number() over () <= 3": "row number, rank, shift or range",
    "rank() over (order by x) < 3": "row number, rank, shift or range",
    "dense_rank() over (order by x) = 1": "row number, rank, shift or range",
    # more than one output per row
    "unnest(a) > 1": "more than one output per row",
    "COLUMNS('x') > 1": "more than one output per row",
    # not on the list
    "ARRAY_SUM(a) > 1": "not on dprun's list of row-wise operations",
    "array_unique(a) = a": "not on dprun's list of row-wise operations",
    # sub-queries: refused before Polars parses them
    "x > (SELECT 1)": "sub-queries (SELECT) are not allowed",
    # an option guessed from the first value read: the format of a date parse
    "date(s) > '2020-01-01'::date": "parses a date or time without a format",
    "timestamp(s) IS NULL": "parses a date or time without a format",
    "EXTRACT(YEAR FROM date(s)) = 2020": "parses a date or time without a format",
    # Spark SQL's row-position and random functions: Polars does not know them, and no engine reads the text
    "monotonically_increasing_id() > 3": "unsupported function 'monotonically_increasing_id'",
    "rand() < 0.5": "unsupported function 'rand'",
    "spark_partition_id() = 0": "unsupported function 'spark_partition_id'",
}
# With a literal format, a date parse is a function of its row.
ROW_WISE += ["date(s, '%Y-%m-%d') > '2020-01-01'::date", "timestamp(s, '%Y-%m-%d %H:%M:%S') IS NULL",
             "strptime(s, '%d/%m/%Y') IS NOT NULL"]


def test_the_tables_are_large_enough() -> None:
    assert len(ROW_WISE) >= 40 and len(REFUSED) >= 30
    assert {reason for reason in REFUSED.values()} >= {
        "aggregate function", "window function", "row number, rank, shift or range", "more than one output per row",
        "not on dprun's list of row-wise operations", "sub-queries (SELECT) are not allowed"}


@pytest.mark.parametrize("text", ROW_WISE)
def test_the_shared_check_accepts_row_wise_expressions(text: str) -> None:
    expression = parse_row_expression(text)
    assert isinstance(expression, pl.Expr)
    assert isinstance(row_filter(text), pl.Expr)


@pytest.mark.parametrize(("text", "reason"), sorted(REFUSED.items()))
def test_the_shared_check_refuses_what_reads_other_rows(text: str, reason: str) -> None:
    with pytest.raises(NotRowWise) as caught:
        parse_row_expression(text)
    assert reason in str(caught.value)
    with pytest.raises(SpecError) as spec_error:
        row_filter(text)
    assert spec_error.value.exit_code == 1 and reason in str(spec_error.value)
    assert spec_error.value.problems()[0].field == "filter"


def test_an_unknown_node_is_refused_not_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node the list does not name (as a later Polars might add) is refused."""
    from dprun.spec import row_expressions

    assert "uses Mystery, which is not on dprun's list" in (row_expressions._refusal({"Mystery": {}}, None, 0) or "")
    monkeypatch.setattr(row_expressions, "ROW_FUNCTIONS", row_expressions.ROW_FUNCTIONS - {"StringExpr.Uppercase"})
    with pytest.raises(NotRowWise, match="uses StringExpr.Uppercase, which is not on dprun's list"):
        parse_row_expression("upper(s) = 'A'")


def test_a_list_literal_counts_only_after_in() -> None:
    from dprun.spec import row_expressions

    series = {"Literal": {"Series": [0]}}
    assert row_expressions._refusal({"Function": {"input": [{"Column": "x"}, series], "function": {"Sql": {
        "IsIn": {"nulls_equal": False}}}}}, None, 0) is None
    assert "list literal" in (row_expressions._refusal(series, None, 0) or "")
    assert "list literal" in (row_expressions._refusal({"BinaryExpr": {"left": {"Column": "x"}, "op": "Eq",
                                                                        "right": series}}, None, 0) or "")


# --- through validate ---------------------------------------------------------------------


SPEC = """version: 1
privacy_unit: uid
budget: {{epsilon: 1.0}}
inputs: {{rows: {{path: rows.parquet}}}}
queries:
  - name: q
    input: rows
    filter: "{filter}"
    contribution_bounds: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
    metrics: [{{name: n, kind: count}}]
    output: {{path: out/q.csv}}
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rows")
    pl.DataFrame({
        "uid": [1, 2],
        "k": [1, 1],
        "x": [1.5, -2.0],
        "y": [1, 2],
        "s": ["a-b", "z"],
        "b": [True, False],
        "t": [dt.datetime(2024, 3, 1), dt.datetime(2024, 4, 1)],
        "d": [dt.date(2024, 3, 1), dt.date(2024, 4, 1)],
        "a": [[1, 2], [3]],
        "st": [{"field": 1}, {"field": 2}],
    }).write_parquet(folder / "rows.parquet")
    return folder


def validate_filter(folder: Path, text: str) -> None:
    path = folder / "spec.yaml"
    path.write_text(SPEC.format(filter=text.replace('"', '\\"')))
    validate_spec(path)


@pytest.mark.parametrize("text", ROW_WISE)
def test_validate_accepts_a_row_wise_filter(folder: Path, text: str) -> None:
    validate_filter(folder, text)


@pytest.mark.parametrize(("text", "reason"), sorted(REFUSED.items()))
def test_validate_refuses_a_filter_that_reads_other_rows_at_its_line(folder: Path, text: str, reason: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate_filter(folder, text)
    (problem,) = caught.value.problems()
    assert (problem.line, problem.field) == (8, "queries[0].filter")
    assert reason in problem.message


@pytest.mark.parametrize("text", [
    "(SELECT nope FROM read_csv('SECRET_FILE')) = 1",
    "x IN (select x from read_parquet('SECRET_FILE'))",
    "x > (SeLeCt 1)",
])
def test_a_filter_with_a_subquery_is_refused_without_touching_the_file(folder: Path, text: str) -> None:
    secret = folder / "SECRET_FILE"
    secret.write_text("top-secret-line\n")
    with pytest.raises(SpecError) as caught:
        validate_filter(folder, text.replace("SECRET_FILE", str(secret)))
    assert "sub-queries (SELECT) are not allowed" in str(caught.value)
    assert "top-secret-line" not in str(caught.value)
    assert ":8:" in str(caught.value)

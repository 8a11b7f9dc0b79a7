"""Spec and input-schema validation, end to end through `dprun validate`.

Every case writes a small spec (and tiny CSV/Parquet inputs) into `tmp_path`, then
checks the exit code, the field path, the LINE and a fragment of the message, three
ways: `dprun.spec.validate_spec` directly, `dprun validate` (text on stderr) and
`dprun validate --format json` (problems on stdout). The CLI is driven through
`click.testing.CliRunner` and `dprun.cli.main`, the entry point of the `dprun`
script, which turns errors into messages and exit codes (`dprun.cli.cli` alone lets
them propagate).

Line numbers below refer to BASE (numbered in the comment next to it) after the
case's edits; an edit that adds lines says so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from urllib.parse import quote
from pathlib import Path

import polars as pl
import pytest

from dprun.errors import Problem, SpecError
from dprun.spec.validation import load_spec, validate_spec
from dprun.spec.yaml_loader import parse_text
from dprun_testing import invoke

# --------------------------------------------------------------------------- helpers

TEXT_PROBLEM = re.compile(r"^error: (?P<file>.+?):(?P<line>\d+):(?P<col>\d+):(?: (?P<field>[^ :]+):)? (?P<msg>.*)$")

VISITS_CSV = (
    "visitor_id,restaurant_id,day,weekday,spend_eur\n"
    "v001,r01,2026-10-01,Thu,12.50\n"
    "v002,r02,2026-10-02,Fri,30.00\n"
    "v001,r02,2026-10-03,Sat,\n"
    "v003,r01,2026-10-03,Sat,7.25\n"
)

BASE = """\
version: 1
name: validation-test
privacy_unit: visitor_id
budget:
  epsilon: 1.0
  delta: 1.0e-6
inputs:
  visits:
    path: visits.csv
queries:
  - name: per_restaurant
    input: visits
    group_by: [restaurant_id]
    partitions:
      public: [r01, r02]
    contribution_bounds:
      max_partitions_contributed: 1
      max_contributions_per_partition: 2
    metrics:
      - {name: visits, kind: count}
      - {name: spend, kind: sum, column: spend_eur, bounds: [0, 60]}
    output:
      path: out/per_restaurant.csv
report: out/report.json
"""
#  1 version: 1
#  2 name: validation-test
#  3 privacy_unit: visitor_id
#  4 budget:
#  5   epsilon: 1.0
#  6   delta: 1.0e-6
#  7 inputs:
#  8   visits:
#  9     path: visits.csv
# 10 queries:
# 11   - name: per_restaurant
# 12     input: visits
# 13     group_by: [restaurant_id]
# 14     partitions:
# 15       public: [r01, r02]
# 16     contribution_bounds:
# 17       max_partitions_contributed: 1
# 18       max_contributions_per_partition: 2
# 19     metrics:
# 20       - {name: visits, kind: count}
# 21       - {name: spend, kind: sum, column: spend_eur, bounds: [0, 60]}
# 22     output:
# 23       path: out/per_restaurant.csv
# 24 report: out/report.json

SECOND_QUERY = """\
  - name: overall
    input: visits
    contribution_bounds:
      max_partitions_contributed: 1
      max_contributions_per_partition: 1
    metrics:
      - {name: visits, kind: count}
    output:
      path: out/overall.csv
"""
# Inserted before `report:`, SECOND_QUERY takes lines 24-32 and `report:` moves to 33.


def edit(*replacements: tuple[str, str], base: str = BASE) -> str:
    text = base
    for old, new in replacements:
        assert text.count(old) == 1, f"the test's edit {old!r} must match BASE exactly once"
        text = text.replace(old, new)
    return text


def write_inputs(folder: Path) -> None:
    (folder / "visits.csv").write_text(VISITS_CSV)
    (folder / "restaurants.csv").write_text("restaurant_id\nr01\nr02\nr03\n")
    (folder / "cities.csv").write_text("city\nParis\n")
    pl.read_csv(folder / "visits.csv").write_parquet(folder / "visits.parquet")


@dataclass(frozen=True)
class Expect:
    line: int
    field: str
    fragment: str


def problems_of(spec: Path, *, layer: str = "validate") -> list[Problem]:
    with pytest.raises(SpecError) as caught:
        (validate_spec if layer == "validate" else load_spec)(spec)
    return caught.value.problems()


def assert_matches(problems: list[dict], expected: list[Expect]) -> None:
    """Every expected problem is reported, and nothing else is."""
    shown = "\n".join(f"  {p['line']}: {p['field']}: {p['message']}" for p in problems)
    for want in expected:
        assert any(
            p["line"] == want.line and p["field"] == want.field and want.fragment in p["message"] for p in problems
        ), f"expected line {want.line}, field {want.field!r}, message containing {want.fragment!r}; got:\n{shown}"
    for problem in problems:
        assert any(
            problem["line"] == w.line and problem["field"] == w.field and w.fragment in problem["message"]
            for w in expected
        ), f"unexpected problem {problem}; all problems:\n{shown}"


def check_everywhere(spec: Path, expected: list[Expect]) -> None:
    """The same problems from validate_spec, `dprun validate` and `dprun validate --format json`."""
    direct = [p.as_dict() for p in problems_of(spec)]
    assert_matches(direct, expected)
    for problem in direct:
        assert problem["file"] == str(spec)
        assert isinstance(problem["column"], int) and problem["column"] >= 1

    as_json = invoke("validate", str(spec), "--format", "json")
    assert as_json.exit_code == 1, as_json.output
    document = json.loads(as_json.stdout)
    assert document["ok"] is False and document["exit_code"] == 1
    assert document["problems"] == direct
    assert as_json.stderr == ""

    as_text = invoke("validate", str(spec))
    assert as_text.exit_code == 1, as_text.output
    assert as_text.stdout == ""
    lines = as_text.stderr.splitlines()
    assert len(lines) == len(direct), as_text.stderr
    for text_line, problem in zip(lines, direct, strict=True):
        match = TEXT_PROBLEM.match(text_line)
        assert match is not None, f"not `error: FILE:LINE:COL: field: message`: {text_line!r}"
        assert match["file"] == str(spec)
        assert int(match["line"]) == problem["line"] and int(match["col"]) == problem["column"]
        assert (match["field"] or "") == problem["field"]
        assert match["msg"] == problem["message"]


# --------------------------------------------------------------------------- the valid base

def test_base_spec_is_valid(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(BASE)
    validated = validate_spec(spec)
    assert validated.spec.queries[0].name == "per_restaurant"
    result = invoke("validate", str(spec))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{spec}: ok"
    result = invoke("validate", str(spec), "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"ok": True, "problems": []}


# --------------------------------------------------------------------------- spec-only rules

SPEC_CASES: dict[str, tuple[str, list[Expect]]] = {
    # ----- unknown and missing fields
    "misspelt_epsilon": (
        edit(("  epsilon: 1.0\n", "  epsilom: 1.0\n")),
        [Expect(4, "budget.epsilon", "this field is required"),
         Expect(5, "budget.epsilom", "unknown field")],
    ),
    "unknown_top_level_field": (
        edit(("report: out/report.json\n", "report: out/report.json\nreprot: x.json\n")),
        [Expect(25, "reprot", "unknown field")],
    ),
    "missing_version_is_located_at_the_document": (
        edit(("version: 1\n", "")),
        [Expect(1, "version", "this field is required")],
    ),
    "missing_budget": (
        edit(("budget:\n  epsilon: 1.0\n  delta: 1.0e-6\n", "")),  # lines 4-6 removed
        [Expect(1, "budget", "this field is required")],
    ),
    "missing_contribution_bounds_is_located_at_the_query": (
        edit(("    contribution_bounds:\n      max_partitions_contributed: 1\n"
              "      max_contributions_per_partition: 2\n", "")),
        [Expect(11, "queries[0].contribution_bounds", "this field is required")],
    ),
    "missing_max_contributions_per_partition": (
        edit(("      max_contributions_per_partition: 2\n", "")),
        [Expect(16, "queries[0].contribution_bounds.max_contributions_per_partition", "this field is required")],
    ),
    "missing_output_path": (
        edit(("      path: out/per_restaurant.csv\n", "      overwrite: true\n")),
        [Expect(22, "queries[0].output.path", "this field is required")],
    ),
    "no_queries": (
        edit(("queries:\n", "queries: []\nunused:\n")),
        [Expect(10, "queries", "at least 1 item"), Expect(11, "unused", "unknown field")],
    ),
    "version_2": (
        edit(("version: 1\n", "version: 2\n")),
        [Expect(1, "version", "Input should be 1")],
    ),
    "privacy_unit_null": (
        edit(("privacy_unit: visitor_id\n", "privacy_unit:\n")),
        [Expect(3, "privacy_unit", "valid string"), Expect(3, "privacy_unit", "valid list")],
    ),
    "privacy_unit_empty_list": (
        edit(("privacy_unit: visitor_id\n", "privacy_unit: []\n")),
        [Expect(3, "privacy_unit", "valid string"), Expect(3, "privacy_unit", "at least 1 item")],
    ),
    "privacy_unit_column_listed_twice": (
        edit(("privacy_unit: visitor_id\n", "privacy_unit: [visitor_id, visitor_id]\n")),
        [Expect(3, "privacy_unit[1]", "column 'visitor_id' is listed twice")],
    ),
    # ----- budget
    "epsilon_zero": (
        edit(("  epsilon: 1.0\n", "  epsilon: 0\n")),
        [Expect(5, "budget.epsilon", "greater than 0")],
    ),
    "epsilon_negative": (
        edit(("  epsilon: 1.0\n", "  epsilon: -0.5\n")),
        [Expect(5, "budget.epsilon", "greater than 0")],
    ),
    "epsilon_nan": (
        edit(("  epsilon: 1.0\n", "  epsilon: .nan\n")),
        [Expect(5, "budget.epsilon", "finite number")],
    ),
    "epsilon_inf": (
        edit(("  epsilon: 1.0\n", "  epsilon: .inf\n")),
        [Expect(5, "budget.epsilon", "finite number")],
    ),
    "epsilon_not_a_number": (
        edit(("  epsilon: 1.0\n", "  epsilon: lots\n")),
        [Expect(5, "budget.epsilon", "valid number")],
    ),
    "delta_negative": (
        edit(("  delta: 1.0e-6\n", "  delta: -1.0e-6\n")),
        [Expect(6, "budget.delta", "greater than or equal to 0")],
    ),
    "delta_one": (
        edit(("  delta: 1.0e-6\n", "  delta: 1\n")),
        [Expect(6, "budget.delta", "less than 1")],
    ),
    "delta_above_one": (
        edit(("  delta: 1.0e-6\n", "  delta: 1.5\n")),
        [Expect(6, "budget.delta", "less than 1")],
    ),
    "accounting_unknown": (
        edit(("  delta: 1.0e-6\n", "  delta: 1.0e-6\n  accounting: rdp\n")),  # +1 line
        [Expect(7, "budget.accounting", "'basic' or 'pld'")],
    ),
    "lifetime_epsilon_zero": (
        edit(("  delta: 1.0e-6\n", "  delta: 1.0e-6\n  lifetime: {epsilon: 0}\n")),  # +1 line
        [Expect(7, "budget.lifetime.epsilon", "greater than 0")],
    ),
    # ----- metrics
    "bounds_reversed": (
        edit(("bounds: [0, 60]", "bounds: [60, 0]")),
        [Expect(21, "queries[0].metrics[1].bounds", "lower bound 60.0 must be smaller than upper bound 0.0")],
    ),
    "bounds_equal": (
        edit(("bounds: [0, 60]", "bounds: [5, 5]")),
        [Expect(21, "queries[0].metrics[1].bounds", "must be smaller than upper bound")],
    ),
    "bounds_infinite": (
        edit(("bounds: [0, 60]", "bounds: [0, .inf]")),
        [Expect(21, "queries[0].metrics[1].bounds", "bounds must be finite numbers")],
    ),
    "bounds_nan": (
        edit(("bounds: [0, 60]", "bounds: [.nan, 60]")),
        [Expect(21, "queries[0].metrics[1].bounds", "bounds must be finite numbers")],
    ),
    "bounds_one_value": (
        edit(("bounds: [0, 60]", "bounds: [0]")),
        [Expect(21, "queries[0].metrics[1].bounds", "two numbers, both required")],
    ),
    "max_partitions_contributed_zero": (
        edit(("      max_partitions_contributed: 1\n", "      max_partitions_contributed: 0\n")),
        [Expect(17, "queries[0].contribution_bounds.max_partitions_contributed", "greater than or equal to 1")],
    ),
    "max_contributions_per_partition_negative": (
        edit(("      max_contributions_per_partition: 2\n", "      max_contributions_per_partition: -3\n")),
        [Expect(18, "queries[0].contribution_bounds.max_contributions_per_partition", "greater than or equal to 1")],
    ),
    "max_contributions_fractional": (
        edit(("      max_contributions_per_partition: 2\n", "      max_contributions_per_partition: 2.5\n")),
        [Expect(18, "queries[0].contribution_bounds.max_contributions_per_partition", "valid integer")],
    ),
    "metric_budget_share_zero": (
        edit(("bounds: [0, 60]}", "bounds: [0, 60], budget_share: 0}")),
        [Expect(21, "queries[0].metrics[1].budget_share", "greater than 0")],
    ),
    "query_budget_share_negative": (
        edit(("    input: visits\n", "    input: visits\n    budget_share: -1\n")),  # +1 line
        [Expect(13, "queries[0].budget_share", "greater than 0")],
    ),
    "partitions_budget_share_inf": (
        edit(("      public: [r01, r02]\n", "      public: [r01, r02]\n      budget_share: .inf\n")),  # +1 line
        [Expect(16, "queries[0].partitions.budget_share", "finite number")],
    ),
    "sum_without_column": (
        edit(("{name: spend, kind: sum, column: spend_eur, bounds: [0, 60]}", "{name: spend, kind: sum, bounds: [0, 60]}")),
        [Expect(21, "queries[0].metrics[1]", "a `sum` metric needs `column`")],
    ),
    "mean_without_bounds": (
        edit(("{name: spend, kind: sum, column: spend_eur, bounds: [0, 60]}", "{name: spend, kind: mean, column: spend_eur}")),
        [Expect(21, "queries[0].metrics[1]", "a `mean` metric needs `bounds: [lower, upper]`")],
    ),
    "unknown_metric_kind": (
        edit(("{name: visits, kind: count}", "{name: visits, kind: cnt}")),
        [Expect(20, "queries[0].metrics[0].kind", "Input should be 'count'")],
    ),
    "bad_metric_name": (
        edit(("{name: visits, kind: count}", "{name: 2visits, kind: count}")),
        [Expect(20, "queries[0].metrics[0].name", "should match pattern")],
    ),
    "privacy_id_count_with_column": (
        edit(("{name: visits, kind: count}", "{name: visitors, kind: privacy_id_count, column: visitor_id}")),
        [Expect(20, "queries[0].metrics[0]", "a `privacy_id_count` metric takes no `column`")],
    ),
    "quantile_without_q": (
        edit(("kind: sum, column", "kind: quantile, column")),
        [Expect(21, "queries[0].metrics[1]", "a `quantile` metric needs `q`")],
    ),
    "quantile_q_above_one": (
        edit(("kind: sum, column: spend_eur, bounds: [0, 60]}", "kind: quantile, column: spend_eur, bounds: [0, 60], q: 1.5}")),
        [Expect(21, "queries[0].metrics[1].q", "quantile level 1.5 is not in [0, 1]")],
    ),
    "quantile_q_list_with_negative": (
        edit(("kind: sum, column: spend_eur, bounds: [0, 60]}", "kind: quantile, column: spend_eur, bounds: [0, 60], q: [0.5, -0.1]}")),
        [Expect(21, "queries[0].metrics[1].q", "quantile level -0.1 is not in [0, 1]")],
    ),
    "quantile_q_empty_list": (
        edit(("kind: sum, column: spend_eur, bounds: [0, 60]}", "kind: quantile, column: spend_eur, bounds: [0, 60], q: []}")),
        [Expect(21, "queries[0].metrics[1].q", "q needs at least one level")],
    ),
    "q_on_a_sum": (
        edit(("bounds: [0, 60]}", "bounds: [0, 60], q: 0.5}")),
        [Expect(21, "queries[0].metrics[1]", "`q` is only for `quantile` metrics, not `sum`")],
    ),
    "metric_noise_unknown": (
        edit(("{name: visits, kind: count}", "{name: visits, kind: count, noise: cauchy}")),
        [Expect(20, "queries[0].metrics[0].noise", "'auto', 'laplace' or 'gaussian'")],
    ),
    "no_metrics": (
        edit(("    metrics:\n      - {name: visits, kind: count}\n"
              "      - {name: spend, kind: sum, column: spend_eur, bounds: [0, 60]}\n", "    metrics: []\n")),
        [Expect(19, "queries[0].metrics", "at least 1 item")],
    ),
    # ----- references and uniqueness
    "query_input_unknown": (
        edit(("    input: visits\n", "    input: visit\n")),
        [Expect(12, "queries[0].input", "no input named 'visit' (inputs: visits)")],
    ),
    "duplicate_query_names": (
        edit(("report:", SECOND_QUERY.replace("name: overall", "name: per_restaurant") + "report:")),
        [Expect(24, "queries[1].name", "query name 'per_restaurant' is used twice")],
    ),
    "bad_query_name": (
        edit(("  - name: per_restaurant\n", "  - name: per restaurant\n")),
        [Expect(11, "queries[0].name", "should match pattern")],
    ),
    "duplicate_metric_names": (
        edit(("{name: spend, kind: sum", "{name: visits, kind: sum")),
        [Expect(21, "queries[0].metrics[1].name", "output column 'visits' is used twice in this query")],
    ),
    "metric_named_like_a_group_by_column": (
        edit(("{name: visits, kind: count}", "{name: restaurant_id, kind: count}")),
        [Expect(20, "queries[0].metrics[0].name", "output column 'restaurant_id' is used twice in this query")],
    ),
    "group_by_column_listed_twice": (
        edit(("    group_by: [restaurant_id]\n", "    group_by: [restaurant_id, restaurant_id]\n"),
             ("      public: [r01, r02]\n", "      public: [[r01, r01]]\n")),
        [Expect(13, "queries[0].group_by[1]", "column 'restaurant_id' is listed twice")],
    ),
    "quantile_levels_collide_with_a_metric": (
        edit(("{name: visits, kind: count}", "{name: spend_p50, kind: count}"),
             ("kind: sum, column: spend_eur, bounds: [0, 60]}", "kind: quantile, column: spend_eur, bounds: [0, 60], q: [0.5, 0.9]}")),
        [Expect(21, "queries[0].metrics[1].name", "output column 'spend_p50' is used twice in this query")],
    ),
    "two_queries_write_the_same_output": (
        edit(("report:", SECOND_QUERY.replace("out/overall.csv", "out/./per_restaurant.csv") + "report:")),
        [Expect(32, "queries[1].output.path", "queries 'per_restaurant' and 'overall' write the same output")],
    ),
    "output_is_an_input": (
        edit(("      path: out/per_restaurant.csv\n", "      path: visits.csv\n")),
        [Expect(23, "queries[0].output.path", "the output path is a file this spec reads")],
    ),
    "output_is_the_report": (
        edit(("      path: out/per_restaurant.csv\n", "      path: out/report.json\n      format: csv\n")),
        [Expect(23, "queries[0].output.path", "the output path is the report's path")],
    ),
    "output_suffix_unknown": (
        edit(("      path: out/per_restaurant.csv\n", "      path: out/per_restaurant.txt\n")),
        [Expect(23, "queries[0].output.path", "cannot tell the output format")],
    ),
    "output_format_unknown": (
        edit(("      path: out/per_restaurant.csv\n", "      path: out/per_restaurant.csv\n      format: xlsx\n")),
        [Expect(24, "queries[0].output.format", "'parquet' or 'csv'")],
    ),
    "report_not_json": (
        edit(("report: out/report.json\n", "report: out/report.md\n")),
        [Expect(24, "report", "the report path must end in .json")],
    ),
    # ----- partitions
    "public_and_public_file": (
        edit(("      public: [r01, r02]\n", "      public: [r01, r02]\n      public_file: restaurants.csv\n")),
        [Expect(14, "queries[0].partitions", "give either `public` or `public_file`, not both")],
    ),
    "public_list_empty": (
        edit(("      public: [r01, r02]\n", "      public: []\n")),
        [Expect(15, "queries[0].partitions.public", "the public partition list is empty")],
    ),
    "public_key_arity_mismatch": (
        edit(("    group_by: [restaurant_id]\n", "    group_by: [restaurant_id, weekday]\n"),
             ("      public: [r01, r02]\n", "      public:\n        - [r01, Thu]\n        - r02\n        - [r01, Fri, x]\n")),
        [Expect(17, "queries[0].partitions.public[1]", "a key has 1 value(s) but group_by has 2 column(s)"),
         Expect(18, "queries[0].partitions.public[2]", "a key has 3 value(s) but group_by has 2 column(s)")],
    ),
    "partitions_without_group_by": (
        edit(("    group_by: [restaurant_id]\n", "    group_by: []\n")),
        [Expect(14, "queries[0].partitions", "a query without group_by has one global partition; remove `partitions`")],
    ),
    "selection_unknown": (
        edit(("      public: [r01, r02]\n", "      selection: magic\n")),
        [Expect(15, "queries[0].partitions.selection", "Input should be 'auto'")],
    ),
    "min_privacy_units_zero": (
        edit(("      public: [r01, r02]\n", "      min_privacy_units: 0\n")),
        [Expect(15, "queries[0].partitions.min_privacy_units", "greater than or equal to 1")],
    ),
    # ----- delta = 0
    "gaussian_metric_with_delta_zero": (
        edit(("  delta: 1.0e-6\n", "  delta: 0\n"),
             ("{name: visits, kind: count}", "{name: visits, kind: count, noise: gaussian}")),
        [Expect(20, "queries[0].metrics[0].noise", "Gaussian noise needs delta > 0")],
    ),
    "gaussian_query_with_delta_zero": (
        edit(("  delta: 1.0e-6\n", "  delta: 0\n"), ("    input: visits\n", "    input: visits\n    noise: gaussian\n")),
        # no metric sets `noise`, so each is located at the metric
        [Expect(21, "queries[0].metrics[0].noise", "Gaussian noise needs delta > 0"),
         Expect(22, "queries[0].metrics[1].noise", "Gaussian noise needs delta > 0")],
    ),
    "private_partitions_without_delta": (
        edit(("  delta: 1.0e-6\n", "  delta: 0\n"), ("    partitions:\n      public: [r01, r02]\n", "")),
        [Expect(13, "queries[0].group_by", "private partition selection needs delta > 0: set budget.delta, "
                                          "or list the partitions with `partitions.public` / `partitions.public_file`")],
    ),
    "private_partitions_default_delta": (
        edit(("  delta: 1.0e-6\n", ""), ("      public: [r01, r02]\n", "      selection: laplace_threshold\n")),
        [Expect(14, "queries[0].partitions.selection", "private partition selection needs delta > 0")],
    ),
    "gaussian_threshold_without_delta": (
        edit(("  delta: 1.0e-6\n", "  delta: 0.0\n"), ("      public: [r01, r02]\n", "      selection: gaussian_threshold\n")),
        [Expect(15, "queries[0].partitions.selection", "set budget.delta"),
         Expect(15, "queries[0].partitions.selection", "gaussian_threshold needs delta > 0")],
    ),
    "released_count_without_a_count_metric": (
        edit(("      public: [r01, r02]\n", "      selection: released_count\n"),
             ("      - {name: visits, kind: count}\n", "")),
        [Expect(15, "queries[0].partitions.selection", "`released_count` thresholds a released count")],
    ),
    # ----- inputs
    "no_inputs": (
        edit(("inputs:\n  visits:\n    path: visits.csv\n", "inputs: {}\n")),
        [Expect(7, "inputs", "at least 1 item")],
    ),
    "input_format_unknown": (
        edit(("    path: visits.csv\n", "    path: visits.csv\n    format: xls\n")),
        [Expect(10, "inputs.visits.format", "'csv', 'parquet' or 'ndjson'")],
    ),
}


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_spec_rule(case: str, tmp_path: Path) -> None:
    text, expected = SPEC_CASES[case]
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    # Spec-only problems are found before any input is looked at.
    assert_matches([p.as_dict() for p in problems_of(spec, layer="load")], expected)
    check_everywhere(spec, expected)


def test_private_partitions_with_delta_and_released_count_are_valid(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(("      public: [r01, r02]\n", "      selection: released_count\n")))
    assert validate_spec(spec).spec.queries[0].partitions.selection == "released_count"
    assert invoke("validate", str(spec)).exit_code == 0


# --------------------------------------------------------------------------- parsing

PARSE_CASES: dict[str, tuple[str, list[Expect]]] = {
    "duplicated_key_is_an_error_not_last_wins": (
        edit(("  epsilon: 1.0\n", "  epsilon: 1.0\n  epsilon: 100\n")),
        [Expect(6, "", "duplicate key: epsilon")],
    ),
    "an_anchor_defined_twice_is_an_error_not_last_wins": (
        edit(("name: validation-test\n", "name: &n validation-test\n"),
             ("  epsilon: 1.0\n", "  epsilon: &n 1.0\n")),
        [Expect(5, "", "an anchor (&name) is defined twice")],
    ),
    "duplicated_top_level_key": (
        edit(("report: out/report.json\n", "report: out/report.json\nversion: 1\n")),
        [Expect(25, "", "duplicate key: version")],
    ),
    "python_object_tag_is_refused": (
        edit(("name: validation-test\n", "name: !!python/object/apply:os.system ['touch pwned']\n")),
        [Expect(2, "name", "tagged or unsupported YAML node")],
    ),
    "python_object_tag_on_a_mapping_is_refused": (
        edit(("budget:\n", "budget: !!python/object:dprun.spec.models.Budget\n")),
        [Expect(4, "budget", "tagged or unsupported YAML node")],
    ),
    "python_name_tag_is_refused": (
        edit(("  epsilon: 1.0\n", "  epsilon: !!python/name:math.inf\n")),
        [Expect(5, "budget.epsilon", "tagged or unsupported YAML node")],
    ),
    "custom_tag_is_refused": (
        edit(("    path: visits.csv\n", "    path: !env VISITS\n")),
        [Expect(9, "inputs.visits.path", "tagged or unsupported YAML node")],
    ),
    "invalid_yaml_syntax": (
        edit(("    group_by: [restaurant_id]\n", "    group_by: [restaurant_id\n")),
        [Expect(14, "", "while parsing a flow sequence")],
    ),
    "bad_indentation": (
        edit(("  delta: 1.0e-6\n", "   delta: 1.0e-6\n")),
        [Expect(6, "", "mapping values are not allowed here")],
    ),
    "tab_indentation": (
        edit(("  delta: 1.0e-6\n", "\tdelta: 1.0e-6\n")),
        [Expect(6, "", "found character '\\t' that cannot start any token")],
    ),
    "spec_is_a_list": (
        "- version: 1\n- name: x\n",
        [Expect(1, "", "the spec must be a mapping of fields")],
    ),
    "spec_is_a_scalar": (
        "just some text\n",
        [Expect(1, "", "the spec must be a mapping of fields")],
    ),
    "empty_file": (
        "",
        [Expect(1, "", "the spec must be a mapping of fields")],
    ),
    "only_comments": (
        "# nothing here\n",
        [Expect(1, "", "the spec must be a mapping of fields")],
    ),
    "non_string_key": (
        edit(("  delta: 1.0e-6\n", "  delta: 1.0e-6\n  1: one\n")),
        [Expect(7, "budget.1", "keys must be strings")],
    ),
    "date_is_not_a_name": (
        # An unquoted date is read as a date and given back as ISO text, not a crash.
        edit(("name: validation-test\n", "name: 2026-10-01\n"), ("  epsilon: 1.0\n", "  epsilon: 2026-10-01\n")),
        [Expect(5, "budget.epsilon", "valid number")],
    ),
}


@pytest.mark.parametrize("case", sorted(PARSE_CASES))
def test_parsing(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text, expected = PARSE_CASES[case]
    write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    check_everywhere(spec, expected)
    assert not (tmp_path / "pwned").exists()


def test_yaml_1_2_no_and_yes_are_strings(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(("name: validation-test\n", "name: no\n"), ("public: [r01, r02]", "public: [yes, no, on, off]")))
    validated = validate_spec(spec)
    assert validated.spec.name == "no"
    assert validated.spec.queries[0].partitions.public == ["yes", "no", "on", "off"]
    assert invoke("validate", str(spec)).exit_code == 0
    data, _ = parse_text("a: no\nb: yes\nc: off\nd: true\ne: y\n", "x.yaml")
    assert data == {"a": "no", "b": "yes", "c": "off", "d": True, "e": "y"}


def test_yaml_merge_keys_load_like_plain_keys() -> None:
    data, marks = parse_text("base: &b {epsilon: 1.0}\nbudget:\n  <<: *b\n  delta: 0.1\n", "m.yaml")
    assert data["budget"] == {"delta": 0.1, "epsilon": 1.0}
    assert marks[("budget", "epsilon")][0] in (1, 3)


def test_a_mapping_made_only_of_a_merge_loads() -> None:
    data, _ = parse_text("base: &b {epsilon: 1.0}\nbudget:\n  <<: *b\n", "m.yaml")
    assert data["budget"] == {"epsilon": 1.0}


def test_yaml_1_2_exponent_without_dot_is_a_float(tmp_path: Path) -> None:
    data, _ = parse_text("a: 1e-6\nb: 1.0e-6\nc: 0o17\nd: 017\n", "x.yaml")
    assert data["a"] == 1e-6 and type(data["a"]) is float
    assert data["b"] == 1e-6 and type(data["b"]) is float
    assert data["c"] == 15
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(("  delta: 1.0e-6\n", "  delta: 1e-6\n")))
    assert validate_spec(spec).spec.budget.delta == 1e-6
    # A float where a string is wanted is an error, which shows `1e-6` was read as a number.
    spec.write_text(edit(("name: validation-test\n", "name: 1e-6\n")))
    check_everywhere(spec, [Expect(2, "name", "valid string")])


JSON_SPEC = """\
{
  "version": 1,
  "privacy_unit": "visitor_id",
  "budget": {
    "epsilon": -1,
    "delta": 1e-6
  },
  "inputs": {"visits": {"path": "visits.csv"}},
  "queries": [
    {
      "name": "overall",
      "input": "visits",
      "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
      "metrics": [{"name": "visits", "kind": "count"}, {"name": "visits", "kind": "privacy_id_count"}],
      "output": {"path": "out/overall.csv"}
    }
  ],
  "report": "out/report.json"
}
"""


def test_json_spec_reports_the_right_line(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.json"
    spec.write_text(JSON_SPEC)
    check_everywhere(spec, [Expect(5, "budget.epsilon", "greater than 0")])
    spec.write_text(JSON_SPEC.replace('"epsilon": -1', '"epsilon": 1'))
    check_everywhere(spec, [Expect(14, "queries[0].metrics[1].name", "output column 'visits' is used twice")])
    spec.write_text(JSON_SPEC.replace('"epsilon": -1', '"epsilon": 1').replace('"name": "visits", "kind": "privacy_id_count"', '"name": "visitors", "kind": "privacy_id_count"'))
    assert invoke("validate", str(spec)).exit_code == 0
    spec.write_text(JSON_SPEC.replace('"epsilon": -1,\n', '"epsilon": 1\n'))  # a missing comma
    check_everywhere(spec, [Expect(6, "", "while parsing a flow mapping: expected ',' or '}'")])
    spec.write_text(JSON_SPEC.replace('"epsilon": -1,\n', '"epsilon": 1,\n"epsilon": 2,\n'))
    check_everywhere(spec, [Expect(6, "", "duplicate key: epsilon")])


def test_missing_spec_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as caught:
        validate_spec(missing)
    assert [p.as_dict() for p in caught.value.problems()] == [
        {"file": str(missing), "line": None, "column": None, "field": "", "message": "spec file not found"}
    ]
    result = invoke("validate", str(missing))
    assert result.exit_code == 1
    assert result.stderr == f"error: {missing}: spec file not found\n"
    result = invoke("validate", str(missing), "--format", "json")
    assert result.exit_code == 1
    assert json.loads(result.stdout)["problems"][0]["message"] == "spec file not found"


def test_spec_not_utf8(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(b"version: 1\nname: \xff\xfe\n")
    result = invoke("validate", str(spec))
    assert result.exit_code == 1
    assert "cannot read the spec file" in result.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert invoke("validate").exit_code == 2
    assert invoke("validate", str(tmp_path)).exit_code == 2  # a directory
    assert invoke("validate", "x.yaml", "--format", "xml").exit_code == 2
    assert invoke("no-such-command").exit_code == 2


# --------------------------------------------------------------------------- several problems at once

def test_all_field_problems_are_reported(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(
        ("  epsilon: 1.0\n", "  epsilon: -1\n"),
        ("  delta: 1.0e-6\n", "  delta: 2\n"),
        ("      max_partitions_contributed: 1\n", "      max_partitions_contributed: 0\n"),
        ("bounds: [0, 60]", "bounds: [60, 0]"),
        ("report: out/report.json\n", "report: out/report.json\ncolour: blue\n"),
    ))
    check_everywhere(spec, [
        Expect(5, "budget.epsilon", "greater than 0"),
        Expect(6, "budget.delta", "less than 1"),
        Expect(17, "queries[0].contribution_bounds.max_partitions_contributed", "greater than or equal to 1"),
        Expect(21, "queries[0].metrics[1].bounds", "must be smaller than upper bound"),
        Expect(25, "colour", "unknown field"),
    ])


def test_all_rule_problems_are_reported(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(
        ("    input: visits\n", "    input: visitz\n"),
        ("      public: [r01, r02]\n", "      public: []\n"),
        ("{name: spend, kind: sum", "{name: visits, kind: sum"),
        ("report: out/report.json\n", SECOND_QUERY.replace("name: overall", "name: per_restaurant") + "report: r.txt\n"),
    ))
    check_everywhere(spec, [
        Expect(12, "queries[0].input", "no input named 'visitz'"),
        Expect(15, "queries[0].partitions.public", "the public partition list is empty"),
        Expect(21, "queries[0].metrics[1].name", "output column 'visits' is used twice"),
        Expect(24, "queries[1].name", "query name 'per_restaurant' is used twice"),
        Expect(33, "report", "the report path must end in .json"),
    ])


def test_all_schema_problems_are_reported(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(
        ("privacy_unit: visitor_id\n", "privacy_unit: [visitor_id, household_id]\n"),
        ("    input: visits\n", "    input: visits\n    filter: \"amount > 0\"\n"),  # +1 line
        ("column: spend_eur", "column: weekday"),
    ))
    check_everywhere(spec, [
        Expect(3, "privacy_unit", "column 'household_id' is not in input 'visits' (query 'per_restaurant')"),
        Expect(9, "inputs.visits.path", "line 2: column 'weekday' does not parse as float64 (a metric takes its values"),
        Expect(13, "queries[0].filter", "the filter names unknown column(s) amount of input 'visits'"),
    ])


# --------------------------------------------------------------------------- input schemas

SCHEMA_CASES: dict[str, tuple[str, list[Expect]]] = {
    "input_file_missing": (
        edit(("    path: visits.csv\n", "    path: missing.csv\n")),
        [Expect(9, "inputs.visits.path", "no file matches 'missing.csv' (relative to the spec file's folder)")],
    ),
    "glob_matches_nothing": (
        edit(("    path: visits.csv\n", "    path: \"data/**/*.csv\"\n")),
        [Expect(9, "inputs.visits.path", "no file matches 'data/**/*.csv'")],
    ),
    "input_url_of_another_scheme": (
        edit(("    path: visits.csv\n", "    path: \"s3a://bucket/visits/*.parquet\"\n")),
        [Expect(9, "inputs.visits.path", "'s3a://bucket/visits/*.parquet' is a URL (s3a:): the Polars engine reads "
                                         "files on this machine (a path, a glob or a file:// URL); the Spark engine "
                                         "reads it through Spark (`--engine spark`")],
    ),
    "input_file_url_of_another_host": (
        edit(("    path: visits.csv\n", "    path: file://server/visits.csv\n")),
        [Expect(9, "inputs.visits.path", "'file://server/visits.csv' names a file on another host")],
    ),
    "input_folder_of_mixed_files": (
        edit(("    path: visits.csv\n", "    path: .\n")),
        [Expect(9, "inputs.visits.path", "cannot tell the format from the suffix; set `format:")],
    ),
    "input_suffix_unknown": (
        edit(("    path: visits.csv\n", "    path: visits.txt\n")),
        [Expect(9, "inputs.visits.path", "cannot tell the format from the suffix")],
    ),
    "privacy_unit_column_missing": (
        edit(("privacy_unit: visitor_id\n", "privacy_unit: user_id\n")),
        [Expect(3, "privacy_unit", "column 'user_id' is not in input 'visits' (query 'per_restaurant')")],
    ),
    "group_by_column_missing": (
        edit(("    group_by: [restaurant_id]\n", "    group_by: [restaurant]\n")),
        [Expect(13, "queries[0].group_by[0]", "column 'restaurant' is not in input 'visits'")],
    ),
    "second_group_by_column_missing": (
        edit(("    group_by: [restaurant_id]\n", "    group_by:\n      - restaurant_id\n      - city\n"),
             ("      public: [r01, r02]\n", "      public: [[r01, Paris]]\n")),
        [Expect(15, "queries[0].group_by[1]", "column 'city' is not in input 'visits'")],
    ),
    "metric_column_missing": (
        edit(("column: spend_eur", "column: amount")),
        [Expect(21, "queries[0].metrics[1].column", "column 'amount' is not in input 'visits'")],
    ),
    "metric_column_not_numeric": (
        edit(("column: spend_eur", "column: day"), ("    path: visits.csv\n", "    path: visits.csv\n    columns: {day: string}\n")),  # +1 line
        [Expect(22, "queries[0].metrics[1].column", "column 'day' is String, not numeric")],
    ),
    "metric_column_untyped_and_text": (
        edit(("column: spend_eur", "column: day")),
        [Expect(9, "inputs.visits.path", "line 2: column 'day' does not parse as float64 (a metric takes its values, "
                "so it is read as float64; if it is not a number, declare its type")],
    ),
    "count_column_missing": (
        edit(("{name: visits, kind: count}", "{name: visits, kind: count, column: amount}")),
        [Expect(20, "queries[0].metrics[0].column", "column 'amount' is not in input 'visits'")],
    ),
    "filter_column_missing": (
        edit(("    input: visits\n", "    input: visits\n    filter: \"amount > 0\"\n")),  # +1 line
        [Expect(13, "queries[0].filter", "the filter names unknown column(s) amount")],
    ),
    "filter_does_not_parse": (
        edit(("    input: visits\n", "    input: visits\n    filter: \"spend_eur >>> (\"\n")),  # +1 line
        [Expect(13, "queries[0].filter", "the filter is not a valid SQL expression")],
    ),
    "filter_type_error": (
        edit(("    input: visits\n", "    input: visits\n    filter: \"weekday - 1 > spend_eur\"\n")),  # +1 line
        [Expect(13, "queries[0].filter", "the filter does not apply to input 'visits'")],
    ),
    "filter_that_makes_polars_panic": (
        edit(("    input: visits\n", "    input: visits\n    filter: \"COALESCE()\"\n")),  # +1 line
        [Expect(13, "queries[0].filter", "the filter ")],
    ),
    "public_file_missing": (
        edit(("      public: [r01, r02]\n", "      public_file: nowhere.csv\n")),
        [Expect(15, "queries[0].partitions.public_file", "public partition file 'nowhere.csv' not found")],
    ),
    "public_file_lacks_group_by_columns": (
        edit(("      public: [r01, r02]\n", "      public_file: cities.csv\n")),
        [Expect(15, "queries[0].partitions.public_file", "lacks group_by column(s) restaurant_id")],
    ),
    "public_file_corrupt_parquet": (
        edit(("      public: [r01, r02]\n", "      public_file: corrupt.parquet\n")),
        [Expect(15, "queries[0].partitions.public_file", "cannot read the public partition file")],
    ),
    "corrupt_parquet_input": (
        edit(("    path: visits.csv\n", "    path: corrupt.parquet\n")),
        [Expect(9, "inputs.visits.path", "cannot read the parquet schema")],
    ),
    "parquet_input_missing_column": (
        edit(("    path: visits.csv\n", "    path: visits.parquet\n"), ("column: spend_eur", "column: amount")),
        [Expect(21, "queries[0].metrics[1].column", "column 'amount' is not in input 'visits'")],
    ),
    "empty_csv": (
        edit(("    path: visits.csv\n", "    path: empty.csv\n")),
        [Expect(9, "inputs.visits.path", "cannot read the csv schema")],
    ),
}


def write_corrupt_files(folder: Path) -> None:
    (folder / "corrupt.parquet").write_bytes(b"PAR1\x00SECRET-7731\x13\x37" * 7 + b"\xde\xad\xbe\xef")
    (folder / "empty.csv").write_text("")


@pytest.mark.parametrize("case", sorted(SCHEMA_CASES))
def test_input_schema(case: str, tmp_path: Path) -> None:
    text, expected = SCHEMA_CASES[case]
    write_inputs(tmp_path)
    write_corrupt_files(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    load_spec(spec)  # the spec itself is fine: these are input-schema problems
    check_everywhere(spec, expected)


def _panic(*args: object, **kwargs: object) -> None:
    # What Polars raises when a corrupt Parquet footer trips an `unwrap()` in Rust: a BaseException.
    raise pl.exceptions.PanicException("called `Option::unwrap()` on a `None` value")


@pytest.mark.parametrize(("reader", "edits", "expected"), [
    ("scan_parquet", [("    path: visits.csv\n", "    path: visits.parquet\n")],
     Expect(9, "inputs.visits.path", "cannot read the parquet schema (PanicException)")),
    ("read_parquet_schema", [("      public: [r01, r02]\n", "      public_file: restaurants.parquet\n")],
     Expect(15, "queries[0].partitions.public_file", "cannot read the public partition file (PanicException)")),
])
def test_a_polars_panic_on_a_corrupt_parquet_is_a_located_problem(
    reader: str, edits: list[tuple[str, str]], expected: Expect, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_inputs(tmp_path)
    pl.read_csv(tmp_path / "restaurants.csv").write_parquet(tmp_path / "restaurants.parquet")
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(*edits))
    validate_spec(spec)
    monkeypatch.setattr(pl, reader, _panic)
    check_everywhere(spec, [expected])


@pytest.mark.parametrize("path", ["visits.parquet", "*.parquet", "visi?s.csv", "[v]isits.csv"])
def test_valid_inputs(path: str, tmp_path: Path) -> None:
    write_inputs(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(("    path: visits.csv\n", f"    path: \"{path}\"\n"),
                         ("      public: [r01, r02]\n", "      public_file: restaurants.csv\n")))
    validated = validate_spec(spec)
    assert set(validated.inputs["visits"].schema) == {"visitor_id", "restaurant_id", "day", "weekday", "spend_eur"}
    assert invoke("validate", str(spec)).exit_code == 0


def test_an_input_may_be_a_file_url_and_its_glob_skips_spark_marker_files(tmp_path: Path) -> None:
    """A folder as Spark writes it: part files, `_SUCCESS`, a commit marker and a checksum file. The glob
    reads the part files only (a marker with another header would fail the schema check), through a
    file:// URL as through a path."""
    write_inputs(tmp_path)
    parts = tmp_path / "out" / "visits"
    (parts / "_temporary").mkdir(parents=True)
    for name in ("part-0.csv", "part-1.csv"):
        (parts / name).write_text(VISITS_CSV)
    (parts / "_SUCCESS").write_text("")
    (parts / "_committed_4711").write_text("x,y\n1,2\n")
    (parts / ".part-0.csv.crc").write_text("crc")
    (parts / "_temporary" / "part-2.csv").write_text("x,y\n1,2\n")
    for path in (f"file://{parts}/**/*", "out/visits/**/*", f"file://{quote(str(parts))}/part-?.csv",
                 f"file:{parts}/part-*", "out/visits", f"file://{parts}/"):
        spec = tmp_path / "spec.yaml"
        spec.write_text(edit(("    path: visits.csv\n", f"    path: \"{path}\"\n    format: csv\n")))
        validated = validate_spec(spec)
        assert validated.inputs["visits"].paths == (parts / "part-0.csv", parts / "part-1.csv"), path
        assert invoke("validate", str(spec)).exit_code == 0


def hive_folder(tmp_path: Path, folders: list[str]) -> Path:
    """Spark's layout: the visits in partition folders below `visits/`, with its marker file."""
    for folder in folders:
        (tmp_path / "visits" / folder).mkdir(parents=True)
        (tmp_path / "visits" / folder / "part-0.csv").write_text(VISITS_CSV)
    (tmp_path / "visits" / "_SUCCESS").write_text("")
    return tmp_path / "visits"


@pytest.mark.parametrize("declared", ["", "    columns: {month: int64}\n"])
def test_partition_folders_are_columns_typed_by_the_spec_else_text(tmp_path: Path, declared: str) -> None:
    write_inputs(tmp_path)
    folder = hive_folder(tmp_path, ["month=10/country=fr", "month=11/country=__HIVE_DEFAULT_PARTITION__"])
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(("    path: visits.csv\n", f"    path: file://{folder}/\n{declared}")))
    info = validate_spec(spec).inputs["visits"]
    assert info.partitions == ("month", "country") and info.format == "csv"
    assert info.schema["month"] == (pl.Int64 if declared else pl.String) and info.schema["country"] == pl.String
    assert info.partition_values(info.paths[1]) == [("month", "11"), ("country", None)]


@pytest.mark.parametrize(("folders", "fragment"), [
    (["month=10", "other"], "are not all in partition folders of the same columns"),
    (["month=10/country=fr", "country=fr/month=11"], "are not all in partition folders of the same columns"),
    (["weekday=Thu"], "column 'weekday' is both in the files and a partition folder's name"),
])
def test_partition_folders_that_spark_would_read_otherwise_are_refused(
    tmp_path: Path, folders: list[str], fragment: str
) -> None:
    write_inputs(tmp_path)
    hive_folder(tmp_path, folders)
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(("    path: visits.csv\n", "    path: visits\n")))
    check_everywhere(spec, [Expect(9, "inputs.visits.path", fragment)])


def test_a_partition_value_of_the_wrong_type_is_named_by_its_folder_not_shown(tmp_path: Path) -> None:
    write_inputs(tmp_path)
    folder = hive_folder(tmp_path, ["month=10", "month=SECRET-99"])  # a value is data, a file name is not
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(("    path: visits.csv\n", "    path: visits\n    columns: {month: int64}\n")))
    result = invoke("validate", str(spec))
    assert result.exit_code == 1, result.output
    assert ("inputs.visits.path: visits/month=…/part-0.csv: partition folder 'month' holds a value that does not "
            "convert to int64") in result.stderr
    assert "SECRET" not in result.output
    (folder / "month=SECRET-99").rename(folder / "month=11")
    assert invoke("validate", str(spec)).exit_code == 0


def test_spec_relative_paths_do_not_depend_on_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "project").mkdir()
    write_inputs(tmp_path / "project")
    spec = tmp_path / "project" / "spec.yaml"
    spec.write_text(BASE)
    monkeypatch.chdir(tmp_path)
    assert invoke("validate", "project/spec.yaml").exit_code == 0


# --------------------------------------------------------------------------- no data value in any message

SECRET = "SECRET-7731"

LEAKY_CSV = (
    "visitor_id,restaurant_id,day,weekday,spend_eur,note\n"
    f"{SECRET},r01,2026-10-01,Thu,12.50,{SECRET}\n"
    f"v002,{SECRET},2026-10-02,Fri,{SECRET},x\n"
    f"v003,r01,2026-10-03,Sat,7.25,\"{SECRET}\n"
    f"{SECRET},{SECRET},{SECRET},{SECRET},{SECRET},{SECRET},{SECRET}\n"
)

LEAK_EDITS: dict[str, list[tuple[str, str]]] = {
    "string_metric_column": [],
    "count_of_a_secret_column": [("bounds: [0, 60]}", "bounds: [0, 60]}\n      - {name: n, kind: mean, column: note, bounds: [0, 1]}")],
    "missing_columns": [("privacy_unit: visitor_id\n", "privacy_unit: user\n"), ("column: spend_eur", "column: amount")],
    "filter_type_error": [("    input: visits\n", "    input: visits\n    filter: \"note > 3 and spend_eur - note > 1\"\n")],
    "filter_unknown_column": [("    input: visits\n", "    input: visits\n    filter: \"amount > 0\"\n")],
    "public_file_with_secrets": [("      public: [r01, r02]\n", "      public_file: leaky.csv\n")],
    "public_file_corrupt_parquet": [("      public: [r01, r02]\n", "      public_file: leaky.parquet\n")],
    "corrupt_parquet_input": [("    path: visits.csv\n", "    path: leaky.parquet\n")],
    "parquet_input_with_secret_values": [("    path: visits.csv\n", "    path: secret.parquet\n"),
                                         ("column: spend_eur", "column: note")],
    "ndjson_input_with_secret_values": [("    path: visits.csv\n", "    path: leaky.ndjson\n")],
}


@pytest.mark.parametrize("case", sorted(LEAK_EDITS))
def test_no_data_value_in_any_message(case: str, tmp_path: Path) -> None:
    (tmp_path / "visits.csv").write_text(LEAKY_CSV)
    (tmp_path / "leaky.csv").write_text(f"city\n{SECRET}\n{SECRET},{SECRET}\n")
    (tmp_path / "leaky.parquet").write_bytes(b"PAR1" + SECRET.encode() * 50 + b"PAR1")
    (tmp_path / "leaky.ndjson").write_text(f'{{"visitor_id": "{SECRET}", "spend_eur": "{SECRET}"}}\n{{"x": [{SECRET}\n')
    pl.DataFrame({"visitor_id": [SECRET], "restaurant_id": [SECRET], "note": [SECRET]}).write_parquet(
        tmp_path / "secret.parquet"
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(edit(*LEAK_EDITS[case]))
    assert SECRET not in spec.read_text()
    with pytest.raises(SpecError) as caught:
        validate_spec(spec)
    assert SECRET not in str(caught.value)
    for args in (("validate", str(spec)), ("validate", str(spec), "--format", "json")):
        result = invoke(*args)
        assert result.exit_code == 1, result.output
        assert result.stdout or result.stderr
        assert SECRET not in result.stdout and SECRET not in result.stderr, result.output
        assert "Traceback" not in result.output

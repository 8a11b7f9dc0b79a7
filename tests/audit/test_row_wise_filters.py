"""A filter that reads other rows would break the guarantee: it is refused; a row-wise one keeps it.

The attack (issue: "A filter that reads other rows breaks the guarantee"): public partitions,
`privacy_id_count`, L0 = L∞ = 1, and `count(*) over (partition by key) >= 5`. A partition whose
rows number 3 in D and 6 in D' (one more unit) is released as about 0 on D and about 4 on D',
while the noise is calibrated for a change of 1. Such filters are refused by `validate`, by
`run` on both engines, and by each engine when handed a plan directly. With a row-wise filter
the same neighbouring datasets stay within the plan's ε (the black-box audit of `dp_audit`);
the engine that applied the window filter, as dprun did before the check, is caught by the
same audit, which shows the audit can tell.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import dp_audit
from dp_audit import Coordinate, epsilon_lower_bound, privacy_loss, threshold_sets
from dprun.engines import polars_engine, spark_engine
from dprun.errors import SpecError
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan
from dprun_testing import everything, invoke_clean

P = 20_000  # partitions of each kind: A (D) and B (D' = D plus one unit)
RUNS = 5
ROW_WISE = "x >= 0"
WINDOW = "count(*) over (partition by key) >= 5"
ATTACKS = {
    "window": (WINDOW, "reads other rows (window function)"),
    "aggregate": ("x > avg(x)", "reads other rows (aggregate function)"),
    "row number": ("row_number() over (order by x) <= 3", "reads other rows (window function)"),
    "rank": ("rank() over (partition by key order by x) = 1", "reads other rows (window function)"),
    "count": ("count(*) > 49", "reads other rows (aggregate function)"),
}
SPEC = """version: 1
privacy_unit: uid
budget: {{epsilon: 1.0}}
inputs:
  data: {{path: data.parquet}}
queries:
  - name: q
    input: data
    group_by: [key]
    partitions: {{public_file: keys.csv}}
    filter: "{filter}"
    contribution_bounds: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
    metrics: [{{name: p, kind: privacy_id_count, noise: laplace}}]
    output: {{path: out/q.parquet}}
report: out/report.json
"""
FILTER_LINE = 11


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """P partitions of kind A and P of kind B.

    A: two units with one row of x = 1, one unit whose only row has x = −1 (filtered out).
    B: the same, plus one unit with rows x = 1, x = −1 and x = 5 (only its first kept row counts).
    """
    folder = tmp_path_factory.mktemp("row_wise")
    keys = np.arange(2 * P)
    base = pl.DataFrame({
        "uid": [f"u{k}-{j}" for k in keys for j in range(3)],
        "key": np.repeat(keys, 3),
        "x": np.tile([1.0, 1.0, -1.0], 2 * P),
    })
    extra = pl.DataFrame({
        "uid": [f"SECRET-EXTRA-{k}" for k in keys[P:] for _ in range(3)],
        "key": np.repeat(keys[P:], 3),
        "x": np.tile([1.0, -1.0, 5.0], P),
    })
    pl.concat([base, extra]).sample(fraction=1.0, shuffle=True, seed=11).write_parquet(folder / "data.parquet")
    pl.DataFrame({"key": keys}).write_csv(folder / "keys.csv")
    return folder


def write_spec(folder: Path, text: str, name: str = "spec.yaml") -> Path:
    path = folder / name
    path.write_text(SPEC.format(filter=text))
    return path


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_filter_that_reads_other_rows_is_refused_by_validate_and_run(folder: Path, attack: str) -> None:
    text, reason = ATTACKS[attack]
    spec = write_spec(folder, text, f"{attack.replace(' ', '_')}.yaml")
    expected = (f"{spec}:{FILTER_LINE}:5: queries[0].filter: '{text}' {reason}; "
                "a filter must depend on its own row only")
    for args in (("validate", str(spec)), ("run", str(spec)), ("run", str(spec), "--engine", "spark")):
        result = invoke_clean(*args)
        assert result.exit_code == 1, f"{args}: exit {result.exit_code}: {everything(result)}"
        assert expected in everything(result), f"{args}: {everything(result)}"
        assert "starting Spark" not in everything(result)
        assert "SECRET" not in everything(result)
    assert not (folder / "out").exists(), "a refused spec published something"


def plan_with_filter(folder: Path, text: str) -> tuple[QueryPlan, Any]:
    """The plan of the row-wise spec, with `text` put in as its filter (as an API caller could)."""
    plan, validated = dp_audit.plan_and_inputs(write_spec(folder, ROW_WISE))
    return dataclasses.replace(plan, filter=text), validated.inputs["data"]


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_engine_refuses_such_a_filter_in_a_plan_before_reading_data(folder: Path, tmp_path: Path,
                                                                        attack: str) -> None:
    plan, info = plan_with_filter(folder, ATTACKS[attack][0])
    with pytest.raises(SpecError, match="a filter must depend on its own row only"):
        polars_engine.run_query(plan, info, RandomSource.from_seed(1), tmp_path)
    # No Spark session at all: the check comes before Spark is asked for anything.
    with pytest.raises(SpecError, match="a filter must depend on its own row only"):
        spark_engine.run_query(plan, info, RandomSource.from_seed(1), spark=None)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_engine_refuses_such_a_derived_column_in_a_plan_before_reading_data(folder: Path, tmp_path: Path,
                                                                                attack: str) -> None:
    """The same shapes in a derived column the filter reads: a plan handed to an engine directly."""
    plan, info = plan_with_filter(folder, "hidden")
    plan = dataclasses.replace(plan, derive=(("hidden", ATTACKS[attack][0]),))
    with pytest.raises(SpecError, match="a derived column must depend on its own row only"):
        polars_engine.run_query(plan, info, RandomSource.from_seed(1), tmp_path)
    with pytest.raises(SpecError, match="a derived column must depend on its own row only"):
        spark_engine.run_query(plan, info, RandomSource.from_seed(1), spark=None)


def released(plan: QueryPlan, info: Any, seed: int, tmp_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The released unit counts of the A and B partitions over RUNS runs of the Polars engine."""
    on_a, on_b = [], []
    for run in range(RUNS):
        workdir = tmp_path / f"run-{run}"
        workdir.mkdir()
        output = polars_engine.run_query(plan, info, RandomSource.from_seed(seed + run), workdir)
        assert output["key"].to_list() == list(range(2 * P)), f"seed={seed}"
        values = output["p"].to_numpy().astype(np.float64)
        on_a.append(values[:P])
        on_b.append(values[P:])
    return np.concatenate(on_a), np.concatenate(on_b)


def audit(plan: QueryPlan, on_a: np.ndarray, on_b: np.ndarray) -> tuple[float, dp_audit.Estimate]:
    """The ε lower bound for the claim that A and B differ by one unit: unit counts 2 and 3."""
    (noisy,) = plan.quantities
    coord = Coordinate(noisy.noise, noisy.quantity.unit_exponent, 2, 3)
    loss_a, loss_b = privacy_loss([coord], on_a[None, :]), privacy_loss([coord], on_b[None, :])
    return noisy.noise.epsilon, epsilon_lower_bound(loss_a, loss_b, threshold_sets([coord]), 0.0)


def test_a_row_wise_filter_stays_within_the_stated_bound(folder: Path, tmp_path: Path) -> None:
    seed = dp_audit.fresh_seed() % 2**62
    plan, info = plan_with_filter(folder, ROW_WISE)
    on_a, on_b = released(plan, info, seed, tmp_path)
    claim, result = audit(plan, on_a, on_b)
    print(f"seed={seed} row-wise filter: claimed ε={claim:.4f}; {result}")
    assert result.epsilon <= claim, f"seed={seed}: a row-wise filter leaks beyond the claim: {result}"
    assert result.epsilon >= 0.8 * claim, f"seed={seed}: the audit has no power: {result}"


def test_the_window_filter_applied_without_the_check_is_caught_by_the_same_audit(
        folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = dp_audit.fresh_seed() % 2**62
    plan, info = plan_with_filter(folder, WINDOW)
    monkeypatch.setattr(polars_engine, "row_filter", pl.sql_expr)  # the engine as it was before the check
    on_a, on_b = released(plan, info, seed, tmp_path)
    claim, result = audit(plan, on_a, on_b)
    print(f"seed={seed} window filter, unchecked: claimed ε={claim:.4f}; {result}")
    assert np.median(on_a) <= 1 and np.median(on_b) >= 3, f"seed={seed}: the attack did not take effect"
    assert result.epsilon > 2 * claim, f"seed={seed}: the broken engine went unnoticed: {result}"


SQL_SPEC = """version: 1
privacy_unit: uid
budget: {epsilon: 1.0}
inputs:
  data: {path: data.parquet}
queries:
  - name: q
    sql: SELECT key, COUNT(DISTINCT uid) AS p FROM data WHERE x >= 0 GROUP BY key
    metric_options: {p: {noise: laplace}}
    partitions: {public_file: keys.csv}
    contribution_bounds: {max_partitions_contributed: 1, max_contributions_per_partition: 1}
    output: {path: out/q.parquet}
report: out/report.json
"""


def test_a_query_written_in_sql_is_audited_as_its_yaml_twin(folder: Path, tmp_path: Path) -> None:
    """The SQL form compiles to the same plan (but its source text), and that plan stays within its ε."""
    (folder / "sql.yaml").write_text(SQL_SPEC)
    sql_plan, validated = dp_audit.plan_and_inputs(folder / "sql.yaml")
    info = validated.inputs["data"]
    yaml_plan, _ = plan_with_filter(folder, ROW_WISE)
    assert sql_plan.sql is not None and sql_plan.public_keys.equals(yaml_plan.public_keys)
    assert dataclasses.replace(sql_plan, sql=None, public_keys=None) == dataclasses.replace(yaml_plan, public_keys=None)
    seed = dp_audit.fresh_seed() % 2**62
    on_a, on_b = released(sql_plan, info, seed, tmp_path)
    claim, result = audit(sql_plan, on_a, on_b)
    print(f"seed={seed} row-wise filter written in SQL: claimed ε={claim:.4f}; {result}")
    assert result.epsilon <= claim, f"seed={seed}: the SQL twin leaks beyond the claim: {result}"
    assert result.epsilon >= 0.8 * claim, f"seed={seed}: the audit has no power: {result}"

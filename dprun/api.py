"""The Python API: validate a spec, plan it, run it. The CLI is a thin layer over this.

    from dprun import api
    validated = api.validate("spec.yaml")
    plan = api.plan(validated)
    result = api.run("spec.yaml")          # publishes outputs and the report
    result.tables["visits_per_restaurant"]  # polars DataFrame of the DP release
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from dprun.engines import polars_engine
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import Plan, QueryPlan
from dprun.planner import make_plan
from dprun.publish import refuse_existing, staged
from dprun.render import explanation_markdown
from dprun.report import release_report
from dprun.spec import ValidatedSpec, validate_spec

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RunResult:
    plan: Plan
    tables: dict[str, pl.DataFrame]
    report: dict[str, Any]
    report_path: Path


def validate(spec_path: str | Path) -> ValidatedSpec:
    return validate_spec(Path(spec_path))


def plan(validated: ValidatedSpec) -> Plan:
    return make_plan(validated)


def run(
    spec_path: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> RunResult:
    """Execute a spec and publish every output and the report, or nothing.

    `seed` makes the run deterministic for tests; the report then says
    `non_private_test_seed: true` and the release is not private.
    """
    validated = validate(spec_path)
    the_plan = plan(validated)
    report_md = the_plan.report_path.with_suffix(".md")
    targets = [(q.output_path, overwrite or q.overwrite) for q in the_plan.queries]
    targets += [(the_plan.report_path, True), (report_md, True)]
    refuse_existing(targets)
    source = RandomSource.system() if seed is None else RandomSource.from_seed(seed)
    started = _now()
    tables: dict[str, pl.DataFrame] = {}
    # Intermediate files hold private data: a folder only this user can read, always removed.
    with tempfile.TemporaryDirectory(prefix="dprun-", dir=os.environ.get("DPRUN_TMPDIR")) as scratch:
        for index, query in enumerate(the_plan.queries):
            if progress is not None:
                progress(f"running query {query.name}")
            workdir = Path(scratch) / str(index)
            workdir.mkdir()
            tables[query.name] = polars_engine.run_query(query, validated.inputs[query.input], source, workdir)
    released = {name: table.height for name, table in tables.items()}
    outputs = {q.name: q.output_path for q in the_plan.queries}
    report = release_report(the_plan, validated.inputs, released, outputs, started, _now(), source.is_test_seed)
    with staged() as staging:
        for query in the_plan.queries:
            staging.write(query.output_path, _table_writer(tables[query.name], query))
        staging.write(the_plan.report_path, lambda p: p.write_text(json.dumps(report, indent=2) + "\n"))
        staging.write(report_md, lambda p: p.write_text(explanation_markdown(report, "DP release")))
        staging.commit()
    return RunResult(the_plan, tables, report, the_plan.report_path)


def _table_writer(table: pl.DataFrame, query: QueryPlan) -> Callable[[Path], None]:
    if query.output_format == "csv":
        return lambda path: table.write_csv(path)
    return lambda path: table.write_parquet(path)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")

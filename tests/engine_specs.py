"""Specs and runs for the engine tests: one input file `data.parquet`, outputs under out/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
from click.testing import Result
from dprun_testing import invoke


def run_ok(spec: Path, seed: int) -> Result:
    result = invoke("run", str(spec), "--seed", str(seed), "--overwrite")
    assert result.exit_code == 0, f"seed={seed}: dprun run failed ({result.exit_code}): {result.output}"
    assert "Traceback" not in result.output, f"seed={seed}"
    return result


def query(name: str, group_by: list[str], metrics: list[dict[str, Any]], *, l0: int = 1, m: int = 1,
          partitions: dict[str, Any] | None = None, input_name: str | dict[str, Any] = "data") -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "input": input_name,
        "group_by": group_by,
        "contribution_bounds": {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
        "metrics": metrics,
        "output": {"path": f"out/{name}.parquet"},
    }
    if partitions is not None:
        body["partitions"] = partitions
    return body


def write_spec(folder: Path, queries: list[dict[str, Any]], *, epsilon: float, delta: float = 0.0,
               data: str = "data.parquet", privacy_unit: str = "uid") -> Path:
    """A spec file in `folder` (JSON is valid YAML 1.2); outputs and the report go to folder/out."""
    spec = {
        "version": 1,
        "name": folder.name,
        "privacy_unit": privacy_unit,
        "budget": {"epsilon": epsilon, "delta": delta, "accounting": "basic"},
        "inputs": {"data": {"path": data}},
        "queries": queries,
        "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def output(spec: Path, name: str) -> pl.DataFrame:
    return pl.read_parquet(spec.parent / "out" / f"{name}.parquet")

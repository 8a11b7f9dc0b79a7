"""`clamp: true` releases counts and sums within their feasible range, as post-processing (issue #19)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from dprun_testing import everything, fresh_seed, invoke
from planted_secrets import write_spec

KEYS = [f"k{i}" for i in range(300)]


def spec_with(folder: Path, metrics: list[dict[str, Any]], rng: np.random.Generator) -> Path:
    # Rows in two keys only: the other 298 public keys release noise around 0.
    pl.DataFrame({"uid": rng.integers(0, 50, 400), "key": [KEYS[i] for i in rng.integers(0, 2, 400)],
                  "v": rng.uniform(0, 10, 400)}).write_parquet(folder / "data.parquet")
    return write_spec(folder, {
        "version": 1, "privacy_unit": "uid", "budget": {"epsilon": 1.0},
        "inputs": {"data": {"path": "data.parquet"}},
        "queries": [{"name": "q", "input": "data", "group_by": ["key"], "partitions": {"public": KEYS},
                     "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                     "metrics": metrics, "output": {"path": "out/q.parquet"}}],
        "report": "out/report.json",
    })


def test_clamped_counts_and_sums_are_never_negative_and_the_others_are(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = spec_with(tmp_path, [
        {"name": "n", "kind": "count", "clamp": True},
        {"name": "n_raw", "kind": "count", "noise": "laplace"},
        {"name": "s", "kind": "sum", "column": "v", "bounds": [0, 10], "clamp": True},
        {"name": "s_raw", "kind": "sum", "column": "v", "bounds": [0, 10]},
    ], np.random.default_rng(seed))
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    table = pl.read_parquet(tmp_path / "out" / "q.parquet")
    assert table["n"].min() >= 0 and table["s"].min() >= 0, f"seed={seed}"
    # 298 keys of pure noise: each unclamped value is negative with probability about 0.4.
    assert table["n_raw"].min() < 0 and table["s_raw"].min() < 0, f"seed={seed}: the unclamped ones were clamped"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [m["clamp"] for m in report["queries"][0]["metrics"]] == [True, False, True, False]


def test_clamp_is_refused_where_the_metric_is_always_within_its_bounds(tmp_path: Path) -> None:
    spec = spec_with(tmp_path, [{"name": "m", "kind": "mean", "column": "v", "bounds": [0, 10], "clamp": True}],
                     np.random.default_rng(fresh_seed()))
    result = invoke("validate", str(spec))
    assert result.exit_code == 1 and "`clamp` is for count, privacy_id_count and sum metrics" in result.stderr

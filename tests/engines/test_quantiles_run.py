"""Quantile metrics end to end: through `dprun run`, with public and private partitions and other metrics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
import json

from dprun_testing import fresh_seed, invoke

QUANTILE_METRICS = [
    {"name": "visits", "kind": "count"},
    {"name": "low", "kind": "min", "column": "value", "bounds": [0, 100]},
    {"name": "mid", "kind": "median", "column": "value", "bounds": [0, 100]},
    {"name": "v", "kind": "quantile", "q": [0.1, 0.9], "column": "value", "bounds": [0, 100]},
    {"name": "high", "kind": "max", "column": "value", "bounds": [0, 100]},
]


def data(seed: int, partitions: int, units: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "uid": np.arange(partitions * units),
        "shop": np.repeat([f"s{i:03d}" for i in range(partitions)], units),
        "value": rng.uniform(20, 80, partitions * units).round(3),
    })


def with_method(metrics: list[dict], method: str) -> list[dict]:
    return [{**m, "quantile_method": method} if m["kind"] in ("min", "median", "quantile", "max") else m
            for m in metrics]


def run(tmp_path: Path, seed: int, partitions: dict | None, metrics: list[dict]) -> pl.DataFrame:
    query: dict = {
        "name": "q", "input": "rows", "group_by": ["shop"],
        "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
        "metrics": metrics, "output": {"path": "out/q.parquet"},
    }
    if partitions is not None:
        query["partitions"] = partitions
    spec = {"version": 1, "privacy_unit": "uid", "budget": {"epsilon": 1.0, "delta": 1e-6},
            "inputs": {"rows": {"path": "rows.parquet"}}, "queries": [query], "report": "out/report.json"}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))
    outcome = invoke("run", str(path), "--seed", str(seed))
    assert outcome.exit_code == 0, f"seed={seed}: {outcome.output}"
    return pl.read_parquet(tmp_path / "out" / "q.parquet")


@pytest.mark.parametrize("method", ["tree", "candidates", "auto"])
@pytest.mark.parametrize("mode", ["public", "private"])
def test_quantiles_with_other_metrics_are_ordered_and_near_the_truth(tmp_path: Path, mode: str, method: str) -> None:
    seed = fresh_seed(4)
    data(seed, 20, 2_000).write_parquet(tmp_path / "rows.parquet")
    partitions = {"public": [f"s{i:03d}" for i in range(22)]} if mode == "public" else {"selection": "auto"}
    out = run(tmp_path, seed, partitions, with_method(QUANTILE_METRICS, method))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    chosen = {m["name"]: m["quantile_method"] for m in report["queries"][0]["metrics"] if m["kind"] != "count"}
    # auto: 22 public partitions or private ones are many, so the tree.
    assert set(chosen.values()) == ({"tree"} if method == "auto" else {method}), f"seed={seed}: {chosen}"
    assert out.columns == ["shop", "visits", "low", "mid", "v_p10", "v_p90", "high"], f"seed={seed}"
    if mode == "public":
        assert out["shop"].to_list() == [f"s{i:03d}" for i in range(22)], f"seed={seed}: absent keys released"
    else:
        assert out.height == 20, f"seed={seed}: partitions of 2,000 units must be kept"
    ordered = out.select(
        (pl.col("low") <= pl.col("v_p10")) & (pl.col("v_p10") <= pl.col("mid"))
        & (pl.col("mid") <= pl.col("v_p90")) & (pl.col("v_p90") <= pl.col("high"))
    ).to_series()
    assert ordered.all(), f"seed={seed}: quantiles not monotone: {out}"
    assert out.select(pl.all().exclude("shop", "visits").is_between(0, 100).all()).row(0) == (True,) * 5
    filled = out.filter(pl.col("shop") < "s020")
    # Uniform on [20, 80] with 2,000 units: the rank error (the tree's rank ±~50 units at ε shares of 1,
    # the candidates' a few tens) moves a median by about 50/2000·60 = 1.5; 8 is over five of those,
    # plus a leaf width (100/16^4) or half a candidate step (100/1023/2).
    assert (filled["mid"] - 50).abs().max() < 8, f"seed={seed}: medians {filled['mid'].to_list()}"
    assert (filled["v_p90"] - 74).abs().max() < 8, f"seed={seed}: p90 {filled['v_p90'].to_list()}"

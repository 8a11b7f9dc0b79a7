"""Utility of `auto` contribution bounds against every fixed choice on a grid, at the same total budget.

Per data set and spec, runs `dprun` (the Python API, in this process) with
`max_partitions_contributed` and `max_contributions_per_partition` set to `auto`, and with every
(L0, L∞) of a grid of powers of two written by hand, `--runs` times each, and prints the mean
relative error of every metric on the largest partitions (by true row count): the 1,000 largest
on the Plume data, every non-empty partition of the sample data. A partition that is not
released counts as an error of 100%. The auto runs spend part of the same budget on the choice.

    python benchmarks/bench_auto_bounds.py [--sets sample,plume_count,plume_sum_mean,defaults] [--runs 3]
        [--data benchmarks/data/synth_1e6.parquet]

`defaults` runs the Plume count at L0 = 64, L∞ = 1 with the spec's defaults (no `accounting`, no
`selection` written) against `accounting: basic`, and prints the keys released and the error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from dprun import api

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class DataSet:
    name: str
    spec: dict[str, Any]  # one query; its contribution_bounds are replaced
    truth: pl.DataFrame  # keys, then the true value of every metric
    top: int | None  # the largest partitions the error is measured on (None: all non-empty)
    l0_grid: tuple[int, ...]
    rows_grid: tuple[int, ...]


def sample_set() -> DataSet:
    visits = pl.read_csv(ROOT / "sample_data" / "visits.csv").filter(pl.col("spend_eur") >= 0)
    truth = visits.group_by("restaurant_id").agg(pl.len().alias("visits"),
                                                 pl.col("spend_eur").mean().alias("avg_spend"))
    spec = {
        "version": 1, "privacy_unit": "visitor_id", "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"visits": {"path": str(ROOT / "sample_data" / "visits.csv")}},
        "queries": [{
            "name": "q", "input": "visits", "filter": "spend_eur >= 0", "group_by": ["restaurant_id"],
            "partitions": {"public_file": str(ROOT / "sample_data" / "restaurants.csv")},
            "metrics": [{"name": "visits", "kind": "count"},
                        {"name": "avg_spend", "kind": "mean", "column": "spend_eur", "bounds": [0, 60]}],
            "output": {"path": "out/q.parquet"},
        }],
        "report": "out/report.json",
    }
    return DataSet("sample", spec, truth, None, (1, 2, 4, 8), (1, 2, 4, 8, 16, 32, 64))


def plume_set(data: Path, with_values: bool) -> DataSet:
    rows = pl.scan_parquet(data)
    metrics: list[dict[str, Any]] = [{"name": "records", "kind": "count"}]
    aggregates = [pl.len().alias("records")]
    if with_values:
        metrics += [{"name": "value_sum", "kind": "sum", "column": "value", "bounds": [0, 100]},
                    {"name": "value_mean", "kind": "mean", "column": "value", "bounds": [0, 100]}]
        aggregates += [pl.col("value").sum().alias("value_sum"), pl.col("value").mean().alias("value_mean")]
    truth = rows.group_by("key").agg(aggregates).collect()
    spec = {
        "version": 1, "privacy_unit": "user_id",
        "budget": {"epsilon": 1.0986122886681098, "delta": 1e-5, "accounting": "pld"},
        "inputs": {"synth": {"path": str(data.resolve())}},
        "queries": [{"name": "q", "input": "synth", "group_by": ["key"], "metrics": metrics,
                     "output": {"path": "out/q.parquet"}}],
        "report": "out/report.json",
    }
    name = "plume_sum_mean" if with_values else "plume_count"
    return DataSet(name, spec, truth, 1000, (4, 8, 16, 32, 64, 128), (1, 2, 4))


def errors(data: DataSet, released: pl.DataFrame) -> dict[str, float]:
    """Mean relative error per metric on the largest true partitions; an unreleased one counts as 1."""
    keys = [c for c in data.spec["queries"][0].get("group_by", [])]
    first = data.truth.columns[len(keys)]
    top = data.truth.sort(first, descending=True)
    top = top.head(data.top) if data.top is not None else top.filter(pl.col(first) > 0)
    joined = top.join(released, on=keys, how="left", suffix="_dp")
    out = {}
    for metric in data.truth.columns[len(keys):]:
        error = ((joined[f"{metric}_dp"] - joined[metric]).abs() / joined[metric].abs()).fill_null(1.0)
        out[metric] = float(error.mean())
    return out


def run_once(data: DataSet, bounds: dict[str, Any], folder: Path) -> tuple[dict[str, float], dict[str, Any]]:
    spec = json.loads(json.dumps(data.spec))
    spec["queries"][0]["contribution_bounds"] = bounds
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec))
    result = api.run(path, overwrite=True)
    return errors(data, result.tables["q"]), result.report["queries"][0]


def measure(data: DataSet, runs: int) -> None:
    print(f"\n## {data.name}: mean relative error on the "
          f"{'1,000 largest' if data.top else 'non-empty'} partitions, {runs} runs each (median of runs)")
    results: dict[tuple[Any, Any], dict[str, float]] = {}
    chosen: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        choices: list[tuple[Any, Any]] = [("auto", "auto")]
        choices += [(l0, m) for l0 in data.l0_grid for m in data.rows_grid]
        for l0, m in choices:
            per_run: dict[str, list[float]] = {}
            started = time.perf_counter()
            for _ in range(runs):
                errs, report = run_once(data, {"max_partitions_contributed": l0,
                                               "max_contributions_per_partition": m}, folder)
                for metric, value in errs.items():
                    per_run.setdefault(metric, []).append(value)
                if l0 == "auto":
                    bounds = report["contribution_bounds"]
                    chosen.append((bounds["max_partitions_contributed"], bounds["max_contributions_per_partition"]))
            results[(l0, m)] = {metric: statistics.median(values) for metric, values in per_run.items()}
            print(f"  L0={l0!s:>4} L∞={m!s:>4}: " + ", ".join(f"{k} {100 * v:6.2f}%" for k, v in
                                                          results[(l0, m)].items())
                  + f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    metrics = list(results[("auto", "auto")])
    print(f"  auto chose (L0, L∞): {chosen}")
    for metric in metrics:
        fixed = {k: v[metric] for k, v in results.items() if k != ("auto", "auto")}
        best = min(fixed, key=lambda k: fixed[k])
        auto = results[("auto", "auto")][metric]
        print(f"  {metric}: auto {100 * auto:.2f}% vs best fixed {best} {100 * fixed[best]:.2f}%: "
              f"ratio {auto / fixed[best]:.2f}")
    mean_auto = statistics.mean(results[("auto", "auto")].values())
    fixed_means = {k: statistics.mean(v.values()) for k, v in results.items() if k != ("auto", "auto")}
    best = min(fixed_means, key=lambda k: fixed_means[k])
    print(f"  all metrics (mean): auto {100 * mean_auto:.2f}% vs best fixed {best} {100 * fixed_means[best]:.2f}%: "
          f"ratio {mean_auto / fixed_means[best]:.2f}")


def measure_defaults(data: DataSet, runs: int) -> None:
    print(f"\n## defaults: Plume count, L0 = 64, L∞ = 1, {runs} runs each (median of runs)")
    with tempfile.TemporaryDirectory() as tmp:
        for label, accounting in (("no accounting written (auto)", None), ("accounting: basic", "basic")):
            spec = json.loads(json.dumps(data.spec))
            if accounting is None:
                del spec["budget"]["accounting"]
            else:
                spec["budget"]["accounting"] = accounting
            spec["queries"][0]["contribution_bounds"] = {"max_partitions_contributed": 64,
                                                         "max_contributions_per_partition": 1}
            path = Path(tmp) / "spec.yaml"
            path.write_text(json.dumps(spec))
            keys, errs = [], []
            for _ in range(runs):
                result = api.run(path, overwrite=True)
                keys.append(result.tables["q"].height)
                errs.append(errors(data, result.tables["q"])["records"])
            query = result.report["queries"][0]
            print(f"  {label}: {result.report['accounting']}, {query['partitions']['selection']}: "
                  f"{statistics.median(keys):,.0f} keys, {100 * statistics.median(errs):.2f}% on the 1,000 largest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="sample,plume_count,plume_sum_mean,defaults")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data" / "synth_1e6.parquet")
    args = parser.parse_args()
    makers = {"sample": sample_set, "plume_count": lambda: plume_set(args.data, False),
              "plume_sum_mean": lambda: plume_set(args.data, True)}
    for name in args.sets.split(","):
        if name == "defaults":
            measure_defaults(plume_set(args.data, False), args.runs)
        else:
            measure(makers[name](), args.runs)


if __name__ == "__main__":
    main()

"""Utility of `auto` contribution bounds against every fixed choice on a grid, at the same total budget.

Per data set and spec, runs `dprun` (the Python API, in this process) with
`max_partitions_contributed` and `max_contributions_per_partition` set to `auto`, and with every
(L0, L∞) of a grid of powers of two written by hand, `--runs` times each, and prints the mean
relative error of every metric on the largest partitions (by true row count): the 1,000 largest
on the Plume data, every non-empty partition of the sample data. A partition that is not
released counts as an error of 100%. The auto runs spend part of the same budget on the choice.

    python benchmarks/bench_auto_bounds.py [--sets sample,plume_count,plume_sum_mean,sample_values,plume_values,defaults,
        aircraft_count,home_mean,spread_median,spread_values_sum,…]
        [--data benchmarks/data/synth_1e6.parquet]

`sample_values` and `plume_values` fix the contribution bounds (the sample spec's; the best fixed
choice on Plume, L0 = 64, L∞ = 1) and set the value bounds of every sum and mean to `auto`, then
to [0, u] for u on a log grid (powers of two from 4).

`aircraft_<kind>`, `home_<kind>`, `spread_<kind>` (kind: count, sum, mean, median) are the shapes of
issue #43, generated here (`heavy_rows`): 4,000 aircraft with log-normal flights (median 54, at most
575) mostly with a home carrier of 10; 1,500 units of about 150 rows, 80% in a home partition of 6;
20,000 units each in about 20 of 300 private partitions. One metric per run, `auto` contribution
bounds against the grid. `spread_values_<kind>` fixes the contribution bounds at spread's best
(32, 8) and sets the long-tailed column's value bounds to `auto`, against [0, u].

`defaults` runs the Plume count with the spec's defaults (no `accounting`, no `selection` written)
against `accounting: basic`, at L0 = 64, L∞ = 1 and with `auto` contribution bounds (where `auto`
selection weighs the first bounding's bias; against `selection: gaussian_threshold` written), and
prints the keys released and the error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
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


# The contribution bounds the value-bound sets fix: the sample spec's, and the best fixed choice on Plume.
SAMPLE_BOUNDS = {"max_partitions_contributed": 3, "max_contributions_per_partition": 16}
PLUME_BOUNDS = {"max_partitions_contributed": 64, "max_contributions_per_partition": 1}
SPREAD_BOUNDS = {"max_partitions_contributed": 32, "max_contributions_per_partition": 8}


def sample_set(with_sum: bool = False) -> DataSet:
    visits = pl.read_csv(ROOT / "sample_data" / "visits.csv").filter(pl.col("spend_eur") >= 0)
    aggregates = [pl.len().alias("visits"), pl.col("spend_eur").mean().alias("avg_spend")]
    metrics: list[dict[str, Any]] = [
        {"name": "visits", "kind": "count"},
        {"name": "avg_spend", "kind": "mean", "column": "spend_eur", "bounds": [0, 60]}]
    if with_sum:
        aggregates.append(pl.col("spend_eur").sum().alias("spend"))
        metrics.append({"name": "spend", "kind": "sum", "column": "spend_eur", "bounds": [0, 60]})
    truth = visits.group_by("restaurant_id").agg(aggregates)
    spec = {
        "version": 1, "privacy_unit": "visitor_id", "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"visits": {"path": str(ROOT / "sample_data" / "visits.csv")}},
        "queries": [{
            "name": "q", "input": "visits", "filter": "spend_eur >= 0", "group_by": ["restaurant_id"],
            "partitions": {"public_file": str(ROOT / "sample_data" / "restaurants.csv")},
            "metrics": metrics,
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


# Few privacy units with many rows each (issue #43): aircraft and their flights, people and their visits.
# One metric per run, so that each kind is measured against its own best fixed bounds.
HEAVY_METRICS: dict[str, dict[str, Any]] = {
    "count": {"name": "rows", "kind": "count"},
    "sum": {"name": "sum_minutes", "kind": "sum", "column": "minutes", "bounds": [0, 300]},
    "mean": {"name": "mean_minutes", "kind": "mean", "column": "minutes", "bounds": [0, 300]},
    "median": {"name": "median_minutes", "kind": "median", "column": "minutes", "bounds": [0, 300]},
}
HEAVY_TRUTH = {"count": pl.len(), "sum": pl.col("minutes").sum(), "mean": pl.col("minutes").mean(),
               "median": pl.col("minutes").median()}


def heavy_rows(name: str, seed: int = 7) -> pl.DataFrame:
    """`aircraft`: 4,000 units, log-normal rows per unit (median 54, at most 575), 90% of a unit's rows
    with its home carrier of 10 (Zipf-like), the rest with one or two others; `home`: 1,500 units,
    log-normal rows (about 170 each), 80% of them in the unit's home partition of 6. Minutes from an
    hour before the schedule (a delay + 60): long-tailed, median about 57, 99th percentile near 220
    (positive, so that relative errors of its mean mean something)."""
    rng = np.random.default_rng(seed)
    if name == "spread":  # 20,000 units, each in about 20 of 300 partitions (Zipf-like), 1 to 5 rows in each
        units, partitions = 20_000, 300
        pairs = rng.integers(5, 40, units)
        weights = 1 / np.arange(1, partitions + 1) ** 0.7
        unit = np.repeat(np.arange(units), pairs)
        key = rng.choice(partitions, unit.size, p=weights / weights.sum())
        rows = rng.integers(1, 6, unit.size)
        unit, key = np.repeat(unit, rows), np.repeat(key, rows)
        minutes = np.round(rng.lognormal(np.log(40), 1.2, unit.size))
        return pl.DataFrame({"unit": unit, "key": [f"p{k:03d}" for k in key], "minutes": minutes})
    if name == "aircraft":
        units, partitions, home_share = 4000, 10, 0.9
        rows = np.clip(np.round(rng.lognormal(np.log(54), 1.0, units)), 1, 575).astype(np.int64)
        weights = 1 / np.arange(1, partitions + 1) ** 0.8
        homes = rng.choice(partitions, units, p=weights / weights.sum())
    else:
        units, partitions, home_share = 1500, 6, 0.8
        rows = np.maximum(np.round(rng.lognormal(np.log(150), 0.5, units)), 1).astype(np.int64)
        homes = rng.integers(0, partitions, units)
    unit = np.repeat(np.arange(units), rows)
    home = np.repeat(homes, rows)
    away = (home + rng.integers(1, partitions, unit.size)) % partitions
    if name == "aircraft":  # one or two other carriers per aircraft, not any
        second = np.repeat((homes + 1 + rng.integers(0, partitions - 1, units)) % partitions, rows)
        away = np.where(rng.random(unit.size) < 0.7, second, away)
    key = np.where(rng.random(unit.size) < home_share, home, away)
    delay = np.where(rng.random(unit.size) < 0.85, rng.normal(-5, 12, unit.size), rng.exponential(60, unit.size) - 5)
    minutes = np.maximum(np.round(delay) + 60, 0)
    return pl.DataFrame({"unit": unit, "key": [f"p{k:02d}" for k in key], "minutes": minutes})


def heavy_set(name: str, kind: str) -> DataSet:
    frame = heavy_rows(name)
    path = ROOT / "benchmarks" / "data" / f"heavy_{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.write_parquet(path)
    metric = HEAVY_METRICS[kind]
    truth = frame.group_by("key").agg(HEAVY_TRUTH[kind].alias(metric["name"]))
    query: dict[str, Any] = {"name": "q", "input": "data", "group_by": ["key"], "metrics": [metric],
                             "output": {"path": "out/q.parquet"}}
    if name != "spread":  # its partitions are private: a selection keeps those it can
        query["partitions"] = {"public": sorted(truth["key"].to_list())}
    spec = {
        "version": 1, "privacy_unit": "unit", "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"data": {"path": str(path)}}, "queries": [query], "report": "out/report.json",
    }
    if name == "spread":
        return DataSet(f"{name}_{kind}", spec, truth, 100, (4, 8, 16, 32, 64), (1, 2, 4, 8))
    return DataSet(f"{name}_{kind}", spec, truth, None, (1, 2, 4, 8), (4, 16, 32, 64, 128, 256, 512))


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


# A choice: its label, the contribution bounds, and the bounds of every metric with values (None: the spec's).
Choice = tuple[str, dict[str, Any], Any]


def run_once(data: DataSet, choice: Choice, folder: Path) -> tuple[dict[str, float], dict[str, Any]]:
    _, bounds, values = choice
    spec = json.loads(json.dumps(data.spec))
    query = spec["queries"][0]
    query["contribution_bounds"] = bounds
    if values is not None:
        for metric in query["metrics"]:
            if "bounds" in metric:
                metric["bounds"] = values
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec))
    result = api.run(path, overwrite=True)
    return errors(data, result.tables["q"]), result.report["queries"][0]


def contribution_choices(data: DataSet) -> list[Choice]:
    """`auto` contribution bounds, then every (L0, L∞) of the data set's grid; value bounds as the spec says."""
    auto: Choice = ("L0=auto L∞=auto", {"max_partitions_contributed": "auto", "max_contributions_per_partition": "auto"},
                    None)
    return [auto, *((f"L0={l0:>4} L∞={m:>4}", {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
                     None) for l0 in data.l0_grid for m in data.rows_grid)]


def value_choices(data: DataSet, bounds: dict[str, int], uppers: tuple[float, ...]) -> list[Choice]:
    """`bounds: auto` on every metric with values, then [0, u] for every u of a log grid; contribution bounds fixed."""
    return [("values auto", bounds, "auto"), *((f"values [0, {u:g}]", bounds, [0, u]) for u in uppers)]


def chosen_bounds(report: dict[str, Any]) -> Any:
    """What auto chose: (L0, L∞) and each metric's value bounds."""
    found = report["auto_bounds"]["chosen"]
    values = {metric: tuple(v["bounds"]) for metric, v in found["value_bounds"].items()}
    return (found["max_partitions_contributed"], found["max_contributions_per_partition"], *values.values())


def measure(data: DataSet, runs: int, choices: list[Choice]) -> None:
    print(f"\n## {data.name}: mean relative error on the "
          f"{'1,000 largest' if data.top else 'non-empty'} partitions, {runs} runs each (median of runs)")
    results: dict[str, dict[str, float]] = {}
    chosen: list[Any] = []
    auto_label = choices[0][0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for choice in choices:
            per_run: dict[str, list[float]] = {}
            started = time.perf_counter()
            for _ in range(runs):
                errs, report = run_once(data, choice, folder)
                for metric, value in errs.items():
                    per_run.setdefault(metric, []).append(value)
                if choice[0] == auto_label:
                    chosen.append(chosen_bounds(report))
            results[choice[0]] = {metric: statistics.median(values) for metric, values in per_run.items()}
            print(f"  {choice[0]}: " + ", ".join(f"{k} {100 * v:6.2f}%" for k, v in results[choice[0]].items())
                  + f"  ({time.perf_counter() - started:.1f} s)", flush=True)
    metrics = list(results[auto_label])
    print(f"  auto chose: {chosen}")
    for metric in metrics:
        fixed = {k: v[metric] for k, v in results.items() if k != auto_label}
        best = min(fixed, key=lambda k: fixed[k])
        auto = results[auto_label][metric]
        print(f"  {metric}: auto {100 * auto:.2f}% vs best fixed {best} {100 * fixed[best]:.2f}%: "
              f"ratio {auto / fixed[best]:.2f}")
    mean_auto = statistics.mean(results[auto_label].values())
    fixed_means = {k: statistics.mean(v.values()) for k, v in results.items() if k != auto_label}
    best = min(fixed_means, key=lambda k: fixed_means[k])
    print(f"  all metrics (mean): auto {100 * mean_auto:.2f}% vs best fixed {best} {100 * fixed_means[best]:.2f}%: "
          f"ratio {mean_auto / fixed_means[best]:.2f}")


def measure_defaults(data: DataSet, runs: int) -> None:
    print(f"\n## defaults: Plume count, {runs} runs each (median of runs)")
    fixed = {"max_partitions_contributed": 64, "max_contributions_per_partition": 1}
    auto = {"max_partitions_contributed": "auto", "max_contributions_per_partition": "auto"}
    cases = [("L0 = 64, L∞ = 1, no accounting written (auto)", None, fixed, None),
             ("L0 = 64, L∞ = 1, no accounting written, selection: gaussian_threshold", None, fixed,
              "gaussian_threshold"),
             ("L0 = 64, L∞ = 1, accounting: basic", "basic", fixed, None),
             ("auto bounds, no accounting written", None, auto, None),
             ("auto bounds, no accounting written, selection: gaussian_threshold", None, auto, "gaussian_threshold"),
             ("auto bounds, accounting: basic", "basic", auto, None),
             ("auto bounds, accounting: basic, selection: gaussian_threshold", "basic", auto, "gaussian_threshold")]
    with tempfile.TemporaryDirectory() as tmp:
        for label, accounting, bounds, selection in cases:
            spec = json.loads(json.dumps(data.spec))
            if accounting is None:
                del spec["budget"]["accounting"]
            else:
                spec["budget"]["accounting"] = accounting
            spec["queries"][0]["contribution_bounds"] = bounds
            if selection is not None:
                spec["queries"][0]["partitions"] = {"selection": selection}
            path = Path(tmp) / "spec.yaml"
            path.write_text(json.dumps(spec))
            keys, errs = [], []
            for _ in range(runs):
                result = api.run(path, overwrite=True)
                keys.append(result.tables["q"].height)
                errs.append(errors(data, result.tables["q"])["records"])
            query = result.report["queries"][0]
            bounds_used = query["contribution_bounds"]
            print(f"  {label}: {result.report['accounting']}, {query['partitions']['selection']}, "
                  f"({bounds_used['max_partitions_contributed']}, {bounds_used['max_contributions_per_partition']}): "
                  f"{statistics.median(keys):,.0f} keys, {100 * statistics.median(errs):.2f}% on the 1,000 largest",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", default="sample,plume_count,plume_sum_mean,defaults")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=ROOT / "benchmarks" / "data" / "synth_1e6.parquet")
    args = parser.parse_args()
    makers = {"sample": sample_set, "plume_count": lambda: plume_set(args.data, False),
              "plume_sum_mean": lambda: plume_set(args.data, True)}
    for shape in ("aircraft", "home", "spread"):
        for kind in HEAVY_METRICS:
            makers[f"{shape}_{kind}"] = partial(heavy_set, shape, kind)
    log_grid = tuple(2.0**k for k in range(2, 13))
    for name in args.sets.split(","):
        if name == "defaults":
            measure_defaults(plume_set(args.data, False), args.runs)
        elif name == "sample_values":
            data = sample_set(with_sum=True)
            measure(replace(data, name=name), args.runs, value_choices(data, SAMPLE_BOUNDS, log_grid[:8]))
        elif name.startswith("spread_values_"):  # the long-tailed column, at the best fixed contribution bounds
            data = heavy_set("spread", name.removeprefix("spread_values_"))
            measure(replace(data, name=name), args.runs, value_choices(data, SPREAD_BOUNDS, log_grid))
        elif name == "plume_values":
            data = plume_set(args.data, True)
            measure(replace(data, name=name), args.runs, value_choices(data, PLUME_BOUNDS, log_grid))
        else:
            data = makers[name]()
            measure(data, args.runs, contribution_choices(data))


if __name__ == "__main__":
    main()

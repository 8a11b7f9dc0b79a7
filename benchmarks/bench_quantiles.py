"""Quantile accuracy of dprun against OpenDP, and the speed of dprun's quantile tree.

Accuracy (the default): the same task on dprun (`dprun run`'s API, the system CSPRNG) and on
OpenDP 0.16's Polars API (`dp.quantile`, the exponential mechanism over candidates), in
OpenDP's own virtual environment (it pins its own Polars; made on first use in
benchmarks/.venv-opendp, or --opendp-python). Synthetic data with a realistic shape: many
rows per privacy unit, a skewed value column (log-normal delays in whole minutes, stored as
integers, in [-60, 240]), 3 and 300 public partitions; ε = 0.25, L0 = 3, L∞ = 50, the 10th,
50th and 90th percentiles. dprun runs with `quantile_method: auto` (or --method); OpenDP
scores every whole minute. Printed: per case and quantile, the median over runs of the mean
absolute error over partitions, for each library, and their ratio.

    python benchmarks/bench_quantiles.py [--runs 20] [--units 20000] [--cases 3,300] [--seed 1]
           [--method auto|tree|candidates]

Timing (--timing): dprun's quantile tree (`answer_quantiles`) on synthetic partitions.

    python benchmarks/bench_quantiles.py --timing [--partitions P] [--units N]
           [--levels 0.5,0.9,0.99] [--branching 16] [--depth 4] [--repeats R]

Every partition gets N log-normal values clamped to [0, 50]. Output has one row per noise
kind: the best of R runs of the whole call, and of its two parts. "tables" sums the exact
counts of every level from the (partition, leaf) weights and grows with the input. "descent"
is the noise and the search, and grows with partitions × levels × depth × branching. The
target is a descent well under a second for 10^4 partitions, 3 levels and depth 4.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

from dprun.mechanisms import quantile_tree
from dprun.mechanisms.noise import calibrate
from dprun.mechanisms.quantile_tree import WEIGHT_BITS, TreeShape, answer_quantiles, rank_error_std
from dprun.mechanisms.sampling import RandomSource


def leaf_weights(partitions: int, units: int, shape: TreeShape, rng: np.random.Generator) -> pl.DataFrame:
    values = np.sort(np.clip(rng.lognormal(0.0, 1.5, (partitions, units)), shape.lower, shape.upper), axis=1)
    keys = (np.arange(partitions)[:, None] * shape.leaves + shape.leaf_of(values)).ravel()
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    counts = np.diff(np.r_[starts, keys.size])
    frame = pl.DataFrame({
        "partition": keys[starts] // shape.leaves,
        "leaf": keys[starts] % shape.leaves,
        "weight": counts << WEIGHT_BITS,
    })
    return frame.sample(fraction=1.0, shuffle=True, seed=0)  # unsorted, as a group-by returns it


def best(function, repeats: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


EPSILON = 0.25
LOWER, UPPER = -60.0, 240.0
L0, LINF = 3, 50
LEVELS = (0.1, 0.5, 0.9)
HERE = Path(__file__).resolve().parent
OPENDP = "opendp[polars]==0.16.0"
# OpenDP's side, run by its own interpreter: argv = data file, partitions, runs; prints JSON
# {"runs": [[[q10, q50, q90] per partition in key order] per run]}. Candidates: every minute
# in the bounds (OpenDP's exponential mechanism picks one of them). Groups are truncated
# with keep="first": OpenDP 0.16's "sample" fails on Polars 1.36 here (a plan error).
OPENDP_SCRIPT = """
import json, sys
import polars as pl, opendp.prelude as dp
dp.enable_features("contrib")
path, partitions, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
keys = pl.LazyFrame({"key": [f"k{k:03d}" for k in range(partitions)]})
candidates = [float(c) for c in range(%(lower)d, %(upper)d + 1)]
out = []
for _ in range(runs):
    context = dp.Context.compositor(
        data=pl.scan_parquet(path), privacy_unit=dp.unit_of(contributions=1, identifier="unit"),
        privacy_loss=dp.loss_of(epsilon=%(epsilon)r), split_evenly_over=1,
        margins=[dp.polars.Margin(by=["key"], invariant="keys", max_length=10**8)])
    query = (context.query().truncate_per_group(%(linf)d, by=["key"])
             .truncate_num_groups(%(l0)d, by=["key"], keep="first").group_by("key")
             .agg(*[pl.col("value").dp.quantile(q, candidates).alias(f"q{i}") for i, q in enumerate(%(levels)r)])
             .with_keys(keys))
    table = query.release().collect().sort("key")
    out.append([list(row) for row in table.select("q0", "q1", "q2").iter_rows()])
print(json.dumps({"runs": out}))
""" % {"lower": int(LOWER), "upper": int(UPPER), "epsilon": EPSILON, "linf": LINF, "l0": L0, "levels": LEVELS}


def synthetic(path: Path, units: int, partitions: int, rng: np.random.Generator) -> pl.DataFrame:
    """Many rows per unit (geometric, mean 60), each unit in up to 5 partitions of uneven
    popularity, a skewed value (log-normal delay, clipped to the bounds). Returns the true
    10th/50th/90th percentiles per partition, in key order."""
    rows = rng.geometric(1 / 60, units)
    unit = np.repeat(np.arange(units), rows)
    popularity = 1.0 / np.arange(1, partitions + 1) ** 0.8
    homes = rng.choice(partitions, size=(units, 5), p=popularity / popularity.sum())
    key = homes[unit, rng.integers(0, 5 if partitions > 3 else 3, unit.size)]
    value = np.clip(np.round(rng.lognormal(2.5, 1.1, unit.size) - 15 + 8 * (key % 7)), LOWER, UPPER)
    # Whole minutes, stored as integers as in the flights data.
    frame = pl.DataFrame({"unit": unit, "key": [f"k{k:03d}" for k in key], "value": value.astype(np.int64)})
    frame.write_parquet(path)
    truth = frame.group_by("key").agg(pl.col("value").quantile(q, "lower").alias(f"q{i}")
                                      for i, q in enumerate(LEVELS)).sort("key")
    assert truth.height == partitions, "every partition needs data"
    return truth


def dprun_runs(folder: Path, data: Path, partitions: int, runs: int, method: str) -> list[np.ndarray]:
    from dprun import api

    spec = {
        "version": 1, "name": "quantile-benchmark", "privacy_unit": "unit",
        "budget": {"epsilon": EPSILON, "delta": 0.0},
        "inputs": {"data": {"path": str(data)}},
        "queries": [{
            "name": "q", "input": "data", "group_by": ["key"],
            "partitions": {"public": [f"k{k:03d}" for k in range(partitions)]},
            "contribution_bounds": {"max_partitions_contributed": L0, "max_contributions_per_partition": LINF},
            "metrics": [{"name": "p", "kind": "quantile", "column": "value", "bounds": [LOWER, UPPER],
                         "q": list(LEVELS), "quantile_method": method}],
            "output": {"path": "out/q.parquet"},
        }],
        "report": "out/report.json",
    }
    path = folder / "spec.json"
    path.write_text(json.dumps(spec))
    answers = []
    for _ in range(runs):
        table = api.run(path, overwrite=True).tables["q"].sort("key")
        answers.append(table.select([c for c in table.columns if c != "key"]).to_numpy())
    return answers


def opendp_runs(python: str, data: Path, partitions: int, runs: int) -> list[np.ndarray]:
    done = subprocess.run([python, "-c", OPENDP_SCRIPT, str(data), str(partitions), str(runs)],
                          capture_output=True, text=True, check=True)
    return [np.asarray(run, dtype=np.float64) for run in json.loads(done.stdout)["runs"]]


def opendp_python(given: str | None) -> str:
    if given:
        return given
    venv = HERE / ".venv-opendp"
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making {venv} with {OPENDP} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", OPENDP], check=True)
    return str(python)


def accuracy(args: argparse.Namespace) -> None:
    python = opendp_python(args.opendp_python)
    rng = np.random.default_rng(args.seed)
    print(f"ε = {EPSILON}, L0 = {L0}, L∞ = {LINF}, bounds [{LOWER:g}, {UPPER:g}], {args.units} privacy units, "
          f"{args.runs} runs each; median over runs of the mean absolute error over partitions")
    print(f"{'partitions':>10}  {'quantile':>8}  {'dprun':>9}  {'OpenDP':>9}  {'dprun/OpenDP':>12}")
    for partitions in (int(c) for c in args.cases.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            truth = synthetic(folder / "data.parquet", args.units, partitions, rng).select("q0", "q1", "q2").to_numpy()
            ours = dprun_runs(folder, folder / "data.parquet", partitions, args.runs, args.method)
            theirs = opendp_runs(python, folder / "data.parquet", partitions, args.runs)
        for index, level in enumerate(LEVELS):
            mine = float(np.median([np.mean(np.abs(run[:, index] - truth[:, index])) for run in ours]))
            other = float(np.median([np.mean(np.abs(run[:, index] - truth[:, index])) for run in theirs]))
            ratio = f"{mine / other:.2f}" if other > 0 else ("1.00" if mine == 0 else "inf")
            print(f"{partitions:>10}  {f'p{round(level * 100)}':>8}  {mine:>9.2f}  {other:>9.2f}  {ratio:>12}")


def timing(args: argparse.Namespace) -> None:
    shape = TreeShape(0.0, 50.0, args.branching, args.depth)
    levels = [float(q) for q in args.levels.split(",")]
    frame = leaf_weights(args.partitions, args.units, shape, np.random.default_rng(0))
    source = RandomSource.system()
    print(f"{args.partitions} partitions × {args.units} units, {frame.height} (partition, leaf) rows, "
          f"levels {levels}, B={shape.branching}, D={shape.depth}")
    print(f"{'noise':<10}{'total s':>10}{'tables s':>10}{'descent s':>11}{'rank std':>10}")
    tables = quantile_tree._level_tables(frame, args.partitions, shape)
    qs = np.asarray(levels)
    for kind, delta in (("laplace", 0.0), ("gaussian", 1e-6)):
        noise = calibrate(kind, -WEIGHT_BITS, 1 << WEIGHT_BITS, shape.depth, 1.0, delta)
        total = best(lambda: answer_quantiles(frame, args.partitions, shape, levels, noise, source), args.repeats)
        build = best(lambda: quantile_tree._level_tables(frame, args.partitions, shape), args.repeats)
        descent = best(lambda: quantile_tree._descend(tables, 0, args.partitions, shape, qs, noise, source),
                       args.repeats)
        print(f"{kind:<10}{total:>10.3f}{build:>10.3f}{descent:>11.3f}{rank_error_std(shape, noise):>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timing", action="store_true", help="time dprun's quantile tree instead")
    parser.add_argument("--runs", type=int, default=20, help="accuracy: runs per library and case")
    parser.add_argument("--cases", default="3,300", help="accuracy: numbers of partitions")
    parser.add_argument("--seed", type=int, default=1, help="accuracy: the synthetic data's seed")
    parser.add_argument("--method", default="auto", choices=["auto", "tree", "candidates"],
                        help="accuracy: dprun's quantile_method")
    parser.add_argument("--opendp-python", default=None, help="accuracy: an interpreter with opendp 0.16")
    parser.add_argument("--partitions", type=int, default=10**4, help="timing")
    parser.add_argument("--units", type=int, default=None, help="privacy units (accuracy 20000, timing 1000)")
    parser.add_argument("--levels", default="0.5,0.9,0.99", help="timing")
    parser.add_argument("--branching", type=int, default=16, help="timing")
    parser.add_argument("--depth", type=int, default=4, help="timing")
    parser.add_argument("--repeats", type=int, default=3, help="timing")
    args = parser.parse_args()
    if args.timing:
        args.units = args.units or 1000
        timing(args)
    else:
        args.units = args.units or 20_000
        accuracy(args)


if __name__ == "__main__":
    main()

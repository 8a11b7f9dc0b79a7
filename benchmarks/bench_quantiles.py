"""Time dprun's quantile tree (`answer_quantiles`) on synthetic partitions, with the system CSPRNG.

Usage: python benchmarks/bench_quantiles.py [--partitions P] [--units N] [--levels 0.5,0.9,0.99]
       [--branching 16] [--depth 4] [--repeats R]
(with dprun installed, e.g. pip install -e .)

Every partition gets N log-normal values clamped to [0, 50]. Output has one row per noise
kind: the best of R runs of the whole call, and of its two parts. "tables" sums the exact
counts of every level from the (partition, leaf) weights and grows with the input. "descent"
is the noise and the search, and grows with partitions × levels × depth × branching. The
target is a descent well under a second for 10^4 partitions, 3 levels and depth 4.
"""

from __future__ import annotations

import argparse
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=10**4)
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--levels", default="0.5,0.9,0.99")
    parser.add_argument("--branching", type=int, default=16)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()

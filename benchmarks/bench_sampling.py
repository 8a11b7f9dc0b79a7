"""Throughput of dprun's noise samplers on the system CSPRNG source.

Usage: python benchmarks/bench_sampling.py [--n N] [--repeats R]
(with dprun installed, e.g. pip install -e .)

Prints one row per path, sampler and scale: the best of R timed runs of n samples
(in blocks on every core the process may use), and samples per second. The paths
are numpy's passes and the compiled loops (`dprun.mechanisms.sampling_loops`),
each made to take draws of every size. The target is at least 2 million samples
per second for discrete_laplace and discrete_gaussian at n = 10**6.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from dprun.mechanisms import sampling_loops
from dprun.mechanisms.sampling import (
    RandomSource,
    discrete_gaussian,
    discrete_laplace,
)

Sampler = Callable[[RandomSource, float, int], np.ndarray]

CASES: list[tuple[str, Sampler, list[float]]] = [
    ("discrete_laplace", discrete_laplace, [0.3, 1.0, 1e3, 2.0**20, 2.0**40]),
    ("discrete_gaussian", discrete_gaussian, [0.5, 2.0, 30.0, 1e4, 2.0**40]),
]


def best_seconds(sampler: Sampler, source: RandomSource, scale: float, n: int, repeats: int) -> float:
    """Fastest of `repeats` runs: the least disturbed by other work on the machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler(source, scale, n)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10**6)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    source = RandomSource.system()
    sampling_loops.compiled()
    print(f"{'path':<9} {'sampler':<18} {'scale':>10} {'n':>9} {'seconds':>9} {'samples/s':>12}")
    for path, threshold in (("numpy", 2**62), ("compiled", 0)):
        sampling_loops.COMPILED_FROM_DRAWS = threshold
        for name, sampler, scales in CASES:
            for scale in scales:
                seconds = best_seconds(sampler, source, scale, args.n, args.repeats)
                print(f"{path:<9} {name:<18} {scale:>10.4g} {args.n:>9} {seconds:>9.4f} {args.n / seconds:>12.3e}")


if __name__ == "__main__":
    main()

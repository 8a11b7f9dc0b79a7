"""Start-up time of the commands that read no data: `dprun --help`, `validate`, `explain-budget`.

Each command runs as a fresh process (`python -m dprun ...`) several times after one warm-up;
the script prints the minimum, median and maximum wall time of each, and which of the heavy
libraries the command imported. Run from the repository root:

    python benchmarks/bench_startup.py [--repeat 15] [--spec specs/restaurants_public.yaml]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HEAVY = ("polars", "numpy", "pydantic", "scipy", "dp_accounting", "pyarrow", "pyspark", "rich")

# Prints which heavy libraries a command imported, after running it in the same process.
PROBE = """
import sys
from dprun.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r}))
print("IMPORTED " + ",".join(loaded), file=sys.__stdout__)
"""


def wall_times(command: list[str], repeat: int) -> list[float]:
    env = dict(os.environ, DPRUN_LEDGER="")
    subprocess.run(command, capture_output=True, env=env, check=False)  # warm-up: file cache, .pyc
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, env=env, check=False)
        times.append(time.perf_counter() - start)
    return times


def imported(arguments: list[str]) -> str:
    probe = PROBE.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe, *arguments], capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("IMPORTED ")]
    return lines[-1].removeprefix("IMPORTED ") if lines else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--spec", default="specs/restaurants_public.yaml")
    args = parser.parse_args()
    print(f"{'command':<52} {'min s':>7} {'median s':>9} {'max s':>7}  heavy libraries imported")
    for arguments in (["--help"], ["validate", args.spec], ["explain-budget", args.spec]):
        times = wall_times([sys.executable, "-m", "dprun", *arguments], args.repeat)
        label = "dprun " + " ".join(arguments)
        print(f"{label:<52} {min(times):7.3f} {statistics.median(times):9.3f} {max(times):7.3f}  "
              f"{imported(arguments) or 'none'}")


if __name__ == "__main__":
    main()

"""Start-up time of the commands that read no data: `dprun --help`, `validate`, `explain-budget`;
and the fixed cost of a small release: `dprun run` of `--run-spec` against its `validate`.

Each command runs as a fresh process (`python -m dprun ...`) several times after one warm-up;
the script prints the minimum, median and maximum wall time of each, and which of the heavy
libraries the command imported. The run and its validate alternate, and the ratio of their
medians is printed. dprun's bytecode is compiled first, as installing the package does
(an editable checkout under PYTHONDONTWRITEBYTECODE would compile its sources in every
process, ~0.1 s that no installation pays); the warm-up fills the file cache. Run from the
repository root:

    python benchmarks/bench_startup.py [--repeat 15] [--spec specs/restaurants_public.yaml]
        [--run-spec specs/restaurants_private.yaml]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


def wall_times(commands: list[list[str]], repeat: int) -> list[list[float]]:
    """Each command's wall times, the commands taking turns in every round."""
    env = dict(os.environ, DPRUN_LEDGER="")
    for command in commands:  # warm-up: the file cache
        subprocess.run(command, capture_output=True, env=env, check=True)
    times: list[list[float]] = [[] for _ in commands]
    for _ in range(repeat):
        for command, taken in zip(commands, times, strict=True):
            start = time.perf_counter()
            subprocess.run(command, capture_output=True, env=env, check=True)
            taken.append(time.perf_counter() - start)
    return times


def line(label: str, times: list[float], imported: str) -> str:
    return f"{label:<52} {min(times):7.3f} {statistics.median(times):9.3f} {max(times):7.3f}  {imported}"


def imported(arguments: list[str]) -> str:
    probe = PROBE.format(heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", probe, *arguments], capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("IMPORTED ")]
    return lines[-1].removeprefix("IMPORTED ") if lines else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--spec", default="specs/restaurants_public.yaml")
    parser.add_argument("--run-spec", default="specs/restaurants_private.yaml")
    args = parser.parse_args()
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "dprun", quiet=1)
    dprun = [sys.executable, "-m", "dprun"]
    print(f"{'command':<52} {'min s':>7} {'median s':>9} {'max s':>7}  heavy libraries imported")
    for arguments in (["--help"], ["validate", args.spec], ["explain-budget", args.spec]):
        [times] = wall_times([[*dprun, *arguments]], args.repeat)
        print(line("dprun " + " ".join(arguments), times, imported(arguments) or "none"))
    validate, run = ["validate", args.run_spec], ["run", args.run_spec, "--overwrite"]
    validated, ran = wall_times([[*dprun, *validate], [*dprun, *run]], args.repeat)
    print(line("dprun " + " ".join(validate), validated, ""))
    print(line("dprun " + " ".join(run), ran, "(its card drawn by a helper process)"))
    print(f"fixed cost: run / validate = {statistics.median(ran) / statistics.median(validated):.2f}")


if __name__ == "__main__":
    main()

"""Wall time of `dprun run --engine spark` against the Polars engine on the Plume count spec.

Usage: python benchmarks/bench_spark.py [--data benchmarks/data/synth_1e6.parquet]
           [--spec benchmarks/specs/plume_auto.yaml] [--master local[*]] [--conf KEY=VALUE ...]
           [--repeat N] [--engines polars,spark]
(with dprun[spark] installed and Java 17+; data from generate_synthetic.py)

Each run is its own subprocess running a temporary copy of the spec that names --data by
absolute path and writes its outputs (and the Polars engine's scratch files) to a temporary
folder, so benchmarks/data/out is never touched. Runs use the system's randomness, like a
release, and no ledger.

Columns: the subprocess's wall time (interpreter start included; the fastest of --repeat
runs); for Spark, the part spent starting the session (JVM start for local[*]) and the part
spent running the query; keys released; the mean absolute error (MAE) of the released
counts against the exact per-key record counts on the released keys (averaged over runs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE / "data" / "synth_1e6.parquet"
DEFAULT_SPEC = HERE / "specs" / "plume_auto.yaml"

# Run as `python -c CODE SPEC ENGINE OPTIONS_JSON`; prints one JSON line of timings.
RUNNER = """
import json, sys, time
from dprun import api
from dprun.engines import spark_engine
spec, engine, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
start = time.perf_counter()
if engine == "spark":
    spark_engine.spark_session(options.get("master"), options.get("remote"), options.get("conf"))
ready = time.perf_counter()
api.run(spec, engine=engine, spark_options=options if engine == "spark" else None, overwrite=True)
done = time.perf_counter()
print(json.dumps({"startup": ready - start, "run": done - ready}))
"""


def spec_copy(spec: Path, data: Path, folder: Path) -> Path:
    """The spec with its input at `data` (absolute) and its outputs in `folder`."""
    text = spec.read_text()
    text = text.replace("../data/synth_1e6.parquet", str(data.resolve()))
    text = text.replace("../data/out/", f"{folder}/")
    path = folder / spec.name
    path.write_text(text)
    return path


def output_path(spec: Path) -> Path:
    from dprun import api

    return api.plan(api.validate(spec)).queries[0].output_path


def run_once(spec: Path, engine: str, options: dict, scratch: Path) -> dict[str, float]:
    env = {**os.environ, "DPRUN_TMPDIR": str(scratch)}
    env.pop("DPRUN_LEDGER", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", RUNNER, str(spec), engine, json.dumps(options)],
                          capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    timings = json.loads(done.stdout.strip().splitlines()[-1])
    return {"wall": wall, **timings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--engines", default="polars,spark")
    args = parser.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"{args.data} not found: python benchmarks/generate_synthetic.py --users 1000000 "
                         f"--out {args.data}")
    exact = (pl.scan_parquet(args.data).group_by("key").agg(pl.len().cast(pl.Int64).alias("exact"))
             .collect(engine="streaming"))
    rows = pl.scan_parquet(args.data).select(pl.len()).collect().item()
    cpus = os.cpu_count()
    print(f"data: {args.data} ({rows:,} rows, {args.data.stat().st_size / 2**20:.1f} MiB), spec: {args.spec.name}, "
          f"{cpus} CPUs, Spark master {args.master}")
    print(f"{'engine':<8} {'wall s':>8} {'startup s':>10} {'query s':>8} {'keys':>8} {'MAE':>8}")
    with tempfile.TemporaryDirectory(prefix="dprun-bench-spark-") as tmp:
        folder = Path(tmp)
        spec = spec_copy(args.spec, args.data, folder)
        options = {"master": args.master, "conf": args.conf}
        results = {}
        for engine in args.engines.split(","):
            runs, errors, keys = [], [], 0
            for _ in range(args.repeat):
                runs.append(run_once(spec, engine, options, folder))
                released = pl.read_parquet(output_path(spec))
                joined = released.join(exact, on="key", how="left").fill_null(0)
                errors.append(float((joined["records"] - joined["exact"]).abs().mean() or 0.0))
                keys = released.height
            best = min(runs, key=lambda r: r["wall"])
            results[engine] = best
            print(f"{engine:<8} {best['wall']:>8.1f} {best['startup']:>10.1f} {best['run']:>8.1f} {keys:>8,} "
                  f"{sum(errors) / len(errors):>8.2f}", flush=True)
        if {"polars", "spark"} <= results.keys():
            ratio = results["spark"]["wall"] / results["polars"]["wall"]
            print(f"spark / polars wall time: {ratio:.2f}x (query only: "
                  f"{results['spark']['run'] / results['polars']['run']:.2f}x)")


if __name__ == "__main__":
    main()

"""Wall and CPU time of `dprun run --engine spark` against the Polars engine and against Spark's own
aggregations of the same file, on the Plume count spec.

Usage: python benchmarks/bench_spark.py [--data benchmarks/data/synth_1e6.parquet]
           [--spec benchmarks/specs/plume_auto.yaml] [--master local[*]] [--conf KEY=VALUE ...]
           [--repeat N] [--engines polars,spark,groupby,distinct] [--cluster WORKERS]
(with dprun[spark] installed and Java 17+; data from generate_synthetic.py)

Each run is its own subprocess running a temporary copy of the spec that names --data by
absolute path and writes its outputs (and the Polars engine's scratch files) to a temporary
folder, so benchmarks/data/out is never touched. Runs use the system's randomness, like a
release, and no ledger.

`groupby` and `distinct` are the floors, Spark's own work on the same file at the same master:
`groupBy(key).count()` and `select(user_id, key).distinct().groupBy(key).count()`, collected.
`--cluster N` starts a standalone cluster on loopback for the run (a master and N workers of one
core and 4 GB each, with `sbin/spark-daemon.sh`, which the pip package of pyspark ships) and
runs every Spark case against it; it is stopped at the end.

Columns: the subprocess's wall time (interpreter start included; the median of --repeat runs);
for Spark, the part spent starting the session and the part spent running the query; CPU
seconds of the driver's Python and JVM, plus, on a cluster, the workers' and their executors'
(read from /proc); keys released; the mean absolute error (MAE) of the released counts against
the exact per-key record counts on the released keys (averaged over runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE / "data" / "synth_1e6.parquet"
DEFAULT_SPEC = HERE / "specs" / "plume_auto.yaml"

# Run as `python -c CODE SPEC ENGINE OPTIONS_JSON DATA`; prints one JSON line of timings. The driver's
# CPU: this process's and, for Spark, its JVM's (which in local mode runs the executors too).
RUNNER = """
import json, sys, time
from dprun import api
from dprun.engines import spark_engine
spec, engine, options, data = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
start = time.perf_counter()
spark = None
if engine != "polars":
    spark = spark_engine.spark_session(options.get("master"), options.get("remote"), options.get("conf"))
ready = time.perf_counter()
if engine in ("polars", "spark"):
    api.run(spec, engine=engine, spark_options=options if engine == "spark" else None, overwrite=True)
else:
    frame = spark.read.parquet(data)
    if engine == "distinct":
        frame = frame.select("user_id", "key").distinct()
    frame.groupBy("key").count().collect()
done = time.perf_counter()
cpu = time.process_time()
if spark is not None:
    import os
    stat = open(f"/proc/{spark._jvm.java.lang.ProcessHandle.current().pid()}/stat").read()
    cpu += sum(int(v) for v in stat[stat.rindex(")") + 2:].split()[11:13]) / os.sysconf("SC_CLK_TCK")
print(json.dumps({"startup": ready - start, "run": done - ready, "cpu": cpu}))
"""
SPARK_CASES = ("spark", "groupby", "distinct")


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


def run_once(spec: Path, engine: str, options: dict, scratch: Path, data: Path, cluster: Cluster | None
             ) -> dict[str, float]:
    env = {**os.environ, "DPRUN_TMPDIR": str(scratch)}
    env.pop("DPRUN_LEDGER", None)
    workers_before = cluster.cpu() if cluster else 0.0
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", RUNNER, str(spec), engine, json.dumps(options), str(data)],
                          capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{engine} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    timings = json.loads(done.stdout.strip().splitlines()[-1])
    if cluster is not None and engine in SPARK_CASES:
        time.sleep(2)  # the executors exit once the application ends; their CPU lands on their worker
        timings["cpu"] += cluster.cpu() - workers_before
    return {"wall": wall, **timings}


class Cluster:
    """A standalone Spark cluster on loopback: a master and `workers` workers of one core and 4 GB,
    started with the pip package's `sbin/spark-daemon.sh` (it ships no start-master.sh)."""

    def __init__(self, workers: int, folder: Path) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.workers = workers
        self.env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_PID_DIR": str(folder / "pid"), "SPARK_LOG_DIR": str(folder / "log"),
                    "SPARK_WORKER_DIR": str(folder / "work")}
        self.pids = folder / "pid"
        self.url = "spark://127.0.0.1:7177"

    def _daemon(self, action: str, role: str, instance: int, *arguments: str) -> None:
        subprocess.run([str(self.home / "sbin" / "spark-daemon.sh"), action, f"org.apache.spark.deploy.{role}",
                        str(instance), *arguments], env=self.env, check=True, capture_output=True)

    def start(self) -> None:
        self._daemon("start", "master.Master", 1, "--host", "127.0.0.1", "--port", "7177", "--webui-port", "8180")
        for i in range(1, self.workers + 1):
            self._daemon("start", "worker.Worker", i, "--cores", "1", "--memory", "4g", "--webui-port",
                         str(8180 + i), self.url)
        time.sleep(10)  # the workers register with the master

    def stop(self) -> None:
        for i in range(1, self.workers + 1):
            self._daemon("stop", "worker.Worker", i)
        self._daemon("stop", "master.Master", 1)

    def cpu(self) -> float:
        """CPU seconds of the master, the workers and their reaped children (the executors), from /proc."""
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid_file in self.pids.glob("*.pid"):
            stat = Path(f"/proc/{pid_file.read_text().strip()}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            total += sum(int(value) for value in fields[11:15])  # utime, stime, cutime, cstime
        return total / ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--engines", default="polars,spark")
    parser.add_argument("--cluster", type=int, default=0, metavar="WORKERS")
    args = parser.parse_args()
    if not args.data.is_file():
        raise SystemExit(f"{args.data} not found: python benchmarks/generate_synthetic.py --users 1000000 "
                         f"--out {args.data}")
    exact = (pl.scan_parquet(args.data).group_by("key").agg(pl.len().cast(pl.Int64).alias("exact"))
             .collect(engine="streaming"))
    rows = pl.scan_parquet(args.data).select(pl.len()).collect().item()
    with tempfile.TemporaryDirectory(prefix="dprun-bench-spark-") as tmp:
        folder = Path(tmp)
        cluster = Cluster(args.cluster, folder) if args.cluster else None
        master = cluster.url if cluster else args.master
        print(f"data: {args.data} ({rows:,} rows, {args.data.stat().st_size / 2**20:.1f} MiB), spec: "
              f"{args.spec.name}, {os.cpu_count()} CPUs, Spark master {master}"
              + (f" ({args.cluster} workers of 1 core, 4 GB)" if cluster else ""))
        print(f"{'engine':<9} {'wall s':>8} {'startup s':>10} {'query s':>8} {'CPU s':>8} {'keys':>8} {'MAE':>8}")
        spec = spec_copy(args.spec, args.data, folder)
        options = {"master": master, "conf": args.conf}
        if cluster:
            cluster.start()
        try:
            results = {engine: measure(engine, spec, options, folder, args, exact, cluster)
                       for engine in args.engines.split(",")}
        finally:
            if cluster:
                cluster.stop()
    for floor in ("polars", "groupby", "distinct"):
        if {"spark", floor} <= results.keys():
            spark, other = results["spark"], results[floor]
            print(f"spark / {floor}: wall {spark['wall'] / other['wall']:.2f}x, "
                  f"query {spark['run'] / other['run']:.2f}x, CPU {spark['cpu'] / other['cpu']:.2f}x")


def measure(engine: str, spec: Path, options: dict, folder: Path, args: argparse.Namespace, exact: pl.DataFrame,
            cluster: Cluster | None) -> dict[str, float]:
    """One case --repeat times: the median of each figure, printed as a row."""
    runs, errors, keys = [], [], 0
    for _ in range(args.repeat):
        runs.append(run_once(spec, engine, options, folder, args.data, cluster))
        if engine in ("polars", "spark"):
            released = pl.read_parquet(output_path(spec))
            joined = released.join(exact, on="key", how="left").fill_null(0)
            errors.append(float((joined["records"] - joined["exact"]).abs().mean() or 0.0))
            keys = released.height
    median = {figure: statistics.median(run[figure] for run in runs) for figure in runs[0]}
    error = f"{sum(errors) / len(errors):>8.2f}" if errors else f"{'-':>8}"
    shown = f"{keys:>8,}" if errors else f"{'-':>8}"
    print(f"{engine:<9} {median['wall']:>8.1f} {median['startup']:>10.1f} {median['run']:>8.1f} {median['cpu']:>8.1f} "
          f"{shown} {error}", flush=True)
    return median


if __name__ == "__main__":
    main()

"""The Spark driver's memory in a private selection among many candidate keys.

Usage: python benchmarks/bench_spark_candidates.py [--candidates 10000000] [--master local[*]]
           [--conf KEY=VALUE ...] [--whole] [--cluster WORKERS]
(with dprun[spark] installed and Java 17+)

Writes (once) benchmarks/data/candidates_N.parquet: N users with one row each, in a text key of
its own, so that every key is a candidate of the selection and none is released. Then runs
`dprun run --engine spark` on a count per key with fixed bounds in a subprocess, with
`spark.driver.maxResultSize=64m` unless --conf sets it, and prints the wall time, the driver
Python's peak RSS and the driver JVM's (in local mode that JVM runs the executors too, so its peak
is not the driver's alone; `--cluster N` runs against a standalone cluster on loopback, as
bench_spark.py does, where it is). `--whole` collects every candidate to the driver at once, as dprun did
before it streamed them (it sets `spark_engine.WHOLE_CANDIDATES` above N).
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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from bench_spark import Cluster

HERE = Path(__file__).resolve().parent
CHUNK = 10**6

RUNNER = """
import json, resource, sys, time
from dprun import api
from dprun.engines import spark_engine
spec, options, whole, candidates = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
if whole:
    spark_engine.WHOLE_CANDIDATES = candidates + 1
spark = spark_engine.spark_session(options["master"], None, options["conf"])
start = time.perf_counter()
result = api.run(spec, engine="spark", spark_options=options, overwrite=True)
done = time.perf_counter()
jvm = spark._jvm.java.lang.ProcessHandle.current().pid()
status = dict(line.split(":", 1) for line in open(f"/proc/{jvm}/status") if ":" in line)
print(json.dumps({"run": done - start, "keys": result.tables["count_per_key"].height,
                  "python_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "jvm_mib": int(status["VmHWM"].split()[0]) / 1024}))
"""


def write_candidates(n: int, path: Path) -> None:
    """n users, one row each, user i in key "k<i>": n candidate keys of one unit each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("user_id", pa.int64()), ("key", pa.string())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for first in range(0, n, CHUNK):
            users = pa.array(range(first, min(n, first + CHUNK)), pa.int64())
            keys = pc.binary_join_element_wise("k", pc.cast(users, pa.string()), "")
            writer.write_table(pa.Table.from_arrays([users, keys], schema=schema))


def spec(data: Path, folder: Path) -> Path:
    path = folder / "spec.json"
    path.write_text(json.dumps({
        "version": 1, "name": "many-candidates", "privacy_unit": "user_id",
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"c": {"path": str(data.resolve())}},
        "queries": [{"name": "count_per_key", "input": "c", "group_by": ["key"],
                     "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                     "metrics": [{"name": "records", "kind": "count"}],
                     "output": {"path": str(folder / "out.parquet")}}],
        "report": str(folder / "report.json"),
    }))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=10**7)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--whole", action="store_true")
    parser.add_argument("--cluster", type=int, default=0, metavar="WORKERS")
    args = parser.parse_args()
    data = HERE / "data" / f"candidates_{args.candidates}.parquet"
    if not data.is_file():
        write_candidates(args.candidates, data)
    conf = list(args.conf)
    if not any(c.startswith("spark.driver.maxResultSize=") for c in conf):
        conf.append("spark.driver.maxResultSize=64m")
    with tempfile.TemporaryDirectory(prefix="dprun-bench-candidates-") as tmp:
        env = {**os.environ, "DPRUN_TMPDIR": tmp}
        env.pop("DPRUN_LEDGER", None)
        cluster = Cluster(args.cluster, Path(tmp)) if args.cluster else None
        master = cluster.url if cluster else args.master
        options = {"master": master, "conf": conf}
        if cluster:
            cluster.start()
        try:
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", RUNNER, str(spec(data, Path(tmp))), json.dumps(options),
                                   "1" if args.whole else "0", str(args.candidates)],
                                  capture_output=True, text=True, env=env, check=False)
            wall = time.perf_counter() - started
        finally:
            if cluster:
                cluster.stop()
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{args.candidates:,} candidates, {'whole' if args.whole else 'streamed'}, master {master}, "
          f"conf {' '.join(conf)}, {os.cpu_count()} CPUs")
    print(f"wall {wall:.1f} s (run {figures['run']:.1f} s), keys released {figures['keys']:,}, "
          f"peak RSS: driver Python {figures['python_mib']:.0f} MiB, JVM {figures['jvm_mib']:.0f} MiB")


if __name__ == "__main__":
    main()

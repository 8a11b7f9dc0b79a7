"""Wall time and peak memory of join queries against the same query on a pre-joined file.

Usage: python benchmarks/bench_joins.py [--data benchmarks/data/synth_1e7.parquet]
           [--repeat N] [--keep DIR]
(with dprun installed; data from generate_synthetic.py, columns user_id, key, value)

From the Plume rows (--data) the script writes, once, into its work folder:

* `categories.parquet`: a public lookup, key → category, for the 10^6 keys (100 categories);
* `users.parquet`: a private per-user table, user_id → country (50 countries), one row per
  user of the data;
* `prejoined_lookup.parquet` and `prejoined_users.parquet`: the Plume rows with the category
  (an inner join on key) or the country (an inner join on user_id) already added.

Cases, each `dprun run` in its own subprocess, count per partition with the Plume bounds
(L0 = 64, L∞ = 1, private partitions, ε = ln 3, δ = 1e-5, pld accounting):

  lookup       {join: [events, categories], on: key}, group_by [category]
  lookup_pre   the same query on prejoined_lookup.parquet
  private      {join: [events, users], on: user_id, max_rows_per_unit: {users: 1}},
               group_by [country]
  private_pre  the same query on prejoined_users.parquet
  shuffled     `private` with the per-user table's rows shuffled (users_shuffled.parquet): the cut
               then counts every user's rows instead of seeing in one ordered pass that
               each user has one row
  both_cut     `shuffled`, with the Plume rows cut too: max_rows_per_unit {events: 100, users: 1}

The cases run in turn, --repeat times, so that the machine's drift falls on all of them.
Printed: per case the median and the fastest wall time, the CPU time, the peak RSS
(os.wait4's ru_maxrss), and the ratio of the medians of each join to its pre-joined case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import Measurement, run_measured  # this folder's helper (path above)

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE / "data" / "synth_1e7.parquet"
CATEGORIES = 100
COUNTRIES = 50
PAIRS = {"lookup": "lookup_pre", "private": "private_pre", "shuffled": "private_pre", "both_cut": "private_pre"}
CASES = ["lookup", "lookup_pre", "private", "private_pre", "shuffled", "both_cut"]


def prepare(data: Path, work: Path) -> None:
    """The lookup, the per-user table and the two pre-joined files (skipped when present)."""
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(11)
    if not (work / "categories.parquet").exists():
        keys = np.arange(1, 10**6 + 1)
        pl.DataFrame({"key": keys, "category": rng.integers(0, CATEGORIES, keys.size)}).write_parquet(
            work / "categories.parquet")
    if not (work / "users.parquet").exists():
        users = pl.scan_parquet(data).select(pl.col("user_id").unique()).collect(engine="streaming")
        users.with_columns(pl.Series("country", rng.integers(0, COUNTRIES, users.height))).sort("user_id") \
            .write_parquet(work / "users.parquet")
    if not (work / "users_shuffled.parquet").exists():
        pl.read_parquet(work / "users.parquet").sample(fraction=1.0, shuffle=True, seed=5).write_parquet(
            work / "users_shuffled.parquet")
    for name, other, on in (("lookup", "categories", "key"), ("users", "users", "user_id")):
        target = work / f"prejoined_{name}.parquet"
        if not target.exists():
            pl.scan_parquet(data).join(pl.scan_parquet(work / f"{other}.parquet"), on=on, how="inner") \
                .sink_parquet(target, engine="streaming")


def spec(case: str, data: Path, work: Path, out: Path) -> Path:
    inputs = {"events": {"path": str(data)}, "categories": {"path": str(work / "categories.parquet"), "public": True},
              "users": {"path": str(work / ("users_shuffled.parquet" if case in ("shuffled", "both_cut")
                                            else "users.parquet"))},
              "lookup_pre": {"path": str(work / "prejoined_lookup.parquet")},
              "private_pre": {"path": str(work / "prejoined_users.parquet")}}
    query_input: str | dict = {
        "lookup": {"join": ["events", "categories"], "on": "key"},
        "private": {"join": ["events", "users"], "on": "user_id", "max_rows_per_unit": {"users": 1}},
        "shuffled": {"join": ["events", "users"], "on": "user_id", "max_rows_per_unit": {"users": 1}},
        "both_cut": {"join": ["events", "users"], "on": "user_id", "max_rows_per_unit": {"events": 100, "users": 1}},
    }.get(case, case)
    used = [case] if isinstance(query_input, str) else query_input["join"]
    document = {
        "version": 1, "name": f"bench-joins-{case}", "privacy_unit": "user_id",
        "budget": {"epsilon": 1.0986122886681098, "delta": 1e-5, "accounting": "pld"},
        "inputs": {name: inputs[name] for name in used},
        "queries": [{
            "name": "q", "input": query_input, "group_by": ["category" if case.startswith("lookup") else "country"],
            "contribution_bounds": {"max_partitions_contributed": 64, "max_contributions_per_partition": 1},
            "metrics": [{"name": "records", "kind": "count"}], "output": {"path": str(out / f"{case}.parquet")},
        }],
        "report": str(out / f"{case}_report.json"),
    }
    path = out / f"{case}.json"
    path.write_text(json.dumps(document, indent=2))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeat", type=int, default=3, choices=range(1, 101), metavar="N")
    parser.add_argument("--keep", type=Path, default=HERE / "data" / "joins",
                        help="folder for the lookup, per-user and pre-joined files (kept between runs)")
    args = parser.parse_args()
    started = time.perf_counter()
    prepare(args.data, args.keep)
    print(f"inputs ready in {time.perf_counter() - started:.0f} s ({args.keep})")
    runs: dict[str, list[Measurement]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for _ in range(args.repeat):
            for case in CASES:
                argv = [sys.executable, "-m", "dprun", "run", str(spec(case, args.data, args.keep, out)), "--overwrite"]
                measured = run_measured(argv, out, env={**os.environ, "DPRUN_TMPDIR": tmp})
                if measured.status != 0:
                    raise SystemExit(f"{case} failed: {measured.message}")
                runs.setdefault(case, []).append(measured)
    print(f"{'case':<12} {'median s':>9} {'min s':>7} {'cpu s':>7} {'peak RSS GB':>12}")
    for case, measured in runs.items():
        print(f"{case:<12} {statistics.median(m.seconds for m in measured):>9.1f} "
              f"{min(m.seconds for m in measured):>7.1f} {statistics.median(m.cpu_seconds for m in measured):>7.1f} "
              f"{max(m.rss_bytes for m in measured) / 1e9:>12.2f}")
    for joined, pre in PAIRS.items():
        ratio = statistics.median(m.seconds for m in runs[joined]) / statistics.median(m.seconds for m in runs[pre])
        print(f"{joined} / {pre}: {ratio:.2f}x (median wall time)")


if __name__ == "__main__":
    main()

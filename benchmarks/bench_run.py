"""Wall time, peak memory and utility of `dprun run` against plain Polars baselines.

Usage: python benchmarks/bench_run.py [--data benchmarks/data/synth_1e6.parquet]
           [--cases a,b,c1,c2,c3,a3,at,a2,ar,d1,d2,d3,d4,s] [--repeat N] [--limit CASE=GB ...]
           [--max-rss CASE=GB ...] [--cpus 0 --cpus 0,1 ...] [--keep DIR]
(with dprun installed, e.g. pip install -e .; data from generate_synthetic.py)

Cases, each run in its own subprocess on one Parquet file (columns user_id, key, value, day):

  a   non-private Polars group-by count per key (streaming engine); its output is the
      exact record count per key that every error is measured against, so (a) always runs
  b   non-private, contribution-bounded Polars baseline: distinct (user, key) pairs
      (L∞ = 1), 64 of each user's keys chosen at random (L0 = 64), then a count per key
  c1  `dprun run` on specs/plume_paper.yaml (the Plume paper's configuration: Laplace
      noise, laplace_threshold selection, basic accounting)
  c2  `dprun run` on specs/plume_auto.yaml (dprun's automatic plan, pld accounting)
  c3  `dprun run` on specs/plume_sum_mean.yaml (count, sum and mean of `value` in
      [0, 100], automatic plan)

Column families: each dprun case has its own floor, the non-private Polars streaming
group-by on the same file and the same key columns (c2's floor is (a)):

  a3  floor of c3: per key, the row count, and the sum and mean of `value` clipped to [0, 100]
  at  floor of d1: (a) on the text copy of the data (user_id "u123", key "k42"; written next
      to --data once, as <data>_text.parquet)
  a2  floor of d3: a count per (key, day)
  ar  floor of d4: (a) on the shuffled copy of the data (the same rows in a random order;
      written next to --data once, as <data>_shuffled.parquet)
  d1  c2's spec with the text unit and key, on the text copy
  d2  c2's spec with the compound privacy unit [user_id, day] (floor: a)
  d3  c2's spec grouped by the two-column key [key, day]
  d4  c2's spec on the shuffled copy (the generated data lists each user's rows together;
      a real export may not)

The lower bound of c2 on the sorted path (floor: a):

  s   not private, not c2's counts: the sorted path's work per row alone, numpy reading the
      unit and key of two row groups at a time (one read per core the process may use),
      packing, sorting and counting distinct pairs per key; no shuffle of the rows into
      shards of whole units, no bounding, selection, noise, report or dprun start-up

The specs name ../data/synth_1e6.parquet. The script always runs a temporary copy of each
spec that names --data by absolute path and writes its outputs (and dprun's scratch
files, DPRUN_TMPDIR) to a temporary folder, so benchmarks/data/out is never touched.
It first compiles dprun's bytecode, as installing the package does (`compile_bytecode`).

The cases run in rounds, each case once per round in the order given, so that a case and
its floor see the same machine. Columns: the wall time of the subprocess (interpreter
start included; the median and the fastest of --repeat runs, (a) at least 3 runs), the
ratio of its median to its floor's median, its fastest to (a)'s and (b)'s, the CPU time (user +
system; less sensitive than wall time to other work on the machine), the peak RSS
(os.wait4's ru_maxrss), the peak virtual size (polled from /proc: what an address-space
limit must allow), keys released, the mean absolute error (MAE) and mean relative error
(MRE) of the released counts on the released keys, and the MRE on the 1,000 keys with
the most records (a key not released counts as 0). Errors are averaged over the runs.

Memory guards: --max-rss CASE=GB kills a case whose RSS passes GB (default b=15);
--limit CASE=GB runs a case under RLIMIT_AS = GB GiB (like `ulimit -v` or `prlimit --as`),
to show that it runs in bounded memory. A case that fails is reported as failed.

Cores: --cpus SET (repeatable; a SET is a list such as 0,1 or 0-7) pins each run to those
cores (sched_setaffinity, as `taskset -c SET`; Polars and dprun size their thread pools from
the cores a process may use). Every case runs on every set in each round, a table is printed
per set, then each case's speedup from the first set to each other one beside its floor's and
their ratio (the case's speedup over its floor's: 1.0 means it gains from the cores as much as
its floor does).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE / "data" / "synth_1e6.parquet"
SPECS = {"c1": "plume_paper.yaml", "c2": "plume_auto.yaml", "c3": "plume_sum_mean.yaml",
         "d1": "plume_auto.yaml", "d2": "plume_auto.yaml", "d3": "plume_auto.yaml", "d4": "plume_auto.yaml"}
DESCRIPTIONS = {
    "a": "polars group-by count (exact)",
    "b": "polars bounded L0=64 L∞=1 (non-private)",
    "c1": "dprun run, paper config (plume_paper)",
    "c2": "dprun run, automatic plan (plume_auto)",
    "c3": "dprun run, count+sum+mean (plume_sum_mean)",
    "a3": "polars count, sum, mean of clipped value",
    "at": "polars group-by count, text file",
    "a2": "polars group-by count per (key, day)",
    "ar": "polars group-by count, shuffled rows",
    "d1": "dprun run, text unit and key",
    "d2": "dprun run, unit [user_id, day]",
    "d3": "dprun run, key [key, day]",
    "d4": "dprun run, shuffled rows",
    "s": "sorted path's per-row work alone (no shuffle)",
}
ALL_CASES = ["a", "b", "c1", "c2", "c3", "a3", "at", "a2", "ar", "d1", "d2", "d3", "d4", "s"]
FLOOR = {"c1": "a", "c2": "a", "c3": "a3", "d1": "at", "d2": "a", "d3": "a2", "d4": "ar", "s": "a"}
# The cases that read a copy of --data: the text copy, the shuffled copy.
TEXT_CASES, SHUFFLED_CASES = ("at", "d1"), ("ar", "d4")
SHUFFLE_SEED = 46
# What the d cases change in c2's spec: the privacy unit and group_by lines.
FAMILY_EDITS = {"d2": ("privacy_unit: user_id", "privacy_unit: [user_id, day]"),
                "d3": ("group_by: [key]", "group_by: [key, day]")}
DEFAULT_MAX_RSS = {"b": 15.0}
BASELINE_RUNS = 3
L0 = 64
TOP_KEYS = 1000
COUNT_COLUMN = "records"  # the count metric's name in every spec
BYTES_PER_ROW = 25  # user_id int64 + key int64 + value float64 + day int8
VALUE_BOUNDS = (0.0, 100.0)  # c3's bounds on `value`

# Baselines, run as `python -c CODE DATA OUT`.
BASELINE_A = """
import sys, polars as pl
data, out = sys.argv[1:3]
counts = pl.scan_parquet(data).group_by("key").agg(pl.len().cast(pl.Int64).alias("records"))
counts.sink_parquet(out, engine="streaming")
"""
BASELINE_A3 = """
import sys, polars as pl
data, out = sys.argv[1:3]
value = pl.col("value").clip(0, 100)
aggregates = pl.scan_parquet(data).group_by("key").agg(
    pl.len().cast(pl.Int64).alias("records"), value.sum().alias("value_sum"), value.mean().alias("value_mean"))
aggregates.sink_parquet(out, engine="streaming")
"""
BASELINE_A2 = """
import sys, polars as pl
data, out = sys.argv[1:3]
counts = pl.scan_parquet(data).group_by("key", "day").agg(pl.len().cast(pl.Int64).alias("records"))
counts.sink_parquet(out, engine="streaming")
"""
# The sorted path's work per row and nothing else (issue #20's lower bound): read the unit
# and the key of two row groups at a time, one read per core the process may use, pack them
# into one int64, sort, and count the distinct pairs per key. No shuffle into shards (a unit
# whose rows straddle two reads is counted twice: the counts are not c2's), no bounding,
# selection, noise or report.
BASELINE_S = """
import os, sys, threading, numpy as np, polars as pl, pyarrow.parquet as pq
from concurrent.futures import ThreadPoolExecutor
data, out = sys.argv[1:3]
meta = pq.ParquetFile(data).metadata
key_column = meta.schema.names.index("key")
key_bits = max(int(meta.row_group(g).column(key_column).statistics.max) for g in range(meta.num_row_groups)).bit_length()
local = threading.local()
def distinct_pairs_per_key(groups):
    if not hasattr(local, "file"):
        local.file = pq.ParquetFile(data)
    table = local.file.read_row_groups(groups, columns=["user_id", "key"], use_threads=False)
    packed = (table.column("user_id").to_numpy() << key_bits) | table.column("key").to_numpy()
    packed.sort()
    first = np.empty(packed.size, dtype=bool)
    first[0] = True
    np.not_equal(packed[1:], packed[:-1], out=first[1:])
    return np.bincount(packed[first] & ((1 << key_bits) - 1), minlength=1 << key_bits)
groups = list(range(meta.num_row_groups))
with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
    counts = sum(pool.map(distinct_pairs_per_key, [groups[i:i + 2] for i in range(0, len(groups), 2)]))
present = np.flatnonzero(counts)
pl.DataFrame({"key": present, "records": counts[present]}).write_parquet(out)
"""
BASELINES = {"a": BASELINE_A, "a3": BASELINE_A3, "at": BASELINE_A, "a2": BASELINE_A2, "ar": BASELINE_A, "s": BASELINE_S}
BASELINE_B = f"""
import sys, polars as pl
data, out = sys.argv[1:3]
pairs = pl.scan_parquet(data).select("user_id", "key").unique()            # L∞ = 1
kept = pairs.group_by("user_id").agg(pl.col("key").shuffle().head({L0}))  # L0 = {L0}, at random
counts = kept.explode("key").group_by("key").agg(pl.len().cast(pl.Int64).alias("records"))
counts.sink_parquet(out, engine="streaming")
"""

@dataclass
class Measurement:
    seconds: float
    cpu_seconds: float
    rss_bytes: int
    virtual_bytes: int
    status: int
    message: str


@dataclass
class Result:
    case: str
    runs: list[Measurement] = field(default_factory=list)
    utilities: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None
    table: pl.DataFrame | None = None  # the last successful run's output
    report: dict | None = field(default=None, repr=False)

    @property
    def seconds(self) -> float:
        """The fastest run: the least disturbed by other work on the machine."""
        return min(m.seconds for m in self.runs)

    @property
    def median(self) -> float:
        return statistics.median(m.seconds for m in self.runs)

    @property
    def cpu_seconds(self) -> float:
        return min(m.cpu_seconds for m in self.runs)

    @property
    def rss_bytes(self) -> int:
        return max(m.rss_bytes for m in self.runs)

    @property
    def virtual_bytes(self) -> int:
        return max(m.virtual_bytes for m in self.runs)

    def utility(self) -> dict[str, float]:
        """Utility averaged over the successful runs (each private run draws fresh noise)."""
        return {k: sum(u[k] for u in self.utilities) / len(self.utilities) for k in self.utilities[0]}


class Watch(threading.Thread):
    """Polls /proc/PID/status: records the peak virtual size, kills the process above max_rss_gb."""

    def __init__(self, pid: int, max_rss_gb: float | None) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.max_rss = None if max_rss_gb is None else max_rss_gb * 1e9
        self.peak_virtual = 0
        self.killed = False
        self._done = threading.Event()

    def run(self) -> None:
        status = Path(f"/proc/{self.pid}/status")
        while not self._done.wait(0.1):
            try:
                fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
            except OSError:
                return
            if "VmPeak" in fields:
                self.peak_virtual = max(self.peak_virtual, int(fields["VmPeak"].split()[0]) * 1024)
            if self.max_rss and "VmRSS" in fields and int(fields["VmRSS"].split()[0]) * 1024 > self.max_rss:
                self.killed = True
                os.kill(self.pid, signal.SIGKILL)
                return

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_measured(
    argv: list[str], cwd: Path, limit_gb: float | None = None, max_rss_gb: float | None = None,
    env: dict[str, str] | None = None, cpus: frozenset[int] | None = None,
) -> Measurement:
    """Run argv in a subprocess, optionally under an address-space limit, an RSS watchdog and pinned
    to `cpus`."""
    limit = None if limit_gb is None else int(limit_gb * 2**30)

    def set_limit() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=set_limit, env=env)
    watch = Watch(proc.pid, max_rss_gb)
    watch.start()
    # stderr is small (progress lines, errors): read it to EOF, then reap the child with
    # wait4, whose rusage is this child's alone (RUSAGE_CHILDREN would mix all cases).
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    watch.stop()
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    clues = ("panicked", "rror", "failed", "Killed")
    message = next((line for line in lines if any(c in line for c in clues)), lines[-1] if lines else "")
    if watch.killed:
        message = f"killed: RSS above {max_rss_gb:g} GB"
    cpu = usage.ru_utime + usage.ru_stime
    return Measurement(seconds, cpu, usage.ru_maxrss * 1024, watch.peak_virtual, proc.returncode, message[:200])


def spec_copy(case: str, data: Path, tmp: Path) -> tuple[Path, Path, Path]:
    """The case's spec with --data as input and its outputs in tmp: (spec, output, report)."""
    text = (HERE / "specs" / SPECS[case]).read_text()
    if case in FAMILY_EDITS:
        old, new = FAMILY_EDITS[case]
        text = text.replace(old, new)
    output = tmp / case / "output.parquet"
    report = tmp / case / "report.json"
    text, n_input = re.subn(r"(?m)^(\s+path: )\.\./data/synth_1e6\.parquet$", rf"\g<1>{json.dumps(str(data))}", text)
    text, n_output = re.subn(r"(?m)^(\s+path: )\.\./data/out/\S+$", rf"\g<1>{json.dumps(str(output))}", text)
    text, n_report = re.subn(r"(?m)^report: \S+$", f"report: {json.dumps(str(report))}", text)
    if (n_input, n_output, n_report) != (1, 1, 1):
        raise SystemExit(f"{SPECS[case]}: expected one ../data/synth_1e6.parquet input, one output, one report")
    path = tmp / f"{case}.yaml"
    path.write_text(text)
    return path, output, report


def case_argv(case: str, data: Path, tmp: Path) -> tuple[list[str], Path, Path | None]:
    """The command of a case, its output table and its report (dprun cases only)."""
    if case in BASELINES or case == "b":
        out = tmp / f"{case}.parquet"
        code = textwrap.dedent(BASELINES.get(case, BASELINE_B))
        return [sys.executable, "-c", code, str(data), str(out)], out, None
    spec, out, report = spec_copy(case, data, tmp)
    dprun = shutil.which("dprun", path=str(Path(sys.executable).parent)) or shutil.which("dprun")
    command = [dprun] if dprun else [sys.executable, "-m", "dprun"]
    return [*command, "run", str(spec), "--overwrite"], out, report


def text_copy(data: Path) -> Path:
    """The data with user_id and key written as text ("u123", "k42"), made once next to it."""
    path = data.with_name(f"{data.stem}_text.parquet")
    if not path.is_file() or path.stat().st_mtime < data.stat().st_mtime:
        print(f"writing {path} (text user_id and key) …", flush=True)
        text = pl.scan_parquet(data).with_columns(("u" + pl.col("user_id").cast(pl.String)).alias("user_id"),
                                                  ("k" + pl.col("key").cast(pl.String)).alias("key"))
        text.sink_parquet(path, engine="streaming")
    return path


def shuffled_copy(data: Path) -> Path:
    """The data's rows in a random order (fixed seed), made once next to it."""
    path = data.with_name(f"{data.stem}_shuffled.parquet")
    if not path.is_file() or path.stat().st_mtime < data.stat().st_mtime:
        print(f"writing {path} (the rows shuffled) …", flush=True)
        rows = pl.scan_parquet(data).with_row_index("row")
        # Ordered by a hash of the row number: a permutation, sorted by the engine that spills.
        shuffled = rows.sort(pl.col("row").hash(SHUFFLE_SEED)).drop("row")
        shuffled.sink_parquet(path, engine="streaming")
    return path


def run_once(case: str, data: Path, tmp: Path, limit_gb: float | None, max_rss_gb: float | None,
             exact: pl.DataFrame | None, result: Result, cpus: frozenset[int] | None = None) -> None:
    """One run of a case, added to `result`; utility only for the integer-key count cases."""
    if result.error is not None:
        return
    argv, out, report_path = case_argv(case, data, tmp)
    env = dict(os.environ, DPRUN_TMPDIR=str(tmp))
    measured = run_measured(argv, tmp, limit_gb, max_rss_gb, env, cpus)
    result.runs.append(measured)
    if measured.status != 0:
        hint = f" (address space ≤ {limit_gb:g} GiB)" if limit_gb else ""
        result.error = f"exit {measured.status}{hint}: {measured.message}"
        return
    result.table = pl.read_parquet(out)
    if case in ("a", "ar", "b", "c1", "c2", "c3", "d4"):
        result.utilities.append(utility(result.table, result.table if exact is None else exact))
    if report_path is not None:
        result.report = json.loads(report_path.read_text())


def utility(released: pl.DataFrame, exact: pl.DataFrame) -> dict[str, float]:
    """Keys released, errors on the released keys, mean relative error on the top keys."""
    truth = exact.select("key", pl.col(COUNT_COLUMN).cast(pl.Float64).alias("exact"))
    got = released.select("key", pl.col(COUNT_COLUMN).cast(pl.Float64).alias("got"))
    error = (pl.col("got") - pl.col("exact")).abs()
    on_released = got.join(truth, on="key", how="left").with_columns(pl.col("exact").fill_null(0.0))
    top = truth.sort("exact", descending=True).head(TOP_KEYS)
    top = top.join(got, on="key", how="left").with_columns(pl.col("got").fill_null(0.0))
    return {
        "keys": released.height,
        "mae": on_released.select(error.mean()).item() or 0.0,
        "mre": on_released.filter(pl.col("exact") > 0).select((error / pl.col("exact")).mean()).item() or 0.0,
        "top_mre": top.select((error / pl.col("exact")).mean()).item(),
    }


def sum_mean_errors(released: pl.DataFrame, data: Path) -> list[str]:
    """c3's sum and mean: mean relative error on the top keys, against the exact values with
    and without clamping to the spec's bounds (the gap between the two is clamping bias)."""
    low, high = VALUE_BOUNDS
    value, clamped = pl.col("value"), pl.col("value").clip(low, high)
    truth = (
        pl.scan_parquet(data)
        .group_by("key")
        .agg(pl.len().alias("n"), value.sum().alias("sum"), value.mean().alias("mean"),
             clamped.sum().alias("sum_clamped"), clamped.mean().alias("mean_clamped"))
        .collect(engine="streaming")
    )
    top = truth.sort("n", descending=True).head(TOP_KEYS).join(released, on="key", how="left")
    lines = []
    for metric, exact in (("value_sum", "sum"), ("value_mean", "mean")):
        errors = []
        for column in (exact, f"{exact}_clamped"):
            rel = (pl.col(metric).fill_null(0.0) - pl.col(column)).abs() / pl.col(column)
            errors.append(top.select(rel.mean()).item())
        lines.append(f"c3 {metric}: MRE top{TOP_KEYS} {errors[0]:.2%} vs exact values, "
                     f"{errors[1]:.2%} vs values clamped to [{low:g}, {high:g}]")
    return lines


def plan_summary(report: dict) -> str:
    query = report["queries"][0]
    part = query["partitions"]
    noises = ", ".join(f"{q['id']} {q['noise']} σ={q['std']:.4g}" for q in query["quantities"])
    return (
        f"{report['accounting']} accounting; {part['selection']} selection (ε={part['epsilon']:.4g}; "
        f"50%/95% keep at {part['units_for_50pct_keep']}/{part['units_for_95pct_keep']} users); {noises}"
    )


def gb(n: int | None) -> str:
    return "–" if not n else f"{n / 1e9:.2f}"


def print_table(results: dict[str, Result]) -> None:
    base = results["a"].seconds
    bounded = results["b"].seconds if "b" in results and results["b"].error is None else None
    top = f"MRE top{TOP_KEYS}"
    header = (f"{'case':<4} {'what':<43} {'median':>7} {'fastest':>7} {'×floor':>7} {'×(a)':>6} {'×(b)':>5} "
              f"{'CPU s':>6} {'RSS GB':>6} {'VM GB':>6} {'keys':>9} {'MAE':>7} {'MRE':>7} {top:>12}")
    print(header)
    print("-" * len(header))
    for case, r in results.items():
        if not r.runs:
            continue
        floor = results.get(FLOOR.get(case, ""))
        ratio_floor = f"{r.median / floor.median:.2f}" if floor is not None and floor.runs and not r.error else ""
        ratio_a = f"{r.seconds / base:.2f}" if case != "a" else ""
        ratio_b = f"{r.seconds / bounded:.2f}" if bounded and case.startswith("c") else ""
        timing = (f"{case:<4} {DESCRIPTIONS[case]:<43} {r.median:>7.1f} {r.seconds:>7.1f} {ratio_floor:>7} "
                  f"{ratio_a:>6} {ratio_b:>5} {r.cpu_seconds:>6.1f} {gb(r.rss_bytes):>6} {gb(r.virtual_bytes):>6}")
        if r.error is not None:
            print(f"{timing}  FAILED {r.error}")
            continue
        if not r.utilities:
            print(timing)
            continue
        u = r.utility()
        print(f"{timing} {u['keys']:>9,.0f} {u['mae']:>7.2f} {u['mre']:>7.2%} {u['top_mre']:>12.2%}")


def parse_limits(parser: argparse.ArgumentParser, items: list[str], option: str, limits: dict) -> dict:
    """CASE=GB items; GB = 0 removes a default limit."""
    limits = dict(limits)
    for item in items:
        case, _, value = item.partition("=")
        try:
            amount = float(value)
        except ValueError:
            amount = -1.0
        if case not in ALL_CASES or amount < 0:
            parser.error(f"{option} {item}: expected CASE=GB with CASE in {','.join(ALL_CASES)}")
        limits[case] = amount or None
    return limits


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Parquet input (default: %(default)s)")
    parser.add_argument("--cases", default="a,b,c1,c2,c3",
                        help=f"comma-separated subset of {','.join(ALL_CASES)} (a always runs; default %(default)s)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; wall time is the fastest (default 1)")
    parser.add_argument("--limit", action="append", default=[], metavar="CASE=GB",
                        help="run CASE under an address-space limit (RLIMIT_AS) of GB GiB")
    parser.add_argument("--max-rss", action="append", default=[], metavar="CASE=GB",
                        help="kill CASE when its RSS passes GB (default b=15; b=0 for no limit)")
    parser.add_argument("--cpus", action="append", default=[], metavar="SET",
                        help="pin every case to these cores (0,1 or 0-7); repeat to compare core counts")
    parser.add_argument("--keep", type=Path, help="write the temporary specs and outputs here and keep them")
    args = parser.parse_args()
    cases = {c.strip() for c in args.cases.split(",") if c.strip()}
    if cases - set(ALL_CASES):
        parser.error(f"unknown cases: {', '.join(sorted(cases - set(ALL_CASES)))}")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    args.cases = [c for c in ALL_CASES if c == "a" or c in cases]
    args.limit = parse_limits(parser, args.limit, "--limit", {})
    args.max_rss = parse_limits(parser, args.max_rss, "--max-rss", DEFAULT_MAX_RSS)
    args.data = args.data.resolve()
    if not args.data.is_file():
        parser.error(f"{args.data} does not exist (see generate_synthetic.py)")
    usable = os.sched_getaffinity(0)
    args.cpus = [parse_cpus(parser, item, usable) for item in args.cpus] or [None]
    return args


def parse_cpus(parser: argparse.ArgumentParser, item: str, usable: set[int]) -> frozenset[int]:
    """A core set as `taskset -c` writes it: 0,1 or 0-3,6."""
    cores: set[int] = set()
    for part in item.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            parser.error(f"--cpus {item}: expected a list such as 0,1 or 0-3")
        cores |= set(range(int(low), int(high or low) + 1))
    if not cores <= usable:
        parser.error(f"--cpus {item}: this process may use cores {','.join(map(str, sorted(usable)))} only")
    return frozenset(cores)


def cpus_name(cpus: frozenset[int] | None) -> str:
    if cpus is None:
        return "all cores"
    return f"{len(cpus)} core{'s' * (len(cpus) > 1)} ({','.join(map(str, sorted(cpus)))})"


def compile_bytecode() -> None:
    """Compile dprun's modules to bytecode, as pip does when it installs a package. A checkout
    installed in editable mode writes it at first import, unless PYTHONDONTWRITEBYTECODE is
    set (as on the benchmark machine): then every run compiled dprun's sources again, ~0.14 s
    that no installation pays."""
    compileall.compile_dir(HERE.parent / "dprun", quiet=1)


def run_all(args: argparse.Namespace, tmp: Path) -> None:
    compile_bytecode()
    rows = pl.scan_parquet(args.data).select(pl.len()).collect().item()
    print(f"data: {args.data} — {rows:,} rows, {args.data.stat().st_size / 2**20:,.1f} MiB Parquet, "
          f"{rows * BYTES_PER_ROW / 1e9:.2f} GB in memory ({BYTES_PER_ROW} B/row); "
          f"{os.cpu_count()} cores, polars {pl.__version__}; load average {os.getloadavg()[0]:.2f}")
    copies = {case: copy(args.data) for cases, copy in ((TEXT_CASES, text_copy), (SHUFFLED_CASES, shuffled_copy))
              if set(cases) & set(args.cases) for case in cases}
    by_cpus = {cpus: {case: Result(case) for case in args.cases} for cpus in args.cpus}
    rounds = max(args.repeat, BASELINE_RUNS if args.cases == ["a"] else args.repeat)
    for round_index in range(rounds):
        print(f"round {round_index + 1} of {rounds}: {', '.join(args.cases)}", flush=True)
        for cpus, results in by_cpus.items():
            for case in args.cases:
                limit, max_rss = args.limit.get(case), args.max_rss.get(case)
                data = copies.get(case, args.data)
                exact = results["a"].table if case != "a" else None
                # (a) runs at least BASELINE_RUNS times: its extra runs come in the first round.
                times = BASELINE_RUNS - rounds + 1 if case == "a" and round_index == 0 and rounds < BASELINE_RUNS else 1
                for _ in range(times):
                    run_once(case, data, tmp, limit, max_rss, exact, results[case], cpus)
                if case == "a" and results[case].error is not None:
                    raise SystemExit(f"case a failed: {results[case].error}")
    print(f"load average after the runs: {os.getloadavg()[0]:.2f}\n")
    for cpus, results in by_cpus.items():
        if len(by_cpus) > 1:
            print(f"pinned to {cpus_name(cpus)}:")
        print_table(results)
        print()
        for case, r in results.items():
            if r.report is not None:
                print(f"{case}: {plan_summary(r.report)}")
        if "c3" in results and results["c3"].table is not None:
            for line in sum_mean_errors(results["c3"].table, args.data):
                print(line)
        print()
    if len(by_cpus) > 1:
        print_speedups(by_cpus)


def print_speedups(by_cpus: dict[frozenset[int] | None, dict[str, Result]]) -> None:
    """Each case's speedup (median wall time) from the first core set to each other, beside its floor's."""
    first, *others = by_cpus
    for cpus in others:
        print(f"speedup from {cpus_name(first)} to {cpus_name(cpus)} (median wall time; case / floor):")
        for case in by_cpus[first]:
            before, after = by_cpus[first][case], by_cpus[cpus][case]
            if before.error or after.error or not before.runs or not after.runs:
                continue
            gain = before.median / after.median
            floor = FLOOR.get(case)
            if floor is None or floor not in by_cpus[first]:
                print(f"  {case:<4} {gain:5.2f}x")
                continue
            floor_gain = by_cpus[first][floor].median / by_cpus[cpus][floor].median
            print(f"  {case:<4} {gain:5.2f}x   floor ({floor}) {floor_gain:5.2f}x   ratio {gain / floor_gain:5.2f}")


def main() -> None:
    args = parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run_all(args, args.keep.resolve())
        return
    with tempfile.TemporaryDirectory(prefix="bench_run-") as tmp:
        run_all(args, Path(tmp))


if __name__ == "__main__":
    main()

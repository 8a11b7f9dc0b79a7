"""Execute a plan on Apache Spark: the Polars engine's steps, distributed (docs/scale.md).

The steps, their column semantics and their integer arithmetic are those of
`dprun.engines.polars_engine`, step for step:

1. scan, join the inputs a join names (a public lookup broadcast; a private input cut first
   to its rows per unit by a window `row_number()` over a keyed hash), filter, keep the
   needed columns, drop rows whose privacy unit is null; public partitions: drop rows of
   unlisted keys first; NaN values count as missing;
2. per (unit, partition): partial integer sums in fixed-point units (clip, centre, square,
   scale by 2**-unit_exponent, round half to even, clip, cast), scaled by min(n, m) / n with
   exact floor division on decimal(38, 0);
3. cross-partition bounding: each unit keeps the L0 partitions with the most rows, ties by
   the smallest keyed hash of (unit, partition) (`xxhash64` with the run's secret 64-bit key
   as its first input), then the partition keys, via a window `row_number()` per unit;
4. private partitions: the per-partition unit counts come to the driver in key order and are
   passed to `dprun.mechanisms.selection.select_partitions` a chunk at a time, exactly as the
   Polars engine does (`release_steps.chosen_in_key_order`); then Plume's second bounding
   (step 3 on the selected partitions only);
5. per-partition exact integer sums come to the driver in key order and are released by the
   same engine-neutral steps as the Polars engine's (`dprun.engines.release_steps`): noise by
   `dprun.mechanisms.noise.add_noise`, metrics by `dprun.postprocess.metric_columns`;
   quantiles by `release_steps.answer_quantile` (a tree or candidates) from per-(partition,
   leaf) weights summed on the executors for the partitions released.

Tables that grow with the data (every candidate of a selection, and every candidate's sums
under `released_count`) are collected whole only up to WHOLE_CANDIDATES rows; beyond, Spark
sorts them and the driver reads them a partition at a time (`_in_key_order`), so its memory
holds one chunk of draws and what is released.

Executors only ever compute deterministic functions of the input rows and the run's hash
key: integer sums (exact, so independent of order and partitioning) and a keyed-hash
choice with a total order. A retried or speculative task, a recomputed stage or a lost
cache block therefore reproduces exactly the same rows and sums. Every random draw
(selection, noise) happens on the driver, from the run's `RandomSource`, on a table
collected once (`.toArrow()`, or `toLocalIterator()` once over a persisted table, is called once
per table and its result kept).
No Spark task can draw noise, so no recomputation can publish a second noisy copy.

Filters and derived columns are never handed to Spark as text: Polars computes the very
expressions `validate` checked, on the executors, through `mapInArrow`; the executors'
Python then needs polars and pyarrow (docs/scale.md).

Spark Connect: only the DataFrame API is used (no RDDs, no SparkContext; `mapInArrow` is
part of it), so `spark_session(remote="sc://...")` works as well as a classic session.
"""

from __future__ import annotations

import glob
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from decimal import Decimal
from pathlib import Path, PurePosixPath
from functools import reduce
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from dprun.engines import release_steps
from dprun.engines.polars_steps import GLOBAL_KEY, LEAF, PARTITION, SELECTION_WEIGHTS, UNITS, WEIGHT, truncation_key
from dprun.errors import DataError, DprunError, ExitCode
from dprun.mechanisms import bound_choice, selection
from dprun.mechanisms.bound_choice import ContributionProfile
from dprun.mechanisms.quantile_tree import WEIGHT_BITS
from dprun.mechanisms.quantities import Quantity
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import NoisyQuantity, QueryPlan
from dprun.spec.input_paths import local_path, url_parts, url_problem, url_scheme
from dprun.spec.input_schema import (
    COLUMN_TYPES,
    FORMAT_UNKNOWN,
    InputInfo,
    Located,
    derived_schema,
    files_format,
    input_format,
    lookup_table,
    partition_columns,
    partitions_differ,
)
from dprun.spec.models import InputSpec
from dprun.spec.row_expressions import row_filter

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

INSTALL_HINT = "install dprun[spark]; Spark needs Java 17+"
MIN_JAVA = 17
DEFAULT_MASTER = "local[*]"
# SQL settings dprun relies on, also applied to a session that already exists; a `--conf` of the same key wins.
SQL_DEFAULTS = {
    "spark.sql.caseSensitive": "true",  # column names are case-sensitive, as in Polars and the spec
    "spark.sql.session.timeZone": "UTC",
    # Partition folders' columns are text unless the spec types them, never typed from their values.
    "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    # Let adaptive execution coalesce the shuffle of the cached partials (200 tiny partitions
    # otherwise): 5x faster bounding on the Plume benchmark in local mode.
    "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
}
# Settings for a session dprun starts. Spark's log messages quote data values (e.g. a value
# that does not parse), and a classic session logs to this process's stderr, which may end up
# in a CI log: Spark's logging is off unless `--conf spark.log.level=WARN` asks for it.
STARTUP_DEFAULTS = {
    "spark.ui.showConsoleProgress": "false",
    "spark.log.level": "OFF",
}
HASH = "__dprun_hash__"
RANK = "__dprun_rank__"
COUNT = "__dprun_count__"
PRESENT = "__dprun_present__"
RIGHT = "__dprun_right_{}__"
# The contribution profile of `auto` bounds: per pair its rows and keyed hash; per unit its
# partitions and the key hash of its picked pair (the Polars engine profiles on the sorted path).
PAIR_ROWS = "__dprun_pair_rows__"
UNIT_PAIRS = "__dprun_unit_pairs__"
PICK = "__dprun_pick__"
PICKED_KEY = "__dprun_picked_key__"
PARTITIONS = "__dprun_partitions__"
UNIT_ROWS = "__dprun_unit_rows__"
CAPPED = "__dprun_capped_{}__"
KEPT = "__dprun_kept_{}__"
VALUE_CELL = "__dprun_value_cell__"
IPC = "__dprun_arrow_ipc__"
CORRUPT = "__dprun_corrupt__"
# Up to this many candidates of a private selection (or their sums) are collected whole (about 100 MB
# of Arrow at 20-byte keys); more are streamed to the driver in key order (`_in_key_order`).
WHOLE_CANDIDATES = 1 << 22
# Streamed, they come in ranges of about this many rows (about 10 MB each).
FETCH_ROWS = 1 << 18
EXACT = "decimal(38,0)"  # exact integers up to about 2**126 (the Polars engine uses Int128)


class SparkUnavailable(DprunError):
    """pyspark or Java is missing, or no Spark session could be started."""

    exit_code = ExitCode.USAGE_OR_INTERNAL


class SparkDriverLimit(DprunError):
    """A limit of the Spark driver was hit (its result size or memory): a setting to raise, not bad data
    (no input is read again to look for a bad row)."""

    exit_code = ExitCode.USAGE_OR_INTERNAL


# Fixed phrases of Spark's messages for the driver's limits, and what to say for each. The phrases are
# searched for, never shown: the rest of a Spark message can quote data values.
DRIVER_LIMITS = (
    ("bigger than spark.driver.maxResultSize",
     "the results collected on the Spark driver exceeded spark.driver.maxResultSize; raise it "
     "(--conf spark.driver.maxResultSize=4g, or 0 for no limit) and give the driver the memory to match "
     "(spark.driver.memory, set before the driver starts)"),
    ("java.lang.OutOfMemoryError",
     "a Spark JVM ran out of memory; raise spark.driver.memory (set before the driver starts: "
     "spark-submit --driver-memory or spark-defaults.conf) or spark.executor.memory"),
)

# A local or client-mode driver's JVM that stops answering has most often run out of memory.
DRIVER_GONE = ("the Spark driver's JVM stopped answering, most often because it ran out of memory; raise "
               "spark.driver.memory (set before the driver starts: spark-submit --driver-memory or "
               "spark-defaults.conf; in local mode it holds the executors too)")


# --- session ----------------------------------------------------------------------------


def spark_session(
    master: str | None = None, remote: str | None = None, conf: Mapping[str, str] | Iterable[str] | None = None
) -> SparkSession:
    """A Spark session for `--engine spark`: classic (`master`, default local[*]) or Spark Connect (`remote`).

    Under spark-submit, the master and configuration given to spark-submit apply unless
    `master` is given.

    `conf` is passed through to the builder (`key=value` strings or a mapping). Sets
    PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON to this interpreter unless they are set
    already, so Python workers (filters and derived columns run in them) use the same environment.
    If a session is active in this process, it is reused (its master is not changed).
    """
    if master is not None and remote is not None:
        raise SparkUnavailable("give either a Spark master or a Spark Connect URL (--spark-remote), not both")
    # A Spark Connect server is already running: only session (SQL) settings can be set from here.
    startup = STARTUP_DEFAULTS if remote is None else {}
    settings = {**startup, **SQL_DEFAULTS, **_conf_dict(conf)}
    try:
        import pyspark  # noqa: F401
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable(f"the Spark engine needs pyspark: {INSTALL_HINT}") from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if remote is not None:
        if not remote.startswith("sc://"):
            raise SparkUnavailable(f"a Spark Connect URL starts with sc://, got '{remote}'")
        builder = SparkSession.builder.remote(remote)
    elif master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Started by spark-submit, whose JVM is running: its --master and --conf apply.
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # connect to spark-submit's JVM, so SparkConf reads its settings
        submitted = dict(SparkConf().getAll())
        explicit = _conf_dict(conf)
        settings = {k: v for k, v in settings.items() if k in explicit or k not in submitted}
        if "spark.log.level" in submitted and "spark.log.level" not in settings:
            settings["spark.log.level"] = submitted["spark.log.level"]
        builder = SparkSession.builder
    else:
        _require_java()
        builder = SparkSession.builder.master(master or DEFAULT_MASTER)
    builder = builder.appName("dprun")
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except ImportError as exc:
        # Spark Connect's client needs extra packages (pandas, grpcio, ...).
        raise SparkUnavailable(
            f"the Spark Connect client is not installed ({exc}): pip install 'pyspark[connect]'; {INSTALL_HINT}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - the JVM or the server failed to start: report its kind
        raise SparkUnavailable(f"could not start a Spark session ({type(exc).__name__}: {_first_line(exc)}); "
                               f"{INSTALL_HINT}") from None
    if settings.get("spark.log.level", "OFF").upper() == "OFF":
        _quiet_python_loggers()
    for key in SQL_DEFAULTS:
        # getOrCreate on an existing session applies builder settings; make sure of the ones dprun needs.
        if key in settings:
            with suppress(Exception):  # a conf locked by a shared server keeps its value
                session.conf.set(key, settings[key])
    return session


def _quiet_python_loggers() -> None:
    """pyspark (4+) logs a failed query's message, which can quote a data value, to stderr."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # pragma: no cover - pyspark < 4 has no such loggers
        return
    for name in ("DataFrameQueryContextLogger", "SQLQueryContextLogger"):
        PySparkLogger.getLogger(name).disabled = True


def describe(master: str | None, remote: str | None) -> str:
    """Where `spark_session(master, remote)` runs, for progress messages."""
    if remote is not None:
        return remote
    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
        return "spark-submit's master"
    return master or DEFAULT_MASTER


def _conf_dict(conf: Mapping[str, str] | Iterable[str] | None) -> dict[str, str]:
    if conf is None:
        return {}
    if isinstance(conf, Mapping):
        return {str(k): str(v) for k, v in conf.items()}
    out = {}
    for item in conf:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise SparkUnavailable(f"--conf takes key=value, got '{item}'")
        out[key.strip()] = value
    return out


def _require_java() -> None:
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkUnavailable(f"the Spark engine needs Java, and none was found (JAVA_HOME or PATH): {INSTALL_HINT}")
    try:
        shown = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        raise SparkUnavailable(f"cannot run '{java} -version': {INSTALL_HINT}") from None
    version = java_major_version(shown.stderr + shown.stdout)
    if version is None or version < MIN_JAVA:
        found = "an unknown Java version" if version is None else f"Java {version}"
        raise SparkUnavailable(f"found {found} at {java}: {INSTALL_HINT}")


def java_major_version(text: str) -> int | None:
    """17 from 'openjdk version "17.0.15"', 8 from 'java version "1.8.0_392"'."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no message"


# --- the query --------------------------------------------------------------------------


def run_query(plan: QueryPlan, info: InputInfo, source: RandomSource, spark: SparkSession) -> pl.DataFrame:
    """The DP output of one query: one row per released partition, keys then metrics.

    The same table, for the same random source and data, as `polars_engine.run_query`
    whenever every unit stays within L0 partitions (the engines' keyed hashes differ, so
    which L0 partitions a heavier unit keeps differs; both choices are uniform).
    """
    keys = release_steps.partition_keys(plan)
    seed, truncation_seed, _, _ = source.hash_seeds()
    with _spark_errors():
        rows = _rows(spark, plan, info, keys, truncation_seed)
        ranked = _ranked(_partials(rows, plan, keys), plan, keys, seed).persist(_storage_level())
        try:
            sums, bounded = _bounded_sums(spark, plan, info, ranked, keys, source)

            def quantiles(partitions: pl.DataFrame) -> dict[str, dict[float, np.ndarray]]:
                return {q.quantity.id: _quantiles(spark, q, plan, rows, bounded, partitions, keys, source)
                        for q in plan.quantities if q.quantity.is_quantile}

            return release_steps.release_in_key_order(plan, sums, source, quantiles)
        finally:
            ranked.unpersist()


def contribution_profile(plan: QueryPlan, info: InputInfo, source: RandomSource, spark: SparkSession
                         ) -> ContributionProfile:
    """The exact histograms `auto` bounds are chosen from, as `polars_engine.contribution_profile`
    computes them: per unit, its partitions and the rows of the pair with the smallest keyed hash;
    per partition, the units that picked it; per candidate bound, the units' kept shares."""
    assert plan.bound_choice is not None, "a query with auto bounds"
    f = F()
    keys = release_steps.partition_keys(plan)
    units = list(plan.privacy_unit)
    _, truncation_seed, pick_seed, _ = source.hash_seeds()
    with _spark_errors():
        rows = _rows(spark, plan, info, keys, truncation_seed)
        pairs = rows.groupBy(*_cols([*units, *keys])).agg(f.count(f.lit(1)).alias(PAIR_ROWS))
        from pyspark.sql import Window

        choice = plan.bound_choice
        by_rows = Window.partitionBy(*_cols(units)).orderBy(f.col(PAIR_ROWS).desc())
        pairs = pairs.withColumn(PICK, _keyed_hash(pick_seed, [*units, *keys])) \
            .withColumn(PICKED_KEY, _keyed_hash(pick_seed, keys)).withColumn(RANK, f.row_number().over(by_rows))
        # Per candidate (L0, L∞): the rows min(r, L∞) of the unit's L0 pairs with the most rows (ties
        # between pairs of equal rows do not change the sum).
        capped = [f.expr(f"sum(CASE WHEN {_sql(RANK)} <= {l0} THEN least({_sql(PAIR_ROWS)}, {cap}) ELSE 0 END)"
                         ).alias(CAPPED.format(f"{i}_{j}"))
                  for i, l0 in enumerate(choice.l0_options) for j, cap in enumerate(choice.rows_options)]
        per_unit = pairs.groupBy(*_cols(units)).agg(
            f.count(f.lit(1)).alias(PARTITIONS), f.min_by(PAIR_ROWS, PICK).alias(PAIR_ROWS),
            f.min_by(PICKED_KEY, PICK).alias(PICKED_KEY), f.sum(PAIR_ROWS).alias(UNIT_ROWS), *capped
        ).persist(_storage_level())
        try:
            shapes = _collect(per_unit.groupBy(PARTITIONS, PAIR_ROWS).agg(f.count(f.lit(1)).alias(UNITS)),
                              {PARTITIONS: pl.Int64, PAIR_ROWS: pl.Int64, UNITS: pl.Int64})
            kept_rows, kept_pairs = _kept_weights(per_unit, plan.bound_choice)
            unit_rows = _collect(per_unit.groupBy(UNIT_ROWS).agg(f.count(f.lit(1)).alias(UNITS)),
                                 {UNIT_ROWS: pl.Int64, UNITS: pl.Int64})
            picks = per_unit.groupBy(PICKED_KEY).agg(f.count(f.lit(1)).alias(UNITS))
            sizes = _collect(picks.groupBy(UNITS).agg(f.count(f.lit(1)).alias(PARTITIONS)),
                             {UNITS: pl.Int64, PARTITIONS: pl.Int64})
        finally:
            per_unit.unpersist()
        values = [_value_histogram(rows, units, column) for column in plan.bound_choice.value_columns]
    cells = bound_choice.histogram(shapes[PARTITIONS].to_numpy(), shapes[PAIR_ROWS].to_numpy(), plan.bound_choice,
                                   shapes[UNITS].to_numpy())
    return ContributionProfile(cells, bound_choice.unit_rows_histogram(unit_rows[UNIT_ROWS].to_numpy(),
                                                                       unit_rows[UNITS].to_numpy()),
                               bound_choice.size_histogram(sizes[UNITS].to_numpy(), sizes[PARTITIONS].to_numpy()),
                               kept_rows, kept_pairs,
                               np.array(values, dtype=np.int64).reshape(len(values), bound_choice.VALUE_CELLS))


def _kept_weights(per_unit: DataFrame, choice: bound_choice.BoundChoicePlan) -> tuple[np.ndarray, np.ndarray]:
    """`bound_choice.kept_weights` in Spark, from each unit's partitions, rows and capped rows: the same
    integers, floor divisions included (`div` of non-negative longs, each operand far below 2^63).

    Hundreds of sums (8 pairs' weights, 440 rows' weights by default) are written as SQL over dprun's
    own column names and integer constants, no spec text: built with the Column API, each node of
    their expressions cost the driver a py4j round trip, ~50,000 of them (20 s of a profile)."""
    bits = bound_choice.UNIT_WEIGHT_BITS
    n, total = _sql(PARTITIONS), _sql(UNIT_ROWS)
    cells = [(i, j) for i in range(len(choice.l0_options)) for j in range(len(choice.rows_options))]
    shares = per_unit.selectExpr(n, total, *[f"shiftleft({_sql(CAPPED.format(f'{i}_{j}'))}, {bits}) div {total} "
                                             f"AS {_sql(CAPPED.format(f'{i}_{j}'))}" for i, j in cells])
    sums = [f"sum(shiftleft(least({n}, {l0}), {bits}) div {n}) AS {_sql(KEPT.format(i))}"
            for i, l0 in enumerate(choice.l0_options)]
    sums += [f"sum(({_sql(CAPPED.format(f'{i}_{j}'))} * least({total}, {cap})) div {cap}) "
             f"AS {_sql(KEPT.format(f'{c}_{i}_{j}'))}" for c, cap in enumerate(bound_choice.KEPT_CAPS) for i, j in cells]
    [row] = shares.selectExpr(*sums).collect()
    kept_pairs = np.array([int(row[KEPT.format(i)] or 0) for i in range(len(choice.l0_options))], dtype=np.int64)
    kept_rows = np.array([[[int(row[KEPT.format(f"{c}_{i}_{j}")] or 0) for j in range(len(choice.rows_options))]
                           for i in range(len(choice.l0_options))] for c in range(len(bound_choice.KEPT_CAPS))],
                         dtype=np.int64)
    return kept_rows, kept_pairs


def _value_histogram(rows: DataFrame, units: list[str], column: str) -> np.ndarray:
    """One column's value histogram as `bound_choice.unit_value_weights` computes it: each unit's
    finite values' cells (`_value_cell`), weighed to 2^UNIT_WEIGHT_BITS per unit, rounded down."""
    f = F()
    from pyspark.sql import Window

    value = _col(column).cast("double")
    present = rows.where(value.isNotNull() & ~f.isnan(value) & (f.abs(value) < float("inf")))
    per_cell = present.groupBy(*_cols(units), _value_cell(value).alias(VALUE_CELL)).agg(f.count(f.lit(1)).alias(COUNT))
    unit_rows = f.sum(COUNT).over(Window.partitionBy(*_cols(units)))
    weights = per_cell.select(VALUE_CELL, _floor_div(f.col(COUNT) * (1 << bound_choice.UNIT_WEIGHT_BITS), unit_rows
                                                     ).alias(COUNT))
    found = _collect(weights.groupBy(VALUE_CELL).agg(f.sum(COUNT).alias(COUNT)), {VALUE_CELL: pl.Int64, COUNT: pl.Int64})
    histogram = np.zeros(bound_choice.VALUE_CELLS, dtype=np.int64)
    histogram[found[VALUE_CELL].to_numpy()] = found[COUNT].to_numpy()
    return histogram


def _value_cell(value: Column) -> Column:
    """`bound_choice.value_cells` in Spark: the smallest k with |v| ≤ 2^k from log2, then made exact by
    comparing with powers of two (exact doubles)."""
    f = F()
    magnitude = f.abs(value)
    guess = f.ceil(f.log2(magnitude)).cast("int")
    k = f.when(f.pow(f.lit(2.0), guess - 1) >= magnitude, guess - 1) \
        .when(f.pow(f.lit(2.0), guess) < magnitude, guess + 1).otherwise(guess)
    position = f.least(f.greatest(k - bound_choice.VALUE_MIN_EXPONENT + 1, f.lit(0)),
                       f.lit(bound_choice.VALUE_EXPONENTS + 1))
    position = f.when(magnitude == 0, f.lit(0)).otherwise(position)
    return (f.lit(bound_choice.ZERO_CELL) + f.signum(value).cast("int") * position).cast("long")


def exact_sums(plan: QueryPlan, info: InputInfo, source: RandomSource, spark: SparkSession) -> pl.DataFrame:
    """The bounded, selected, exact per-partition sums `run_query` adds noise to, sorted by keys.

    NOT private: for tests and debugging only (they show that the bounded aggregates are a
    deterministic function of the data, the run's hash key and the selection draws).
    Columns: partition keys, UNITS, then one Int128 column per non-quantile quantity id.
    """
    keys = release_steps.partition_keys(plan)
    seed, truncation_seed, _, _ = source.hash_seeds()
    with _spark_errors():
        ranked = _ranked(_partials(_rows(spark, plan, info, keys, truncation_seed), plan, keys), plan, keys, seed)
        sums, _ = _bounded_sums(spark, plan, info, ranked, keys, source)
        return pl.concat(sums)


def _bounded_sums(
    spark: SparkSession, plan: QueryPlan, info: InputInfo, ranked: DataFrame, keys: list[str], source: RandomSource,
) -> tuple[Iterator[pl.DataFrame], DataFrame]:
    """Steps 3–5 up to the exact sums, from the `_ranked` partials: (sums on the driver in
    `release_steps.key_order`, as consecutive frames, the bounded partials they came from)."""
    key_schema = _key_schema(plan, info, keys)
    bounded = _within_l0(ranked, plan)
    mode = plan.selection.mode
    if mode == "private" and plan.selection.mechanism != "released_count":
        chosen = _chosen_partitions(plan, bounded, keys, key_schema, source)
        chosen_frame = _to_spark(spark, chosen)
        bounded = _second_bounding(ranked, chosen_frame, plan, keys) if plan.selection.second_bounding \
            else _semi(bounded, chosen_frame, keys)
        sums = release_steps.with_all_keys(_collected_sums(bounded, plan, keys, key_schema), chosen, plan)
    elif mode == "private":
        # released_count: every candidate's sums are drawn for; they may be too many for the driver.
        frame, schema, names = _partition_sums(bounded, plan, keys, key_schema)
        return (sums.rename(names) for sums in _in_key_order(frame, schema, keys)), bounded
    else:
        sums = release_steps.with_all_keys(_collected_sums(bounded, plan, keys, key_schema),
                                           release_steps.public_keys(plan), plan)
    return iter([sums.sort(release_steps.key_order(key_schema), nulls_last=True)]), bounded


def _collected_sums(bounded: DataFrame, plan: QueryPlan, keys: list[str], key_schema: dict[str, Any]
                    ) -> pl.DataFrame:
    """`_partition_sums` collected once, each sum named by its quantity id."""
    frame, schema, names = _partition_sums(bounded, plan, keys, key_schema)
    return _collect(frame, schema).rename(names)


# --- executors: scan, bounding, aggregation ---------------------------------------------


def _rows(spark: SparkSession, plan: QueryPlan, info: InputInfo, keys: list[str], truncation_seed: int) -> DataFrame:
    # Checked before pyspark is imported or Spark reads anything, as `validate` checks them.
    derived = [(name, row_filter(text, f"derive.{name}")) for name, text in plan.derive]
    predicate = None if plan.filter is None else row_filter(plan.filter)
    for joined in (info, *(j.info for j in info.joins)):
        for name, text in joined.reading.derive.items():
            row_filter(text, f"derive.{name}")
    f = F()
    columns = {*plan.privacy_unit, *plan.group_by}
    columns |= {q.quantity.column for q in plan.quantities if q.quantity.column is not None}
    frame = _joined_input(spark, plan, info, truncation_seed)
    schema, _ = derived_schema(info.joined_schema, dict(plan.derive), ("derive",))
    frame = _with_row_expressions(frame, derived, predicate, columns, schema)
    frame = frame.select(*_cols(sorted(columns)))
    frame = frame.filter(reduce(lambda a, b: a & b, [_col(c).isNotNull() for c in plan.privacy_unit]))
    if not plan.group_by:
        frame = frame.withColumn(GLOBAL_KEY, f.lit(0).cast("byte"))
    if plan.selection.mode == "public":
        frame = _semi(frame, _to_spark(spark, plan.public_keys), keys)
    value_columns = sorted({q.quantity.column for q in plan.quantities if q.quantity.column is not None})
    types = {field.name: field.dataType for field in frame.schema.fields}
    for c in value_columns:
        frame = frame.withColumn(c, _as_value(c, types[c]))
    return frame


def _as_value(column: str, dtype: Any) -> Column:
    """`polars_engine._as_value`: a number or Boolean as a double with NaN as missing; any other type
    (a text column a `count` counts) as it is."""
    from pyspark.sql import types as T

    f = F()
    if isinstance(dtype, (T.NumericType, T.BooleanType)):
        value = _col(column).cast("double")
        return f.when(f.isnan(value), f.lit(None).cast("double")).otherwise(value)
    return _col(column)


def _joined_input(spark: SparkSession, plan: QueryPlan, info: InputInfo, seed: int) -> DataFrame:
    """The query's input joined with the inputs its spec joins, in order, as the Polars engine does
    (`polars_engine._joined_input`): a private input cut to its rows per unit first."""
    f = F()
    units = list(plan.privacy_unit)
    bounds = plan.truncation

    def private(name: str, frame: DataFrame, position: int) -> DataFrame:
        bound = bounds.get(name)
        return frame if bound is None else _truncated(frame, units, bound, truncation_key(seed, position))

    frame = private(plan.private_input, _derived_scan(spark, info), 1)
    for position, joined in enumerate(info.joins, start=2):
        if joined.public:
            # Public and small (`lookup_table` reads it whole and checks its keys): broadcast to every task.
            other = f.broadcast(_to_spark(spark, lookup_table(joined)))
        else:
            other = private(joined.info.name, _derived_scan(spark, joined.info), position)
        frame = frame.join(other, on=list(joined.on), how=joined.how)
    return frame


def _derived_scan(spark: SparkSession, info: InputInfo) -> DataFrame:
    derived = [(name, row_filter(text, f"derive.{name}")) for name, text in info.reading.derive.items()]
    frame = _scan(spark, info)
    return _with_row_expressions(frame, derived, None, set(frame.columns), info.schema)


def _with_row_expressions(frame: DataFrame, derived: list[tuple[str, pl.Expr]], predicate: pl.Expr | None,
                          keep: set[str], schema: Mapping[str, pl.DataType]) -> DataFrame:
    """The frame with the derived columns added in order, then the filter applied, computed by
    Polars on the executors (`mapInArrow`) from the very expressions `row_expressions` checked:
    Spark never parses a spec's text in its own SQL dialect, which reads some texts otherwise
    (a backslash in quotes, for one). The expressions are row-wise, so a batch of rows gives
    what its rows would alone. Only the columns the expressions read and `keep` cross over.
    `schema`: the Polars types of the frame's columns and the derived ones (from validation)."""
    if not derived and predicate is None:
        return frame
    from pyspark.sql.pandas.types import to_arrow_schema

    expressions = [expression.alias(name) for name, expression in derived]
    read = {root for e in [*expressions, *([predicate] if predicate is not None else [])]
            for root in e.meta.root_names()}
    made = [name for name, _ in derived]
    inputs = [c for c in frame.columns if c in keep | read and c not in made]
    out = _spark_schema({name: schema[name] for name in [*inputs, *made]})
    target = to_arrow_schema(out)
    steps = [e.meta.serialize() for e in expressions]
    condition = None if predicate is None else predicate.meta.serialize()

    def apply(batches: Iterator[Any]) -> Iterator[Any]:
        # Runs on an executor: only Polars and pyarrow are imported there, never dprun.
        import io

        import polars

        columns = [polars.Expr.deserialize(io.BytesIO(step)) for step in steps]
        keep_rows = None if condition is None else polars.Expr.deserialize(io.BytesIO(condition))
        for batch in batches:
            rows = polars.DataFrame(polars.from_arrow(batch))
            for column in columns:
                rows = rows.with_columns(column)
            if keep_rows is not None:
                rows = rows.filter(keep_rows)
            yield from rows.select(target.names).to_arrow().cast(target).to_batches()

    return frame.select(*_cols(inputs)).mapInArrow(apply, out)


def _truncated(frame: DataFrame, units: list[str], bound: int, seed: int) -> DataFrame:
    """Each privacy unit's rows cut to `bound`: the smallest keyed hash of the whole row first, then
    the row's values, a total order, so every task attempt keeps the same rows. Rows without a
    privacy unit are dropped."""
    from pyspark.sql import Window

    f = F()
    columns = list(frame.columns)
    frame = frame.filter(reduce(lambda a, b: a & b, [_col(c).isNotNull() for c in units]))
    window = Window.partitionBy(*_cols(units)).orderBy(f.col(HASH), *[_col(c).asc_nulls_first() for c in columns])
    ranked = frame.withColumn(HASH, _keyed_hash(seed, columns)).withColumn(RANK, f.row_number().over(window))
    return ranked.filter(f.col(RANK) <= bound).drop(HASH, RANK)


def _units(quantity: Quantity, c: str) -> Column:
    """A row's value in integer units of the quantity: clamped, centred, rounded (half to even), clipped."""
    f = F()
    assert quantity.lower is not None and quantity.upper is not None
    value = _col(c)
    clamped = f.least(f.greatest(value, f.lit(float(quantity.lower))), f.lit(float(quantity.upper)))
    centred = clamped - f.lit(float(quantity.center))
    if quantity.aggregate == "centered_sumsq":
        centred = centred * centred
    scaled = f.bround(centred * f.lit(math.ldexp(1.0, -quantity.unit_exponent)), 0)
    low = 0 if quantity.aggregate == "centered_sumsq" else -quantity.max_units
    clipped = f.least(f.greatest(scaled, f.lit(float(low))), f.lit(float(quantity.max_units))).cast("long")
    # greatest/least skip nulls in Spark; a missing value must stay missing (Polars' clip keeps null).
    return f.when(value.isNull(), f.lit(None).cast("long")).otherwise(clipped)


def _quantity_column(position: int) -> str:
    # Quantity ids contain '.', '[' and spaces; Spark columns get plain names.
    return f"__dprun_q{position}__"


def _partials(rows: DataFrame, plan: QueryPlan, keys: list[str]) -> DataFrame:
    """One row per (unit, partition): each quantity's partial, bounded to max_rows rows' worth."""
    f = F()
    m = f.lit(plan.max_rows).cast("long")
    aggregations = []
    for position, noisy in enumerate(plan.quantities):
        q = noisy.quantity
        if q.aggregate == "privacy_units" or q.is_quantile:
            continue
        present = f.count(_col(q.column)) if q.column is not None else f.count(f.lit(1))
        kept = f.least(present, m)
        name = _quantity_column(position)
        if q.aggregate == "rows":
            aggregations.append(kept.cast("long").alias(name))
            continue
        assert q.column is not None
        total = f.sum(_units(q, q.column).cast(EXACT))
        # floor(total · kept / present) stays within ±kept · max_units, so L∞ = m · max_units holds.
        scaled = _floor_div(total * kept.cast(EXACT), present.cast(EXACT))
        aggregations.append(f.when(present > 0, scaled).otherwise(f.lit(0).cast(EXACT)).cast(EXACT).alias(name))
    # The pair's rows, which rank a unit's partitions in the cross-partition bounding.
    aggregations.append(f.count(f.lit(1)).alias(PAIR_ROWS))
    # One shuffle by unit serves both this group-by and the per-unit window of the cross-partition
    # bounding (the cached partials keep the partitioning): 4x faster on the Plume benchmark than
    # a shuffle for each. Hash partitioning is deterministic, so a retried task gets the same rows.
    by_unit = rows.repartition(*_cols(plan.privacy_unit))
    return by_unit.groupBy(*_cols([*plan.privacy_unit, *keys])).agg(*aggregations)


def _chosen_partitions(plan: QueryPlan, bounded: DataFrame, keys: list[str], key_schema: dict[str, Any],
                       source: RandomSource) -> pl.DataFrame:
    """The keys private partition selection keeps, drawn on the driver in key order, as the Polars
    engine draws them; the driver holds a chunk of candidates at a time and the keys kept, never every
    candidate (10^8 of them do not fit in a driver)."""
    counts, schema = _unit_counts(bounded, plan, keys, key_schema)
    return release_steps.chosen_in_key_order(plan, _in_key_order(counts, schema, keys), source)


def _unit_counts(bounded: DataFrame, plan: QueryPlan, keys: list[str], key_schema: dict[str, Any]
                 ) -> tuple[DataFrame, dict[str, Any]]:
    """col : (partition keys, privacy units after the first bounding (one row per kept pair in `bounded`)
    [, for a weighted selection, the sum of their weights w(partitions each unit keeps)]), and its Polars
    schema."""
    from pyspark.sql import Window

    f = F()
    schema = {**key_schema, UNITS: pl.Int64}
    if not release_steps.weighs_units(plan):
        return bounded.groupBy(*_cols(keys)).agg(f.count(f.lit(1)).alias(UNITS)), schema
    # The pairs a unit keeps after the first bounding: all of them, up to L0.
    kept = f.least(f.col(UNIT_PAIRS), f.lit(plan.max_partitions).cast("long"))
    weighed = bounded.withColumn(SELECTION_WEIGHTS, _unit_weight(kept))
    counts = weighed.groupBy(*_cols(keys)).agg(f.count(f.lit(1)).alias(UNITS),
                                               f.sum(SELECTION_WEIGHTS).alias(SELECTION_WEIGHTS))
    return counts, {**schema, SELECTION_WEIGHTS: pl.Int64}


def _in_key_order(frame: DataFrame, schema: dict[str, Any], keys: list[str]) -> Iterator[pl.DataFrame]:
    """The rows of `frame` on the driver in `release_steps.key_order`, as consecutive Polars frames of
    the given types: collected whole and sorted by the driver when they are few, else sorted by Spark
    and brought a partition at a time, so that the driver never holds more than a chunk of them."""
    frame = frame.persist(_storage_level())
    try:
        rows = frame.count()
        if rows <= WHOLE_CANDIDATES:
            whole = _collect(frame, schema)
            yield whole.sort(release_steps.key_order(whole.select(keys).schema), nulls_last=True)
        else:
            yield from _sorted_batches(frame, keys, schema, -(-rows // FETCH_ROWS))
    finally:
        frame.unpersist()


def _sorted_batches(frame: DataFrame, keys: list[str], schema: dict[str, Any], partitions: int
                    ) -> Iterator[pl.DataFrame]:
    """`frame` sorted by `keys` (nulls last, as `release_steps.key_order`) into `partitions` ranges,
    brought to the driver one range at a time (`toLocalIterator`), as Polars frames of the given types,
    the first empty.

    The number of ranges is set, not left to adaptive execution, which would join them up to its
    advisory size and beyond what the driver may collect in one job (spark.driver.maxResultSize).
    Each Arrow batch crosses as one binary value (Arrow IPC) made on the executors: a Row per
    candidate would cost the driver 2.3 µs each to unpickle, five times the Arrow transfer.
    """
    import pyarrow

    def packed(batches: Iterator[Any]) -> Iterator[Any]:
        # Runs on an executor: only pyarrow is imported there, never dprun.
        import pyarrow

        for batch in batches:
            sink = pyarrow.BufferOutputStream()
            with pyarrow.ipc.new_stream(sink, batch.schema) as writer:
                writer.write_batch(batch)
            ipc = pyarrow.array([sink.getvalue().to_pybytes()], pyarrow.binary())
            yield pyarrow.RecordBatch.from_arrays([ipc], [IPC])

    yield pl.DataFrame(schema=schema)
    order = [_col(k).asc_nulls_last() for k in keys]
    ordered = frame.repartitionByRange(partitions, *order).sortWithinPartitions(*order)
    for row in ordered.mapInArrow(packed, f"{IPC} binary").toLocalIterator(prefetchPartitions=True):
        batch = pl.from_arrow(pyarrow.ipc.open_stream(row[0]).read_all())
        assert isinstance(batch, pl.DataFrame)
        yield batch.select(_cast(batch, name, dtype) for name, dtype in schema.items())


def _unit_weight(partitions: Column) -> Column:
    """`selection.unit_weights` in Spark: floor(2^B / √n) from the double square root, then made exact
    by the same integer checks (w² · n ≤ 2^2B < (w + 1)² · n)."""
    f = F()
    one = 1 << (2 * selection.SELECTION_WEIGHT_BITS)
    n = partitions.cast("long")
    guess = f.floor(f.lit(float(1 << selection.SELECTION_WEIGHT_BITS)) / f.sqrt(n.cast("double"))).cast("long")
    lowered = f.when(guess * guess * n > one, guess - 1).otherwise(guess)
    return f.when((lowered + 1) * (lowered + 1) * n <= one, lowered + 1).otherwise(lowered)


def _floor_div(numerator: Column, denominator: Column) -> Column:
    """floor(a / b) for exact integers a and b > 0 (Polars' `//`; Spark's `div` truncates toward 0)."""
    f = F()
    exact = numerator - f.pmod(numerator, denominator)
    return (exact.cast(EXACT) / denominator).cast(EXACT)


def _keyed_hash(seed: int, columns: list[str]) -> Column:
    """xxhash64 of (secret, columns): the run's 64-bit secret is hashed first, so every later
    input is mixed into a state that depends on it. Null keys are hashed as flags (Spark's
    hash skips nulls), so (a, null) and (null, a) differ."""
    f = F()
    signed = seed - (1 << 64) if seed >= 1 << 63 else seed
    flags = [_col(c).isNull() for c in columns]
    return f.xxhash64(f.lit(signed).cast("long"), *_cols(columns), *flags)


def _ranked(partials: DataFrame, plan: QueryPlan, keys: list[str], seed: int) -> DataFrame:
    """The partials with each pair's RANK among its unit's pairs (most rows first, ties by the smallest
    keyed hash of (unit, partition), then the keys, as the sorted path orders them) and the unit's
    number of pairs (UNIT_PAIRS), from one sort of each unit's pairs.

    Which partitions a unit keeps depends only on its own rows and the run's secret key:
    the order (rows, hash, then keys) is total, so the choice is the same in every task attempt
    and for every partitioning of the data. Spark sorts each unit's rows in the window and
    spills to disk when a unit has many partitions.
    """
    from pyspark.sql import Window

    f = F()
    window = _pair_order(plan, keys)
    # Same partitioning and order as `window`: Spark computes both in the one sort.
    whole = window.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    return (partials.withColumn(HASH, _keyed_hash(seed, [*plan.privacy_unit, *keys]))
            .withColumn(RANK, f.row_number().over(window)).withColumn(UNIT_PAIRS, f.count(f.lit(1)).over(whole)))


def _pair_order(plan: QueryPlan, keys: list[str]) -> Any:
    """Each unit's pairs, most rows first, then by keyed hash, then by keys: a total order."""
    from pyspark.sql import Window

    f = F()
    return Window.partitionBy(*_cols(plan.privacy_unit)).orderBy(f.col(PAIR_ROWS).desc(), f.col(HASH),
                                                                 *[_col(k).asc_nulls_first() for k in keys])


def _within_l0(ranked: DataFrame, plan: QueryPlan) -> DataFrame:
    """The cross-partition bounding: each unit's L0 first pairs of `_ranked`."""
    return ranked.filter(F().col(RANK) <= plan.max_partitions)


def _second_bounding(ranked: DataFrame, chosen: DataFrame, plan: QueryPlan, keys: list[str]) -> DataFrame:
    """Plume's second bounding: each unit's L0 first pairs among those in the chosen partitions.

    A unit with at most L0 pairs keeps all of its chosen ones, as the first bounding kept them all:
    only the heavier units' chosen pairs are ranked again, so only they are sorted a second time.
    """
    f = F()
    light = _semi(ranked.filter(f.col(UNIT_PAIRS) <= plan.max_partitions), chosen, keys)
    heavy = _semi(ranked.filter(f.col(UNIT_PAIRS) > plan.max_partitions), chosen, keys)
    reranked = heavy.withColumn(RANK, f.row_number().over(_pair_order(plan, keys)))
    return light.unionByName(_within_l0(reranked, plan))


def _partition_sums(bounded: DataFrame, plan: QueryPlan, keys: list[str], key_schema: dict[str, Any]
                    ) -> tuple[DataFrame, dict[str, Any], dict[str, str]]:
    """col : (partition keys, units, exact Int128 sum per quantity), its Polars schema, and the quantity
    id of each sum's column (Spark's columns have plain names)."""
    f = F()
    aggregations = [f.count(f.lit(1)).alias(UNITS)]
    schema: dict[str, Any] = {**key_schema, UNITS: pl.Int64}
    names = {}
    for position, noisy in enumerate(plan.quantities):
        q = noisy.quantity
        if q.is_quantile:
            continue
        name = _quantity_column(position)
        names[name] = q.id
        column = f.count(f.lit(1)) if q.aggregate == "privacy_units" else f.sum(f.col(name).cast(EXACT))
        aggregations.append(column.cast(EXACT).alias(name))
        schema[name] = pl.Int128
    return bounded.groupBy(*_cols(keys)).agg(*aggregations), schema, names


def _leaf_weights(rows: DataFrame, quantity: Quantity, plan: QueryPlan, keys: list[str]) -> DataFrame:
    """col : (unit, partition keys, leaf, weight): a unit's values in a partition weigh min(n, m)/n each."""
    from pyspark.sql import Window

    f = F()
    assert quantity.column is not None
    pair = [*plan.privacy_unit, *keys]
    value = _col(quantity.column)
    leaf = _leaf(quantity, value)
    leaves = rows.select(*_cols(pair), f.when(value.isNull(), f.lit(None).cast("long")).otherwise(leaf).alias(LEAF))
    per_leaf = leaves.filter(f.col(LEAF).isNotNull()).groupBy(*_cols(pair), f.col(LEAF)).agg(
        f.count(f.lit(1)).alias(COUNT))
    present = f.sum(f.col(COUNT)).over(Window.partitionBy(*_cols(pair)))
    # quantile_tree.unit_weight_expr: floor(min(n, m)·2**W / n); n > 0 here, so `div` is floor.
    weight = (f.least(f.col(PRESENT), f.lit(plan.max_rows).cast("long"))
              * f.lit(1 << WEIGHT_BITS).cast("long")).cast("long")
    with_present = per_leaf.withColumn(PRESENT, present.cast("long"))
    unit_weight = _int_div(weight, f.col(PRESENT))
    return with_present.select(*_cols(pair), f.col(LEAF), (f.col(COUNT) * unit_weight).cast("long").alias(WEIGHT))


def _leaf(quantity: Quantity, value: Column) -> Column:
    """`release_steps.leaf_expr` operation for operation (float64 clip, shift, scale or divide, floor, clip)."""
    f = F()
    assert quantity.lower is not None and quantity.upper is not None
    clamped = f.least(f.greatest(value, f.lit(float(quantity.lower))), f.lit(float(quantity.upper)))
    if quantity.aggregate == "quantile_candidates":
        grid = release_steps.candidate_grid(quantity)
        position = (clamped - f.lit(float(grid.lower))) / f.lit(float(grid.step))
        below = f.floor(position).cast("double")
        slot = f.when(position == below, below * 2).otherwise(below * 2 + 1).cast("long")
        return f.least(f.greatest(slot, f.lit(0).cast("long")), f.lit(grid.slots - 1).cast("long"))
    shape = release_steps.tree_shape(quantity)
    scaled = (clamped - f.lit(float(shape.lower))) * f.lit(float(shape._scale))
    return f.least(f.greatest(f.floor(scaled).cast("long"), f.lit(0).cast("long")),
                   f.lit(shape.leaves - 1).cast("long"))


def _int_div(numerator: Column, denominator: Column) -> Column:
    """Integral division of longs (exact; for non-negative operands it is floor)."""
    f = F()
    return ((numerator - f.pmod(numerator, denominator)).cast(EXACT) / denominator.cast(EXACT)).cast("long")


def _quantiles(
    spark: SparkSession, noisy: NoisyQuantity, plan: QueryPlan, rows: DataFrame, bounded: DataFrame,
    partitions: pl.DataFrame, keys: list[str], source: RandomSource,
) -> dict[float, np.ndarray]:
    """Every level asked of one quantile quantity (a tree or candidates) for `partitions`, answered on the
    driver from their leaves only."""
    f = F()
    quantity = noisy.quantity
    pair = [*plan.privacy_unit, *keys]
    # col : (partition keys, leaf, weight) of the (unit, partition) pairs that survived bounding
    weights = _semi(_leaf_weights(rows, quantity, plan, keys), bounded.select(*_cols(pair)), pair)
    weights = _semi(weights, _to_spark(spark, partitions), keys)
    per_leaf = weights.groupBy(*_cols(keys), f.col(LEAF)).agg(f.sum(f.col(WEIGHT).cast(EXACT)).cast(EXACT).alias(WEIGHT))
    key_schema = dict(partitions.schema)
    leaf_weights = _collect(per_leaf, {**key_schema, LEAF: pl.Int64, WEIGHT: pl.Int128})
    indexed = partitions.with_row_index(PARTITION).with_columns(pl.col(PARTITION).cast(pl.Int64))
    table = leaf_weights.join(indexed, on=keys, how="inner", nulls_equal=True).select(
        pl.col(PARTITION).alias("partition"), pl.col(LEAF).alias("leaf"), pl.col(WEIGHT).alias("weight"))
    return release_steps.answer_quantile(noisy, plan, table, partitions.height, source)


# --- reading and moving data ------------------------------------------------------------


def _scan(spark: SparkSession, info: InputInfo) -> DataFrame:
    """The input with the schema fixed at validation time (CSV/NDJSON: from the header and the spec)."""
    frame = _scan_files(spark, info)
    for name in info.partitions:
        # Spark's partition discovery (below the input's own folder, `basePath`) reads them as text.
        frame = frame.withColumn(name, _col(name).cast(_spark_type(info.schema[name])))
    return frame


def _scan_files(spark: SparkSession, info: InputInfo) -> DataFrame:
    """The input's files (a URL's: Spark finds them, `SparkInputReader`), with their partition folders' columns."""
    paths = [info.url] if info.url is not None else [str(p) for p in info.paths]
    schema = {name: dtype for name, dtype in info.schema.items()
              if name not in info.reading.derive and name not in info.partitions}
    base = info.url_base if info.url is not None else info.partition_root
    reader = spark.read if base is None else spark.read.option("basePath", str(base))
    if info.format == "parquet":
        return reader.parquet(*paths)
    if info.format == "csv":
        # Floats are read as text and cast: Spark's CSV parser rejects "inf", which Polars reads.
        floats = {name for name, dtype in schema.items() if dtype in (pl.Float32, pl.Float64)}
        text = {name: (pl.String if name in floats else dtype) for name, dtype in schema.items()}
        reading = _csv_options(info.reading)
        frame = (reader.schema(_spark_schema(text)).options(**reading).option("mode", "FAILFAST")
                 .option("enforceSchema", not info.reading.has_header).csv(paths))
        for name in floats:
            kind = "float" if schema[name] == pl.Float32 else "double"
            frame = frame.withColumn(name, _col(name).cast(kind))
        return frame.select(*[_col(name).alias(name) for name in [*schema, *info.partitions]])
    return reader.schema(_spark_schema(schema)).option("mode", "FAILFAST").json(paths)


class SparkInputReader:
    """`input_schema.SparkInputs` for `--engine spark`: an input named by a URL (`s3a://`, `gs://`,
    `abfss://`, `hdfs://`, `dbfs:/`, `file://`, …) is listed and its schema read by Spark, on the
    cluster's file systems with the cluster's connectors and credentials; nothing is read on this
    machine. The schema comes from declarations only, as `input_schema.read_schema`'s: a Parquet
    footer (Spark reads one), a CSV header (every column text, no type inference), an NDJSON
    input's `columns`; partition folders' columns are text unless `columns` types them."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def locate(self, declared: InputSpec) -> Located | str:
        url = declared.path
        problem = url_problem(url)
        if problem is not None and url_scheme(url) == "file":
            return problem
        base = _glob_base(url)
        reader = self.spark.read if base is None else self.spark.read.option("basePath", base)
        try:
            listing = _listing(reader, url)
        except Exception as exc:
            if not _is_spark_error(exc):
                raise
            return (f"Spark cannot list '{url}' ({_spark_failure(exc)}); is the URL right, and does Spark have the "
                    "file system's connector and credentials?")
        files = tuple(name for name, _, _ in listing)
        if not files:
            return f"no file matches '{url}' (listed by Spark)"
        fmt = input_format(url, declared.format) or files_format(PurePosixPath(_url_path(f)) for f in files)
        if fmt is None:
            return FORMAT_UNKNOWN
        root = PurePosixPath(_url_path(base or url.rstrip("/")))
        in_folder = _is_folder(files, url, base)
        partitions = partition_columns((PurePosixPath(_url_path(f)) for f in files), root) if in_folder else ()
        if partitions is None:
            return partitions_differ(url)
        return Located(fmt, partitions, url=url, url_base=base, listing=listing)

    def file_schema(self, located: Located, declared: InputSpec, value_columns: frozenset[str]
                    ) -> dict[str, pl.DataType] | str:
        assert located.url is not None
        types = declared.column_types()
        if located.fmt == "ndjson":
            return {name: COLUMN_TYPES[kind.type] for name, kind in types.items() if name not in located.partitions}
        reader = self.spark.read.option("recursiveFileLookup", "true")  # the files' own columns only
        try:
            if located.fmt == "parquet":
                fields = reader.parquet(located.url).schema.fields
            else:
                fields = reader.options(**_csv_options(declared)).csv(located.url).schema.fields
        except Exception as exc:
            if not _is_spark_error(exc):
                raise
            return (f"Spark cannot read the {located.fmt} schema ({_spark_failure(exc)}); is the file a valid "
                    f"{located.fmt} file, and do its reading options fit it?")
        if located.fmt == "csv":
            found: dict[str, pl.DataType] = {
                f.name: pl.Float64() if f.name in value_columns else pl.String() for f in fields}
        else:
            found = {}
            for field in fields:
                dtype = _polars_type(field.dataType)
                if dtype is None:
                    return (f"column '{field.name}' has a type the Spark engine does not read "
                            f"({field.dataType.simpleString()})")
                found[field.name] = dtype
        return found | {name: COLUMN_TYPES[kind.type] for name, kind in types.items() if name in found}


def _listing(reader: Any, url: str) -> tuple[tuple[str, int, int], ...]:
    """The files Spark reads for `url` (marker files skipped, as for any file source), sorted, with their
    sizes and modification times in ms: the `binaryFile` source's listing, its content column never
    read, so one job over the cluster's file listing, not a request per file from here."""
    f = F()
    files = reader.format("binaryFile").load(url).select(
        "path", "length", f.unix_millis(f.col("modificationTime")))
    return tuple(sorted((row[0], int(row[1]), int(row[2])) for row in files.collect()))


def _glob_base(url: str) -> str | None:
    """A glob URL's folder up to its first wildcard (Spark's `basePath` for its partition folders), else None."""
    if not glob.has_magic(url):
        return None
    head = url[:min(url.index(c) for c in "*?[" if c in url)]
    return head[:head.rindex("/")] if "/" in head else head


def _is_folder(files: tuple[str, ...], url: str, base: str | None) -> bool:
    """Whether the URL names a folder or a glob (a single file has no partition folders of its own)."""
    return base is not None or len(files) > 1 or _url_path(files[0]).rstrip("/") != _url_path(url).rstrip("/")


def _url_path(url: str) -> str:
    """The path of a URL as Hadoop writes paths (`file:/data/…`, `s3a://bucket/…`), kept as written: a
    partition folder's name is percent-decoded once, by `partition_values`."""
    return url_parts(url)[1] if url_scheme(url) else url


def _polars_type(spark_type: Any) -> pl.DataType | None:
    """The Polars type the engines work with for a Spark column type, or None where there is none."""
    from pyspark.sql import types as T

    simple: dict[type, pl.DataType] = {
        T.BooleanType: pl.Boolean(), T.ByteType: pl.Int8(), T.ShortType: pl.Int16(), T.IntegerType: pl.Int32(),
        T.LongType: pl.Int64(), T.FloatType: pl.Float32(), T.DoubleType: pl.Float64(), T.StringType: pl.String(),
        T.DateType: pl.Date(), T.TimestampNTZType: pl.Datetime("us"), T.TimestampType: pl.Datetime("us", "UTC"),
    }
    if isinstance(spark_type, T.DecimalType):
        return pl.Decimal(spark_type.precision, spark_type.scale)
    return simple.get(type(spark_type))


def _csv_options(declared: InputSpec) -> dict[str, str]:
    """An input's CSV reading options in Spark's words (`refuse_unreadable` has checked them)."""
    options = {"header": str(declared.has_header).lower(), "sep": declared.separator,
               # No quote character: Spark takes the NUL character to mean none.
               "quote": declared.quote_char if declared.quote_char is not None else "\u0000",
               "escape": declared.quote_char or "\\"}
    if declared.null_values:
        options["nullValue"] = declared.null_values[0]
    if declared.comment_prefix:
        options["comment"] = declared.comment_prefix
    return options


def _spark_failure(exc: BaseException) -> str:
    """A Spark failure's kind, its Java exception's class and its error condition, never its message
    (which can quote values or paths)."""
    condition = _condition(exc)
    java = None
    with suppress(Exception):  # no Java exception, or the JVM is gone
        java = str(exc.java_exception.getClass().getSimpleName())  # type: ignore[attr-defined]
    return type(exc).__name__ + (f": {java}" if java else "") + (f": {condition}" if condition else "")


def files_with_bad_values(info: InputInfo, spark: SparkSession) -> list[Path]:
    """The files of a CSV or NDJSON input in which Spark finds a row it cannot read as the schema says
    (a malformed row, or a typed, numeric or Boolean column's text that does not convert), in the
    input's order; [] for Parquet. A search on the executors, after Spark failed on a value: the
    driver then looks for the line in these files only (`strict_rows.check_rows`), never in all."""
    if info.format == "parquet" or not info.paths:
        return []  # a URL's files are not on this machine: the run's own failure is what is said
    f = F()
    typed = {name: _spark_type(dtype) for name, dtype in info.schema.items()
             if name not in info.reading.derive and name not in info.partitions
             and (dtype.is_numeric() or dtype == pl.Boolean)}
    text = {name: pl.String for name, dtype in info.schema.items()
            if name not in info.reading.derive and name not in info.partitions}
    reader = spark.read.schema(_spark_schema(text).add(CORRUPT, "string")).option("mode", "PERMISSIVE") \
        .option("columnNameOfCorruptRecord", CORRUPT)
    if info.format == "csv":
        rows = reader.options(**_csv_options(info.reading)).option("enforceSchema", not info.reading.has_header) \
            .csv([str(p) for p in info.paths])
    else:
        rows = reader.json([str(p) for p in info.paths])
    bad = reduce(lambda a, b: a | b, [_col(name).isNotNull() & _try_cast(_col(name), kind).isNull()
                                      for name, kind in typed.items()], f.col(CORRUPT).isNotNull())
    try:
        found = {_local_file(row[0]) for row in rows.where(bad).select(f.input_file_name()).distinct().collect()}
    except Exception as exc:
        if not _is_spark_error(exc):
            raise
        return []  # the search failed too: the run's own failure is what is said
    return [path for path in info.paths if path.resolve() in found]


def _try_cast(column: Column, kind: Any) -> Column:
    """The value as `kind`, null where it does not convert (pyspark < 4: a cast, which does that
    unless ANSI mode is on)."""
    return column.try_cast(kind) if hasattr(column, "try_cast") else column.cast(kind)


def _local_file(uri: str) -> Path:
    """A file of this machine from the URI Spark names it by."""
    return local_path(uri, Path("/")).resolve() if url_scheme(uri) else Path(uri).resolve()


def refuse_unreadable(info: InputInfo) -> None:
    """Stop, before Spark starts, if the input's reading options are ones Spark cannot follow as Polars does."""
    reading = info.reading
    refused = [what for what, found in (
        ("more than one null value", len(reading.null_values) > 1),
        ("a comment prefix of more than one character", len(reading.comment_prefix or "") > 1),
        ("date or datetime columns", any(k.type in ("date", "datetime") for k in reading.column_types().values())),
        ("utf8-lossy encoding", reading.encoding == "utf8-lossy"),
    ) if found]
    if refused:
        raise DprunError(f"--engine spark cannot read input '{info.name}' as its spec says ({', '.join(refused)}); "
                         "run it with the Polars engine")


def _spark_type(dtype: Any) -> Any:
    from pyspark.sql import types as T

    simple = {
        pl.Boolean: T.BooleanType(), pl.Int8: T.ByteType(), pl.Int16: T.ShortType(), pl.Int32: T.IntegerType(),
        pl.Int64: T.LongType(), pl.UInt8: T.ShortType(), pl.UInt16: T.IntegerType(), pl.UInt32: T.LongType(),
        pl.UInt64: T.DecimalType(20, 0), pl.Int128: T.DecimalType(38, 0), pl.Float32: T.FloatType(),
        pl.Float64: T.DoubleType(), pl.String: T.StringType(), pl.Categorical: T.StringType(),
        pl.Date: T.DateType(), pl.Null: T.StringType(),
    }
    for polars_type, spark_type in simple.items():
        if dtype == polars_type:
            return spark_type
    if isinstance(dtype, pl.Enum):
        return T.StringType()
    if isinstance(dtype, pl.Datetime):
        return T.TimestampNTZType() if dtype.time_zone is None else T.TimestampType()
    if isinstance(dtype, pl.Decimal) and dtype.precision is not None and dtype.precision <= 38:
        return T.DecimalType(dtype.precision, dtype.scale or 0)
    raise DataError(f"the Spark engine does not support columns of type {dtype}")


def _spark_schema(schema: Mapping[str, Any]) -> Any:
    from pyspark.sql import types as T

    return T.StructType([T.StructField(name, _spark_type(dtype), True) for name, dtype in schema.items()])


def _to_spark(spark: SparkSession, frame: pl.DataFrame) -> DataFrame:
    """A small driver-side table (partition keys) as a Spark DataFrame, typed like the input."""
    schema = _spark_schema(frame.schema)
    portable = frame.with_columns(_portable(pl.col(name), dtype) for name, dtype in frame.schema.items())
    try:
        return spark.createDataFrame(portable.to_arrow(), schema=schema)
    except (TypeError, ValueError):  # pyspark < 4 takes no Arrow table
        rows = [tuple(Decimal(v) if isinstance(v, int) and isinstance(field.dataType, _decimal_type()) else v
                      for v, field in zip(row, schema.fields, strict=True)) for row in portable.rows()]
        return spark.createDataFrame(rows, schema=schema)


def _decimal_type() -> type:
    from pyspark.sql import types as T

    return T.DecimalType


def _portable(column: pl.Expr, dtype: Any) -> pl.Expr:
    """Polars types Arrow hands to Spark as the Spark type `_spark_type` names."""
    widen: dict[pl.DataType | type[pl.DataType], pl.DataType | type[pl.DataType]] = {pl.UInt8: pl.Int16, pl.UInt16: pl.Int32, pl.UInt32: pl.Int64, pl.UInt64: pl.Decimal(20, 0),
             pl.Int128: pl.Decimal(38, 0), pl.Categorical: pl.String, pl.Null: pl.String}
    for polars_type, target in widen.items():
        if dtype == polars_type:
            return column.cast(target)
    if isinstance(dtype, pl.Enum):
        return column.cast(pl.String)
    return column


def _collect(frame: DataFrame, schema: Mapping[str, Any]) -> pl.DataFrame:
    """Run `frame` and bring it to the driver ONCE, as Polars columns of the given types."""
    if hasattr(frame, "toArrow"):
        collected = pl.from_arrow(frame.toArrow())
        assert isinstance(collected, pl.DataFrame)
    else:  # pyspark < 4
        rows = frame.collect()
        collected = pl.DataFrame(
            {name: [int(r[i]) if isinstance(r[i], Decimal) else r[i] for r in rows] for i, name in enumerate(frame.columns)},
            schema={name: _python_dtype(dtype) for name, dtype in schema.items()}, strict=False,
        )
    return collected.select(_cast(collected, name, dtype) for name, dtype in schema.items())


def _python_dtype(dtype: Any) -> Any:
    return pl.Int128 if dtype == pl.Int128 else dtype


def _cast(frame: pl.DataFrame, name: str, dtype: Any) -> pl.Expr:
    column = pl.col(name)
    current = frame.schema[name]
    if isinstance(dtype, pl.Datetime) and isinstance(current, pl.Datetime):
        if current.time_zone is not None:
            # Spark's instants come back in the session time zone (UTC); Polars' naive times are UTC wall time.
            column = column.dt.convert_time_zone(dtype.time_zone or "UTC")
            if dtype.time_zone is None:
                column = column.dt.replace_time_zone(None)
        return column.cast(dtype).alias(name)
    return column.cast(dtype, strict=True).alias(name)


def _semi(frame: DataFrame, right: DataFrame, keys: list[str]) -> DataFrame:
    """Rows of `frame` whose keys occur in `right` (null equals null, as Polars' nulls_equal)."""
    f = F()
    renamed = right.select(*[_col(k).alias(RIGHT.format(i)) for i, k in enumerate(keys)])
    condition = reduce(lambda a, b: a & b, [_col(k).eqNullSafe(f.col(RIGHT.format(i))) for i, k in enumerate(keys)])
    return frame.join(renamed, on=condition, how="left_semi")


def _key_schema(plan: QueryPlan, info: InputInfo, keys: list[str]) -> dict[str, Any]:
    """Polars types of the partition keys as the Polars engine has them (a numeric or Boolean value
    column becomes Float64, `polars_engine._as_value`)."""
    if not plan.group_by:
        return {GLOBAL_KEY: pl.Int8}
    values = {q.quantity.column for q in plan.quantities if q.quantity.column is not None}
    schema = info.joined_schema

    def numeric(key: str) -> bool:
        return schema[key].is_numeric() or schema[key] == pl.Boolean

    return {k: pl.Float64 if k in values and numeric(k) else schema[k] for k in keys}


def _storage_level() -> Any:
    from pyspark import StorageLevel

    return StorageLevel.MEMORY_AND_DISK


def _sql(name: str) -> str:
    """A column's exact name quoted for a SQL expression dprun writes itself (never a spec's text)."""
    return "`" + name.replace("`", "``") + "`"


def _col(name: str) -> Column:
    """A column by its exact name (dots, spaces and backticks are not parsed)."""
    return F().col(_sql(name))


def _cols(names: Iterable[str]) -> list[Column]:
    return [_col(n) for n in names]


def F() -> Any:
    """pyspark.sql.functions, imported when the engine runs (pyspark is optional)."""
    from pyspark.sql import functions

    return functions


@contextmanager
def _spark_errors() -> Iterator[None]:
    """Spark's failures become DataError.

    Spark's messages can quote data values, so only the exception's kind and Spark's error
    condition (an identifier such as CAST_INVALID_INPUT) are passed on.
    """
    try:
        yield
    except Exception as exc:
        if not _is_spark_error(exc):
            raise
        if isinstance(exc, ImportError):
            raise SparkUnavailable(f"a package Spark needs is missing ({type(exc).__name__}): {INSTALL_HINT}") from None
        limit = DRIVER_GONE if _driver_gone(exc) else _driver_limit(exc)
        if limit is not None:
            raise SparkDriverLimit(f"Spark could not run the query: {limit}; nothing was published") from None
        condition = _condition(exc)
        kind = type(exc).__name__ + (f": {condition}" if condition else "")
        raise DataError(f"Spark could not run the query ({kind}); check the input files, the filter and "
                        "the column types. Spark's log (--conf spark.log.level=WARN) has the details; it can "
                        "quote data values") from None


def _driver_limit(exc: BaseException) -> str | None:
    """What to raise where the failure is one of DRIVER_LIMITS (found in its text and its Java cause's),
    else None."""
    text = str(exc)
    try:
        text += str(getattr(exc, "java_exception", ""))
    except Exception:  # noqa: BLE001 - the JVM is gone: its message is not needed
        pass
    return next((advice for phrase, advice in DRIVER_LIMITS if phrase in text), None)


def _driver_gone(exc: BaseException) -> bool:
    """The driver's JVM no longer answers this process (it exited, most often out of memory)."""
    from py4j.protocol import Py4JNetworkError

    return isinstance(exc, ConnectionError | Py4JNetworkError)


def _is_spark_error(exc: BaseException) -> bool:
    try:
        from pyspark.errors import PySparkException
    except ImportError:  # pragma: no cover - pyspark < 3.4
        pass
    else:
        if isinstance(exc, PySparkException):
            return True
    try:
        from py4j.protocol import Py4JError
    except ImportError:
        return False
    return isinstance(exc, Py4JError | ConnectionError)


def _condition(exc: BaseException) -> str | None:
    """Spark's error condition, e.g. FAILED_READ_FILE.FILE_NOT_EXIST: a name, never a data value.

    Looked up on the Python exception, else down the Java cause chain (py4j), where the
    innermost condition is the most specific.
    """
    found = _call_condition(exc)
    if found:
        return found
    java = getattr(exc, "java_exception", None)
    for _ in range(8):
        if java is None:
            break
        found = _call_condition(java) or found
        try:
            java = java.getCause()
        except Exception:  # noqa: BLE001 - py4j failed: keep what was found
            break
    return found


def _call_condition(error: Any) -> str | None:
    for method in ("getCondition", "getErrorClass"):
        try:
            value = getattr(error, method)()
        except Exception:  # noqa: BLE001, S112 - not a Spark exception with this method
            continue
        if value:
            return _identifier(value)
    return None


def _identifier(value: Any) -> str | None:
    text = str(value)
    return text if re.fullmatch(r"[A-Z0-9_.]{1,120}", text) else None

"""The Spark engine runs the Polars engine's plan step for step (dprun.engines.spark_engine).

(a) Parity: with a test seed and every unit within its L0 partitions, `engine="spark"` and
    the Polars engine release identical tables (same rows, same types, same float bits), for
    every example spec in specs/ (on in-bounds data with the sample data's schema) and for
    generated specs covering CSV/NDJSON/Parquet inputs, null/NaN/infinite values, rows above
    m per partition (the min(n, m)/n scaling, negative centred sums), every selection
    mechanism, second bounding on and off, and quantiles by both methods.
(b) Heavy units (more partitions than L0): both engines agree with the truth within the
    noise, and release exactly the listed public partitions.
(c) Determinism of bounding: the bounded pre-noise aggregates and the kept (unit, partition)
    pairs are identical across runs with the same seed, across shuffle partitionings and
    input splits, and across a forced task retry.

One SparkSession (local[2], at most 2 attempts per task) for the whole module. Skipped when
pyspark or Java 17+ is missing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import polars as pl
import pytest

pytest.importorskip("pyspark", reason="the Spark engine needs pyspark: pip install 'dprun[spark]'")

from dprun import api
from dprun.engines import polars_engine, release_steps, spark_engine
from dprun.errors import DataError, DprunError, SpecError
from dprun.mechanisms import bound_choice
from dprun.mechanisms.sampling import RandomSource

try:
    spark_engine._require_java()
except spark_engine.SparkUnavailable as exc:  # pragma: no cover - depends on the machine
    pytest.skip(f"the Spark engine needs Java 17+: {exc.message}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261122
SHUFFLE_PARTITIONS = "3"


@pytest.fixture(scope="module")
def spark() -> Any:
    session = spark_engine.spark_session("local[2,2]", conf={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": SHUFFLE_PARTITIONS,
        "spark.default.parallelism": "2",
        "spark.driver.memory": "1g",
        # Tiny data: adaptive execution's extra stage-by-stage jobs only add latency here.
        "spark.sql.adaptive.enabled": "false",
        # The JVM's optimising compiler (C2) and its parallel collector took a third of its CPU time
        # here, compiling code that runs on a few thousand rows: C1 alone and the serial collector
        # take ~35 of ~185 CPU-seconds off this module (its wall time +15 s, on one core of two).
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    })
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(autouse=True)
def _no_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DPRUN_LEDGER", raising=False)


def run_both(spec: Path, spark: Any, seed: int = SEED) -> tuple[dict[str, pl.DataFrame], dict[str, pl.DataFrame]]:
    """The tables of `spec` from the Polars engine and from the Spark engine, same test seed."""
    polars_tables = api.run(spec, seed=seed, overwrite=True).tables
    spark_tables = api.run(spec, seed=seed, overwrite=True, engine="spark",
                           spark_options={"master": "local[2,2]"}).tables
    return polars_tables, spark_tables


def assert_identical(expected: dict[str, pl.DataFrame], actual: dict[str, pl.DataFrame]) -> None:
    assert expected.keys() == actual.keys()
    for name, a in expected.items():
        b = actual[name]
        assert a.schema == b.schema, f"{name}: {a.schema} != {b.schema}"
        assert a.height == b.height, f"{name}: {a.height} != {b.height} rows"
        assert a.equals(b), f"{name}:\npolars\n{a}\nspark\n{b}"


# --- (a) parity ---------------------------------------------------------------------------


def in_bounds_visits(rng: np.random.Generator, visitors: int = 10000) -> pl.DataFrame:
    """Visits with the sample data's schema, within every example spec's bounds.

    Each visitor goes to one restaurant (r01..r14, r14 not in the public list; r01..r04 get
    70% of the visitors, so that private selection keeps some partitions and drops others),
    once or twice, on different days of one week (so different weekdays). Spends include
    nulls and values outside the bounds (clipping is part of the compared arithmetic).
    """
    popularity = np.r_[np.full(4, 0.7 / 4), np.full(10, 0.3 / 10)]
    rows: dict[str, list[Any]] = {k: [] for k in ("visitor_id", "restaurant_id", "day", "weekday", "spend_eur")}
    weekdays = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"]
    for v in range(visitors):
        restaurant = f"r{rng.choice(14, p=popularity) + 1:02d}"
        week = int(rng.integers(0, 4))
        for offset in rng.choice(7, size=int(rng.integers(1, 3)), replace=False):
            day = 1 + 7 * week + int(offset)
            rows["visitor_id"].append(f"v{v:06d}")
            rows["restaurant_id"].append(restaurant)
            rows["day"].append(f"2026-10-{day:02d}")
            rows["weekday"].append(weekdays[(day - 1) % 7])
            spend = round(float(rng.gamma(4.0, 7.0)), 2) if rng.random() > 0.03 else None
            rows["spend_eur"].append(spend)
    frame = pl.DataFrame(rows, schema={"visitor_id": pl.String, "restaurant_id": pl.String, "day": pl.String,
                                       "weekday": pl.String, "spend_eur": pl.Float64})
    return frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**31)))


@pytest.fixture(scope="module")
def example_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """specs/ and an in-bounds sample_data/ side by side, so the specs' relative paths hold."""
    root = tmp_path_factory.mktemp("examples")
    shutil.copytree(ROOT / "specs", root / "specs")
    (root / "sample_data").mkdir()
    shutil.copy(ROOT / "sample_data" / "restaurants.csv", root / "sample_data" / "restaurants.csv")
    # One profile per visitor: within `max_rows_per_unit: {visitors: 1}`, so no engine's choice matters.
    pl.read_csv(ROOT / "sample_data" / "visitors.csv").unique("visitor_id", keep="first", maintain_order=True) \
        .write_csv(root / "sample_data" / "visitors.csv")
    visits = in_bounds_visits(np.random.default_rng(SEED))
    visits.write_csv(root / "sample_data" / "visits.csv")
    visits.write_parquet(root / "sample_data" / "visits.parquet")
    return root


@pytest.mark.parametrize("spec_name", sorted(p.name for p in (ROOT / "specs").glob("*.yaml")))
def test_spark_and_polars_release_identical_tables_for_the_example_specs(
    spec_name: str, example_copy: Path, spark: Any
) -> None:
    spec = example_copy / "specs" / spec_name
    expected, actual = run_both(spec, spark)
    assert all(table.height > 0 for table in expected.values())
    assert_identical(expected, actual)


def mixed_data(rng: np.random.Generator, units: int = 1500) -> pl.DataFrame:
    """Units in at most 3 partitions each (L0 = 3 below), up to 8 rows per partition (m = 3)."""
    rows: dict[str, list[Any]] = {"uid": [], "g": [], "h": [], "x": []}
    labels = ["a", "b", "c", "d.e", None]
    for u in range(units):
        for g in rng.choice(12, size=int(rng.integers(1, 4)), replace=False):
            h = labels[int(rng.integers(0, len(labels)))]
            for _ in range(int(rng.integers(1, 9))):
                rows["uid"].append(u)
                rows["g"].append(int(g))
                rows["h"].append(h)
                r = rng.random()
                x = (None if r < 0.02 else math.nan if r < 0.04 else math.inf if r < 0.05 else -math.inf if r < 0.06
                     else float(rng.normal(30.0, 25.0)))
                rows["x"].append(x)
    frame = pl.DataFrame(rows, schema={"uid": pl.Int64, "g": pl.Int32, "h": pl.String, "x": pl.Float64})
    frame = frame.with_columns(d=(pl.date(2026, 1, 1) + pl.duration(days=pl.col("g") % 3)))
    return frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**31)))


def mixed_spec(folder: Path) -> Path:
    def q(name: str, source: str, group_by: list[str], metrics: list[dict[str, Any]],
          partitions: dict[str, Any] | None = None, filter: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "name": name, "input": source, "group_by": group_by,
            "contribution_bounds": {"max_partitions_contributed": 3, "max_contributions_per_partition": 3},
            "metrics": metrics, "output": {"path": f"out/{name}.parquet"},
        }
        if partitions is not None:
            body["partitions"] = partitions
        if filter is not None:
            body["filter"] = filter
        return body

    x = {"column": "x", "bounds": [-10, 70]}
    stats = [{"name": "n", "kind": "count"}, {"name": "units", "kind": "privacy_id_count"},
             {"name": "total", "kind": "sum", **x}, {"name": "avg", "kind": "mean", **x},
             {"name": "var", "kind": "variance", **x}, {"name": "sd", "kind": "stddev", **x}]
    tree = [{"name": "med", "kind": "median", **x}, {"name": "qs", "kind": "quantile", "q": [0.1, 0.9], **x},
            {"name": "lo", "kind": "min", **x}, {"name": "hi", "kind": "max", **x}]
    queries = [
        q("public_parquet", "p", ["g"], stats, {"public": list(range(14))}),
        q("global_csv", "c", [], [*stats[:3], {**tree[0], "quantile_method": "candidates"}], filter="g < 10"),
        q("tg_no_second", "p", ["g", "h"], [stats[0], *({**m, "quantile_method": "tree"} for m in tree)],
          {"selection": "truncated_geometric", "second_bounding": False}),
        q("released_count", "j", ["h"], stats[:4], {"selection": "released_count"}),
        q("laplace_threshold", "c", ["g"], stats[:4], {"selection": "laplace_threshold", "min_privacy_units": 3}),
        q("gaussian_threshold", "j", ["h", "g"], [stats[1], {**stats[3], "noise": "gaussian"}],
          {"selection": "gaussian_threshold"}),
        # Date keys (Parquet), a key that is also the summed column, and a query left with no rows.
        q("date_and_value_keys", "p", ["d", "g"], [stats[0], {"name": "gsum", "kind": "sum", "column": "g",
                                                             "bounds": [0, 20]}], {"selection": "auto"}),
        q("empty", "c", ["g"], [stats[0], tree[0]], {"selection": "laplace_threshold"}, filter="x > 1000000 and x < 2000000"),
    ]
    spec = {
        "version": 1, "name": "mixed", "privacy_unit": "uid",
        "budget": {"epsilon": 30.0, "delta": 1e-4, "accounting": "basic"},
        "inputs": {"p": {"path": "data.parquet"}, "c": {"path": "data.csv", "columns": {"uid": "int64", "g": "int64"}},
                   "j": {"path": "data.ndjson", "columns": {"uid": "int64", "g": "int64", "h": "string", "x": "float64"}}},
        "queries": queries, "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def test_identical_tables_on_every_input_format_selection_mechanism_and_quantiles(
    tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = mixed_data(np.random.default_rng(SEED + 1))
    data.write_parquet(tmp_path / "data.parquet")
    data.write_csv(tmp_path / "data.csv")  # NaN and ±inf as text
    data.write_ndjson(tmp_path / "data.ndjson")  # NaN and ±inf become null
    # Candidates (and released_count's sums) come to Spark's driver in key order, 32 at a time (nulls
    # among them); the empty query's are collected whole. Both engines draw 7 at a time.
    monkeypatch.setattr(release_steps, "DRAW_CHUNK", 7)
    monkeypatch.setattr(spark_engine, "WHOLE_CANDIDATES", 4)
    monkeypatch.setattr(spark_engine, "FETCH_ROWS", 32)
    streamed = []
    stream = spark_engine._sorted_batches
    monkeypatch.setattr(spark_engine, "_sorted_batches",
                        lambda *args: streamed.append(args[1]) or stream(*args))  # type: ignore[func-returns-value]
    expected, actual = run_both(mixed_spec(tmp_path), spark)
    assert sorted(streamed) == [["d", "g"], ["g"], ["g", "h"], ["h"], ["h", "g"]]
    assert min(table.height for name, table in expected.items() if name != "empty") > 0
    assert expected["empty"].height == 0
    assert_identical(expected, actual)


def test_a_hive_partitioned_folder_read_through_a_file_url_groups_by_its_partition_columns(
    tmp_path: Path, spark: Any
) -> None:
    """Spark's layout: part files in `day=…/city=…` folders (a value with an escaped `/`, Hive's null
    folder), a marker file, the folder named by a file:// URL; `day` typed by the spec, `city` text."""
    data = mixed_data(np.random.default_rng(SEED + 2), units=600)
    folder = tmp_path / "visits"
    for day, city in [(0, "a%2Fb"), (0, "__HIVE_DEFAULT_PARTITION__"), (1, "a%2Fb"), (2, "c d")]:
        (folder / f"day={day}" / f"city={city}").mkdir(parents=True)
        part = data.filter(pl.col("g") % 4 == day + (city == "c d")).select("uid", "x")
        part.write_parquet(folder / f"day={day}" / f"city={city}" / "part-00000.parquet")
    (folder / "_SUCCESS").write_text("")
    spec = {
        "version": 1, "name": "hive", "privacy_unit": "uid", "budget": {"epsilon": 20.0, "delta": 1e-5},
        "inputs": {"v": {"path": f"file://{folder}/", "columns": {"day": "int64"}}},
        "queries": [{"name": "q", "input": "v", "group_by": ["day", "city"], "filter": "day < 2",
                     # Every unit within L0 partitions: both engines keep the same pairs (see the module's notes).
                     "contribution_bounds": {"max_partitions_contributed": 4, "max_contributions_per_partition": 3},
                     "partitions": {"selection": "laplace_threshold"},
                     "metrics": [{"name": "n", "kind": "count"}, {"name": "s", "kind": "sum", "column": "x",
                                                                  "bounds": [-10, 70]}],
                     "output": {"path": "out/q.parquet"}}],
        "report": "out/report.json",
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    # The Spark engine lists the URL's files and reads their schema through Spark; Polars, on this machine.
    here, listed = api.validate(tmp_path / "spec.json"), api.validate(tmp_path / "spec.json", "spark")
    assert listed.inputs["v"].paths == () and listed.inputs["v"].url == f"file://{folder}/"
    assert listed.inputs["v"].schema == here.inputs["v"].schema
    assert listed.inputs["v"].partitions == here.inputs["v"].partitions == ("day", "city")
    expected, actual = run_both(tmp_path / "spec.json", spark)
    assert expected["q"].select("day", "city").sort("day", "city", nulls_last=True).rows() == [
        (0, "a/b"), (0, None), (1, "a/b")]
    assert expected["q"].schema["day"] == pl.Int64 and expected["q"].schema["city"] == pl.String
    assert_identical(expected, actual)


def test_the_files_spark_lists_are_fingerprinted_by_name_size_and_time(tmp_path: Path, spark: Any) -> None:
    """A CSV glob URL listed by Spark, marker files skipped; the ledger's fingerprints change with a file."""
    from dprun.report import input_fingerprints

    (tmp_path / "parts").mkdir()
    for part in range(2):
        mixed_data(np.random.default_rng(SEED + part), units=50).select("uid", "x").write_csv(
            tmp_path / "parts" / f"part-{part}.csv")
    (tmp_path / "parts" / "_SUCCESS").write_text("")
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "version": 1, "name": "listed", "privacy_unit": "uid", "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"v": {"path": f"file://{tmp_path}/parts/part-*.csv", "columns": {"uid": "int64"}}},
        "queries": [{"name": "q", "input": "v", "metrics": [{"name": "n", "kind": "count"}],
                     "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                     "output": {"path": "out/q.csv"}}],
        "report": "out/report.json"}))
    before = input_fingerprints(api.validate(spec, "spark").inputs)
    assert [Path(urlsplit(f["path"]).path).name for f in before] == ["part-0.csv", "part-1.csv"]
    assert [f["bytes"] for f in before] == [(tmp_path / "parts" / f"part-{i}.csv").stat().st_size for i in range(2)]
    os.utime(tmp_path / "parts" / "part-1.csv", ns=(0, 0))
    after = input_fingerprints(api.validate(spec, "spark").inputs)
    assert [f["sha256"] for f in after][0] == before[0]["sha256"] and after[1]["sha256"] != before[1]["sha256"]


def test_a_url_spark_cannot_list_or_a_public_input_by_url_is_a_located_spec_error(tmp_path: Path, spark: Any) -> None:
    """No S3 connector here: Spark's own failure, by its kind only; a public lookup is read on this machine."""
    (tmp_path / "shops.csv").write_text("shop,city\ns1,Paris\n")
    spec = tmp_path / "spec.yaml"
    document = {
        "version": 1, "name": "urls", "privacy_unit": "uid", "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"v": {"path": "s3a://no-such-bucket-4711/visits/", "format": "parquet"},
                   "shops": {"path": "gs://bucket/shops.csv", "public": True}},
        "queries": [{"name": "q", "input": "v", "metrics": [{"name": "n", "kind": "count"}],
                     "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                     "output": {"path": "out/q.csv"}}],
        "report": "out/report.json"}
    spec.write_text(json.dumps(document))
    with pytest.raises(SpecError) as caught:
        api.validate(spec, "spark")
    messages = {p.field: p.message for p in caught.value.problems()}
    assert messages["inputs.v.path"].startswith("Spark cannot list 's3a://no-such-bucket-4711/visits/' (")
    assert "connector and credentials" in messages["inputs.v.path"]
    assert messages["inputs.shops.path"].startswith("a public input is read whole on this machine")
    with pytest.raises(SpecError) as refused:
        api.validate(spec)
    assert "the Spark engine reads it through Spark" in refused.value.problems()[0].message


def test_a_join_with_a_public_lookup_releases_the_same_table(tmp_path: Path, spark: Any) -> None:
    from test_joins import write  # noqa: PLC0415 - the join test's spec, with a key the lookup lacks

    # `left` keeps the rows whose key the lookup lacks (a null city); `inner` is the same join call.
    spec = write(tmp_path, {"join": ["visits", "shops"], "on": "shop", "how": "left"},
                 partitions={"selection": "laplace_threshold"})
    expected, actual = run_both(spec, spark)
    assert expected["q"]["city"].null_count() == 1
    assert_identical(expected, actual)


def test_auto_bounds_are_chosen_from_the_same_histogram_on_both_engines(tmp_path: Path, spark: Any) -> None:
    """Every unit's pairs have the same rows, so the pair each engine's hash picks does not change
    the contribution histogram (the partitions' pick counts do change: their bins may differ); the
    value histogram (a sum and a mean with `bounds: auto`) is the same integer for integer; the
    bounds chosen, (4, 16) and the value bounds, and the tables released are the same."""
    from test_auto_bounds import AUTO, VALUES, write_spec  # noqa: PLC0415 - the auto bounds test's data and spec

    spec = write_spec(tmp_path, AUTO, public=False, metrics=VALUES[:3])
    validated = api.validate(spec)
    plan = api.plan(validated).queries[0]
    info = validated.query_inputs["q"]
    on_polars = polars_engine.contribution_profile(plan, info, RandomSource.from_seed(SEED), tmp_path)
    on_spark = spark_engine.contribution_profile(plan, info, RandomSource.from_seed(SEED), spark)
    assert on_polars.cells.tolist() == on_spark.cells.tolist()
    assert on_polars.values.shape == (1, bound_choice.VALUE_CELLS) and on_polars.values.sum() > 0
    assert on_polars.values.tolist() == on_spark.values.tolist()
    assert on_polars.sizes.sum() == on_spark.sizes.sum() == 12
    # The units' kept shares at every candidate (L0, L∞) and row cap, floor divisions included.
    assert on_polars.kept_pairs.tolist() == on_spark.kept_pairs.tolist()
    assert on_polars.kept_rows.tolist() == on_spark.kept_rows.tolist()
    assert 0 < on_polars.kept_rows.min() < on_polars.kept_rows.max()
    expected, actual = run_both(spec, spark)
    assert_identical(expected, actual)


def test_a_join_of_private_inputs_cuts_each_side_as_the_polars_engine_does(tmp_path: Path, spark: Any) -> None:
    from test_private_joins import chained, join, write  # noqa: PLC0415 - the private join test's data and specs

    # Light users are within the bounds: the same table. The heavy person (50 users rows, 20
    # events) keeps 2 × 5 rows on both engines, in two of their countries (each engine's keyed
    # hash chooses which).
    expected, actual = run_both(write(tmp_path, join(2, 5), heavy=True), spark)
    light = ["c00", "c01", "c02"]
    for table in (expected["q"], actual["q"]):
        assert table.filter(pl.col("country").is_in(light))["events"].to_list() == [10, 20, 30]
        assert sorted(table.filter(~pl.col("country").is_in(light))["events"].to_list())[-3:] == [0, 5, 5]
    # A lookup joined on a column the private join added, each input on its own columns: the same table.
    (tmp_path / "chained").mkdir()
    expected, actual = run_both(chained(tmp_path / "chained"), spark)
    assert expected["q"]["events"].to_list() == [30, 30]
    assert_identical(expected, actual)


# --- (b) heavy units ----------------------------------------------------------------------

KEYS = 20
HEAVY = 40
L0 = 2


def heavy_data(rng: np.random.Generator, light: int = 3000) -> pl.DataFrame:
    """Light units: one row in one key (0..KEYS-2). Heavy units: 6 rows in every key but the last.

    Key KEYS-1 is public but holds no data.
    """
    light_keys = rng.integers(0, KEYS - 1, size=light)
    uids = [*range(light), *np.repeat(np.arange(light, light + HEAVY), (KEYS - 1) * 6)]
    keys = [*light_keys.tolist(), *np.tile(np.repeat(np.arange(KEYS - 1), 6), HEAVY).tolist()]
    frame = pl.DataFrame({"uid": uids, "key": keys}, schema={"uid": pl.Int64, "key": pl.Int64})
    frame = frame.with_columns(value=pl.lit(1.0))
    return frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**31)))


def heavy_spec(folder: Path, data: pl.DataFrame) -> Path:
    """The data split over 4 Parquet files (several input tasks); public keys 0..KEYS-1."""
    (folder / "data").mkdir()
    for i, part in enumerate(data.iter_slices(math.ceil(data.height / 4))):
        part.write_parquet(folder / "data" / f"part-{i}.parquet")
    spec = {
        "version": 1, "name": "heavy", "privacy_unit": "uid",
        "budget": {"epsilon": 2.0, "delta": 0.0, "accounting": "basic"},
        "inputs": {"d": {"path": "data/*.parquet"}},
        "queries": [{
            "name": "per_key", "input": "d", "group_by": ["key"],
            "partitions": {"public": list(range(KEYS))},
            "contribution_bounds": {"max_partitions_contributed": L0, "max_contributions_per_partition": 1},
            "metrics": [{"name": "rows", "kind": "count"}, {"name": "units", "kind": "privacy_id_count"}],
            "output": {"path": "out/per_key.parquet"},
        }],
        "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


@pytest.fixture(scope="module")
def heavy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pl.DataFrame]:
    folder = tmp_path_factory.mktemp("heavy")
    data = heavy_data(np.random.default_rng(SEED + 2))
    return heavy_spec(folder, data), data


def noise_bound(noise: Any, p: float) -> float:
    """|noise| < this with probability ≥ 1 − p (discrete Laplace tail 2e^{-k/t}; one grid unit of rounding)."""
    assert noise.kind == "laplace"
    return math.ldexp(math.ceil(noise.parameter * math.log(2.0 / p)) + 1, noise.grid_exponent)


def test_heavy_units_are_bounded_and_both_engines_agree_with_the_truth(
    heavy: tuple[Path, pl.DataFrame], spark: Any
) -> None:
    spec, data = heavy
    plan = api.plan(api.validate(spec)).queries[0]
    light = (data.filter(pl.col("uid") < 3000).group_by("key").len()
             .join(pl.DataFrame({"key": range(KEYS)}), on="key", how="right").fill_null(0).sort("key"))
    light_rows = light["len"].to_numpy()
    seed = int.from_bytes(os.urandom(6), "big")
    expected, actual = run_both(spec, spark, seed)
    for engine, table in (("polars", expected["per_key"]), ("spark", actual["per_key"])):
        assert table["key"].to_list() == list(range(KEYS)), f"{engine}: the public partitions, exactly"
        for metric in ("rows", "units"):
            (quantity_id,) = next(m.quantity_ids for m in plan.metrics if m.name == metric)
            noise = plan.quantity(quantity_id).noise
            bound = noise_bound(noise, 1e-9)
            released = table[metric].to_numpy()
            # Each partition holds its light units plus 0..HEAVY bounded heavy units (one row each).
            assert np.all(released >= light_rows - bound), f"seed={seed} {engine} {metric}: {released}"
            assert np.all(released <= light_rows + HEAVY + bound), f"seed={seed} {engine} {metric}: {released}"
            # In all, exactly HEAVY·L0 heavy contributions survive bounding (not HEAVY·(KEYS-1)·6).
            total_bound = 6.0 * noise.std * math.sqrt(KEYS)
            excess = released.sum() - light_rows.sum() - HEAVY * L0
            assert abs(excess) <= total_bound, f"seed={seed} {engine} {metric}: {excess} vs {total_bound}"
    # The empty public key gets noise only.
    assert abs(actual["per_key"]["rows"][KEYS - 1]) <= noise_bound(plan.quantities[0].noise, 1e-9)


# --- (c) determinism of the keyed-hash choice ---------------------------------------------


def kept_pairs(spark: Any, spec: Path, seed: int) -> pl.DataFrame:
    """(unit, key) pairs kept by the first cross-partition bounding, collected (NOT private: tests only)."""
    validated = api.validate(spec)
    plan = api.plan(validated).queries[0]
    info = validated.query_inputs[plan.name]
    hash_key = RandomSource.from_seed(seed).hash_seeds()[0]
    rows = spark_engine._rows(spark, plan, info, ["key"], hash_key)
    bounded = spark_engine._within_l0(spark_engine._ranked(spark_engine._partials(rows, plan, ["key"]), plan, ["key"],
                                                           hash_key), plan)
    return spark_engine._collect(bounded.select("uid", "key"), {"uid": pl.Int64, "key": pl.Int64}).sort("uid", "key")


def test_the_second_bounding_ranks_the_chosen_pairs_of_heavy_units_again(
    heavy: tuple[Path, pl.DataFrame], spark: Any
) -> None:
    """Only units with more than L0 pairs are ranked again (`_second_bounding`): the pairs kept are those
    of ranking every unit's chosen pairs from scratch, and differ from the first bounding's chosen ones."""
    spec, _ = heavy
    validated = api.validate(spec)
    plan = api.plan(validated).queries[0]
    hash_key = RandomSource.from_seed(5).hash_seeds()[0]
    partials = spark_engine._partials(spark_engine._rows(spark, plan, validated.query_inputs[plan.name], ["key"],
                                                         hash_key), plan, ["key"])
    chosen = spark_engine._to_spark(spark, pl.DataFrame({"key": list(range(0, KEYS, 2))}))
    ranked = spark_engine._ranked(partials, plan, ["key"], hash_key)

    def pairs(frame: Any) -> pl.DataFrame:
        return spark_engine._collect(frame.select("uid", "key"), {"uid": pl.Int64, "key": pl.Int64}).sort("uid", "key")

    again = pairs(spark_engine._second_bounding(ranked, chosen, plan, ["key"]))
    from_scratch = spark_engine._ranked(spark_engine._semi(partials, chosen, ["key"]), plan, ["key"], hash_key)
    assert again.equals(pairs(spark_engine._within_l0(from_scratch, plan)))
    first = pairs(spark_engine._semi(spark_engine._within_l0(ranked, plan), chosen, ["key"]))
    assert again.group_by("uid").len()["len"].max() == L0 and first.height < again.height


def exact(spark: Any, spec: Path, seed: int) -> pl.DataFrame:
    validated = api.validate(spec)
    plan = api.plan(validated).queries[0]
    return spark_engine.exact_sums(plan, validated.query_inputs[plan.name], RandomSource.from_seed(seed), spark)


def test_bounding_is_the_same_for_every_partitioning_and_every_run(
    heavy: tuple[Path, pl.DataFrame], spark: Any
) -> None:
    spec, data = heavy
    first_uid_heavy = data["uid"].max() - HEAVY + 1
    pairs = kept_pairs(spark, spec, 1)
    per_unit = pairs.group_by("uid").len()
    assert per_unit["len"].max() == L0
    assert per_unit.filter(pl.col("uid") >= first_uid_heavy)["len"].to_list() == [L0] * HEAVY
    sums = exact(spark, spec, 1)
    assert sums["__dprun_units__"].sum() == pairs.height
    try:
        for partitions, split, adaptive in (("1", str(64 * 1024), "false"), ("7", "134217728", "true")):
            spark.conf.set("spark.sql.shuffle.partitions", partitions)
            spark.conf.set("spark.sql.files.maxPartitionBytes", split)
            spark.conf.set("spark.sql.adaptive.enabled", adaptive)
            assert kept_pairs(spark, spec, 1).equals(pairs)
            assert exact(spark, spec, 1).equals(sums)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", SHUFFLE_PARTITIONS)
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.set("spark.sql.adaptive.enabled", "false")
    # The choice is keyed: another run's secret picks other partitions for the heavy units.
    other = kept_pairs(spark, spec, 2)
    assert other.group_by("uid").len()["len"].max() == L0
    assert not other.equals(pairs)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")
def test_a_retried_task_keeps_the_same_rows(
    heavy: tuple[Path, pl.DataFrame], spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail the first attempt of one bounding task after it read its shuffle input; Spark retries it."""
    spec, _ = heavy
    expected = exact(spark, spec, 3)
    marker = str(tmp_path / "failed-once")
    bound = spark_engine._within_l0

    def failing_once(uid: int) -> bool:
        from pyspark import TaskContext

        if TaskContext.get().attemptNumber() == 0 and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected task failure")
        return True

    def bound_with_a_failure(ranked: Any, *args: Any) -> Any:
        from pyspark.sql import functions as F

        bounded = bound(ranked, *args)
        # A Python UDF that keeps every row, applied to the bounding stage's output: its task dies
        # once, after the window ran on its shuffle input, and Spark runs it again (local[2,2]).
        return bounded.filter(F.udf(failing_once, "boolean")(F.col("uid")))

    monkeypatch.setattr(spark_engine, "_within_l0", bound_with_a_failure)
    retried = exact(spark, spec, 3)
    assert os.path.exists(marker), "no task failed: the test did not exercise a retry"
    assert retried.equals(expected)


# --- errors -------------------------------------------------------------------------------


def test_missing_pyspark_or_java_gives_the_install_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyspark", None)
    with pytest.raises(spark_engine.SparkUnavailable, match=r"install dprun\[spark\]; Spark needs Java 17\+"):
        spark_engine.spark_session("local[1]")
    monkeypatch.undo()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(spark_engine.SparkUnavailable, match=r"Java.*install dprun\[spark\]; Spark needs Java 17\+"):
        spark_engine.spark_session("local[1]")
    assert spark_engine.java_major_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert spark_engine.java_major_version('java version "1.8.0_392"') == 8


@pytest.mark.parametrize(("java_text", "setting"), [
    ("Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Total size of serialized "
     "results of 1 tasks (46.8 MiB) is bigger than spark.driver.maxResultSize (1024.0 KiB)",
     "--conf spark.driver.maxResultSize=4g"),
    ("Caused by: java.lang.OutOfMemoryError: Java heap space", "raise spark.driver.memory"),
])
def test_a_driver_limit_says_which_setting_to_raise_and_no_more(java_text: str, setting: str) -> None:
    """Spark's own text (as a local[1] session with spark.driver.maxResultSize=1m gives it for a 47 MiB
    toArrow) is searched, never shown: the answer names the setting, exit 2, and no input is read again."""
    from py4j.protocol import Py4JError

    failure = Py4JError(f"An error occurred while calling o42.collectAsArrowToPython.\nsecret-4711\n{java_text}")
    with pytest.raises(spark_engine.SparkDriverLimit) as caught, spark_engine._spark_errors():
        raise failure
    assert setting in caught.value.message and caught.value.exit_code == 2
    assert "secret-4711" not in caught.value.message and "MiB" not in caught.value.message
    with pytest.raises(DataError, match="check the input files"), spark_engine._spark_errors():
        raise Py4JError("An error occurred: secret-4711")


@pytest.mark.parametrize("gone", ["ConnectionRefusedError", "Py4JNetworkError"])
def test_a_driver_jvm_that_stops_answering_is_named_with_its_memory_setting(gone: str) -> None:
    """What py4j raises once the driver's JVM has died (out of memory, at 10^7 candidates collected
    whole in a local[*] session of 1 GB) is neither bad data nor an unreadable input file."""
    from py4j.protocol import Py4JNetworkError

    failure = ConnectionRefusedError(111, "Connection refused") if gone == "ConnectionRefusedError" else \
        Py4JNetworkError("Error while sending or receiving")
    with pytest.raises(spark_engine.SparkDriverLimit) as caught, spark_engine._spark_errors():
        raise failure
    assert "stopped answering" in caught.value.message and "spark.driver.memory" in caught.value.message
    assert caught.value.exit_code == 2


def test_a_bad_value_fails_the_run_without_showing_the_value(
    tmp_path: Path, spark: Any, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the rows Polars infers the schema from, one value of one of three files does not parse:
    exit 3, and no trace of it. The executors find the file; the driver reads that file only."""
    values = [f"{i / 4}" for i in range(4500)]
    values[4200] = "secret-4711"
    data = pl.DataFrame({"uid": range(4500), "x": values})
    for part in range(3):
        data.slice(part * 1500, 1500).write_csv(tmp_path / f"data-{part}.csv")
    spec = {
        "version": 1, "name": "bad", "privacy_unit": "uid", "budget": {"epsilon": 1.0, "delta": 0.0},
        "inputs": {"d": {"path": "data-*.csv"}},
        "queries": [{"name": "q", "input": "d",
                     "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
                     "metrics": [{"name": "s", "kind": "sum", "column": "x", "bounds": [0, 10]}],
                     "output": {"path": "out/q.parquet"}}],
        "report": "out/report.json",
    }
    (tmp_path / "spec.yaml").write_text(json.dumps(spec))
    read: list[Any] = []
    check = api.check_rows
    monkeypatch.setattr(api, "check_rows", lambda info, limit=None, **options: read.append(
        (options.get("paths"), options.get("every_value"))) or check(info, limit, **options))
    with pytest.raises(DataError) as failure:
        api.run(tmp_path / "spec.yaml", seed=1, engine="spark", spark_options={"master": "local[2,2]"})
    assert failure.value.exit_code == 3
    # Spark stops at the value (CAST_INVALID_INPUT); dprun then finds its file, line and column.
    assert "data-2.csv: line 1202: column 'x' does not parse as float64" in failure.value.message
    assert [paths for paths, every_value in read if every_value] == [[tmp_path / "data-2.csv"]]
    captured = capfd.readouterr()
    assert "secret-4711" not in failure.value.message + captured.out + captured.err
    assert not (tmp_path / "out").exists()


def reading_spec(folder: Path, reading: dict[str, Any]) -> Path:
    spec = {
        "version": 1, "name": "reading", "privacy_unit": "uid", "budget": {"epsilon": 1.0, "delta": 0.0},
        "inputs": {"d": {"path": "data.csv", **reading}},
        "queries": [{"name": "q", "input": "d", "group_by": ["g"], "partitions": {"public": ["a", "b"]},
                     "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 2},
                     "metrics": [{"name": "n", "kind": "count"},
                                 {"name": "s", "kind": "sum", "column": "x", "bounds": [0, 10]}],
                     "output": {"path": "out/q.parquet"}}],
        "report": "out/report.json",
    }
    (folder / "spec.yaml").write_text(json.dumps(spec))
    return folder / "spec.yaml"


def test_csv_reading_options_give_the_same_release_on_both_engines(tmp_path: Path, spark: Any) -> None:
    lines = ["# made by a test", "uid;g;x"] + [f"{i};{'ab'[i % 2]};{'NA' if i % 7 == 0 else i % 11}" for i in range(400)]
    (tmp_path / "data.csv").write_text("\n".join(lines) + "\n")
    spec = reading_spec(tmp_path, {"separator": ";", "null_values": ["NA"], "comment_prefix": "#",
                                   "columns": {"uid": "int64", "x": "float64"}, "derive": {"half": "x / 2"}})
    document = json.loads(spec.read_text())
    document["queries"][0]["derive"] = {"parity": "uid % 2"}
    document["queries"][0]["filter"] = "parity = 0"
    document["queries"][0]["metrics"].append({"name": "h", "kind": "sum", "column": "half", "bounds": [0, 5]})
    # A count of a text column counts its non-null values (#41): never cast to a number.
    document["queries"][0]["metrics"].append({"name": "texts", "kind": "count", "column": "g"})
    spec.write_text(json.dumps(document))
    polars_tables, spark_tables = run_both(spec, spark)
    assert_identical(polars_tables, spark_tables)


# Polars reads a backslash in quotes as itself, Spark SQL as an escape: handed the text, Spark saw a
# window function behind what Polars checked as two string comparisons.
HIDDEN_WINDOW = "s = '\\' or s = ' or (count(*) over (partition by k) >= 50) --'"


@pytest.mark.parametrize("where", ["query", "input"])
def test_spark_runs_the_checked_expression_not_its_own_reading_of_the_text(tmp_path: Path, spark: Any,
                                                                            where: str) -> None:
    """D: 49 units in partition a; D': 50. The derived column is false on every row for Polars, so
    both engines release the same noisy 0 on both datasets (the window made it 50 on Spark, for D')."""
    assert HIDDEN_WINDOW.count("\\") == 1  # one backslash character
    spec = reading_spec(tmp_path, {"derive": {"big": HIDDEN_WINDOW}} if where == "input" else {})
    document = json.loads(spec.read_text())
    query = document["queries"][0]
    query.update({"filter": "big", "group_by": ["k"], "partitions": {"public": ["a"]},
                  "metrics": [{"name": "n", "kind": "count"}]})
    if where == "query":
        query["derive"] = {"big": HIDDEN_WINDOW}
    spec.write_text(json.dumps(document))
    counts = []
    for units in (49, 50):
        (tmp_path / "data.csv").write_text("uid,k,s\n" + "".join(f"u{i},a,x\n" for i in range(units)))
        polars_tables, spark_tables = run_both(spec, spark)
        assert_identical(polars_tables, spark_tables)
        counts.append(spark_tables["q"]["n"].item())
    assert abs(counts[1] - counts[0]) <= 1, f"one unit moved the count from {counts[0]} to {counts[1]}"


def test_reading_options_spark_cannot_follow_are_refused_before_spark_starts(tmp_path: Path) -> None:
    (tmp_path / "data.csv").write_text("uid,g,x\n1,a,NA\n2,b,-\n3,a,4\n")
    spec = reading_spec(tmp_path, {"null_values": ["NA", "-"]})
    with pytest.raises(DprunError, match=r"--engine spark cannot read input 'd' as its spec says \(more than one "
                                         r"null value\); run it with the Polars engine"):
        api.run(spec, seed=1, engine="spark", spark_options={"master": "local[1]"})


@pytest.mark.skipif(not os.environ.get("DPRUN_TEST_SPARK_REMOTE"),
                    reason="set DPRUN_TEST_SPARK_REMOTE=sc://host:15002 to test against a Spark Connect server "
                           "(needs pip install 'pyspark[connect]')")
def test_spark_connect_releases_the_same_tables(example_copy: Path, tmp_path: Path) -> None:
    """The engine uses the DataFrame API only, so a Spark Connect session runs it unchanged.

    `dprun run --spark-remote` runs in a subprocess: pyspark allows no remote session in a
    process that holds a classic one (this module's fixture).
    """
    remote = os.environ["DPRUN_TEST_SPARK_REMOTE"]
    spec = example_copy / "specs" / "restaurants_multi.yaml"
    plan = api.plan(api.validate(spec))
    outputs = [q.output_path for q in plan.queries]

    def published() -> list[pl.DataFrame]:
        return [pl.read_csv(p) if p.suffix == ".csv" else pl.read_parquet(p) for p in outputs]

    api.run(spec, seed=SEED, overwrite=True)
    expected = published()
    done = subprocess.run(
        [sys.executable, "-m", "dprun", "run", str(spec), "--seed", str(SEED), "--overwrite",
         "--engine", "spark", "--spark-remote", remote, "--format", "json"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for path, before, after in zip(outputs, expected, published(), strict=True):
        assert before.equals(after), f"{path}:\npolars\n{before}\nspark connect\n{after}"


def test_spark_computes_value_cells_and_unit_weights_as_the_mechanisms_do(spark: Any) -> None:
    """The two formulas the Spark engine writes in its own terms give the very integers of
    `bound_choice.value_cells` and `selection.unit_weights`, powers of two and their neighbours included."""
    from dprun.mechanisms import selection  # noqa: PLC0415

    rng = np.random.default_rng(7)
    powers = [2.0**k for k in range(-24, 45)]
    values = np.array([0.0, -0.0, 3.0, -1e-300, 5e15, *powers, *(math.nextafter(p, math.inf) for p in powers),
                       *(math.nextafter(p, 0.0) for p in powers), *(rng.lognormal(0, 15, 3000) * rng.choice([-1, 1], 3000))])
    partitions = np.r_[np.arange(1, 5001), [2**20 - 1, 2**20, 10**6]]
    frame = spark.createDataFrame([(float(v), int(n)) for v, n in zip(values, np.resize(partitions, values.size))],
                                  ["v", "n"])
    got = frame.select(spark_engine._value_cell(spark_engine._col("v")).alias("cell"),
                       spark_engine._unit_weight(spark_engine._col("n")).alias("w")).collect()
    assert [row["cell"] for row in got] == bound_choice.value_cells(values).tolist()
    assert [row["w"] for row in got] == selection.unit_weights(np.resize(partitions, values.size)).tolist()


def test_spark_sums_the_units_kept_shares_as_the_mechanisms_do(spark: Any) -> None:
    """The kept shares auto bounds score candidates by (`bound_choice.kept_weights`), from Spark's
    per-unit partitions, rows and capped rows: the very integers, floor divisions included, for units
    of one pair to hundreds and of one row to a million."""
    choice = bound_choice.BoundChoicePlan(1.0, None, None, None, row_metrics=1, unit_metrics=0)
    rng = np.random.default_rng(11)
    lengths = np.r_[rng.integers(1, 4, 300), rng.integers(1, 300, 40), [1, 128, 129]]
    pair_rows = np.minimum(rng.zipf(1.6, int(lengths.sum())), 10**6)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    order = np.lexsort((-pair_rows, np.repeat(np.arange(lengths.size), lengths)))
    ranked = pair_rows[order]
    rank = np.arange(ranked.size) - np.repeat(starts, lengths)
    capped = np.stack([np.stack([np.add.reduceat(np.where(rank < l0, np.minimum(ranked, cap), 0), starts)
                                 for cap in choice.rows_options], axis=1) for l0 in choice.l0_options], axis=1)
    totals = np.add.reduceat(pair_rows, starts)
    names = [spark_engine.CAPPED.format(f"{i}_{j}") for i in range(len(choice.l0_options))
             for j in range(len(choice.rows_options))]
    per_unit = spark.createDataFrame(
        [(int(n), int(r), *map(int, c.reshape(-1))) for n, r, c in zip(lengths, totals, capped)],
        [spark_engine.PARTITIONS, spark_engine.UNIT_ROWS, *names])
    kept_rows, kept_pairs = spark_engine._kept_weights(per_unit, choice)
    expected_rows, expected_pairs = bound_choice.runs_kept_weights(pair_rows, starts, lengths, choice)
    assert kept_pairs.tolist() == expected_pairs.tolist()
    assert kept_rows.tolist() == expected_rows.tolist()

"""The sorted bounding path (dprun/engines/sorted_bounding.py, codes from dprun/engines/codes.py).

A release must not depend on how rows are coded, sharded or bounded: every test here runs a
spec twice under one test seed, once as it is and once with another coding (keys by table
instead of by range, units coded per shard instead of by offset), with many small shards or
with the compiled loop for light units, and compares the outputs exactly. `test_bounding_properties.py` checks the bounded sums
against a brute-force reference. Seeds come from os.urandom and are part of every
assertion message.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import every_sum, fresh_seed
from engine_specs import output, query, run_ok, write_spec

from dprun import api
from dprun.engines import codes as codes_module
from dprun.engines import compiled, distinct_codes, key_hashes, shards, sorted_bounding
from dprun.engines.codes import Codes, Digit, RangeCodes, ShardUnits, TableKeys
from dprun.errors import DataError
from dprun.spec.input_schema import InputInfo
from dprun.spec.models import InputSpec

Variant = Callable[[pytest.MonkeyPatch], None]


def table_codes(patch: pytest.MonkeyPatch) -> None:
    """Keys coded by the table of distinct keys, units by their rank in their shard."""
    patch.setattr(codes_module, "MAX_KEY_CODES", 1)
    patch.setattr(codes_module, "PACKED_BITS", 0)


def small_shards(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(shards, "SHARD_ROWS", 500)


def compiled_loop(patch: pytest.MonkeyPatch) -> None:
    """Light units and value sums by the compiled passes (large inputs) instead of numpy's and Polars'."""
    patch.setattr(compiled, "COMPILED_FROM_ROWS", 0)
    load = compiled.compiled_unit_passes
    UNIT_PASS_LOADS.clear()

    def counted() -> Any:
        UNIT_PASS_LOADS.append(1)
        return load()

    patch.setattr(compiled, "compiled_unit_passes", counted)


# The queries that asked for the compiled passes of units coded per shard under `compiled_loop`.
UNIT_PASS_LOADS: list[int] = []


def hashed_table_codes(patch: pytest.MonkeyPatch) -> None:
    """Units coded per shard and keys by table, the keys found in each shard by their hashes
    (the compiled path) rather than joined into the rows."""
    table_codes(patch)
    compiled_loop(patch)
    found = key_hashes.KeyHashes.codes
    HASH_LOOKUPS.clear()

    def counted(self: key_hashes.KeyHashes, hashes: pl.Series, passes: compiled.UnitPasses) -> pl.Series:
        HASH_LOOKUPS.append(hashes.len())
        return found(self, hashes, passes)

    patch.setattr(key_hashes.KeyHashes, "codes", counted)


# The shards' rows whose keys `hashed_table_codes` found by hash, per shard.
HASH_LOOKUPS: list[int] = []


def heavy_tailed_rows(rng: np.random.Generator, units: int, key_dtype: pl.DataType = pl.Int64) -> pl.DataFrame:
    """Units with 1–300 rows over ~200 keys (some null), repeated pairs, null and NaN values."""
    per_unit = np.minimum(rng.zipf(1.6, units), 300)
    uid = np.repeat(rng.permutation(units) * 7 - 1000, per_unit)
    n = uid.size
    key = rng.zipf(1.3, n) % 200 - 100
    value = rng.normal(20, 30, n)
    value[rng.random(n) < 0.05] = np.nan
    frame = pl.DataFrame({"uid": uid, "key": key, "value": value}).with_columns(
        pl.when(pl.col("key") % 37 == 0).then(None).otherwise(pl.col("key")).cast(key_dtype).alias("key"),
        pl.when(pl.col("value") > 70).then(None).otherwise(pl.col("value")).alias("value"),
    )
    return frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**32)))


def both_ways(spec: Path, names: list[str], seed: int, monkeypatch: pytest.MonkeyPatch, variant: Variant
              ) -> dict[str, tuple[pl.DataFrame, pl.DataFrame]]:
    """Each query's output as the spec runs, and with `variant` applied, same seed; each run's
    codings (unit and key code kinds) are checked to differ where `variant` changes them."""
    codings: list[list[tuple[str, str]]] = [[], []]
    original = sorted_bounding.SortedBounding.__init__

    def spy(run: int) -> Callable[..., None]:
        def init(self: sorted_bounding.SortedBounding, plan: Any, rows: Any, codes: Codes, *args: Any) -> None:
            codings[run].append((type(codes.units).__name__, type(codes.keys).__name__))
            original(self, plan, rows, codes, *args)
        return init

    with monkeypatch.context() as patch:
        patch.setattr(sorted_bounding.SortedBounding, "__init__", spy(0))
        run_ok(spec, seed)
    first = {name: output(spec, name) for name in names}
    with monkeypatch.context() as patch:
        patch.setattr(sorted_bounding.SortedBounding, "__init__", spy(1))
        variant(patch)
        run_ok(spec, seed)
    assert len(codings[0]) == len(codings[1]) == len(names), f"seed={seed}: {codings}"
    if variant is hashed_table_codes:
        assert HASH_LOOKUPS, f"seed={seed}: no shard found its keys by hash"
        assert len(UNIT_PASS_LOADS) == len(names), f"seed={seed}: {UNIT_PASS_LOADS}"
    if variant is compiled_loop:
        # Units coded by range: the passes of units coded per shard are not loaded.
        assert {units for units, _ in codings[1]} == {"RangeCodes"}, f"seed={seed}: {codings}"
        assert not UNIT_PASS_LOADS, f"seed={seed}: {UNIT_PASS_LOADS}"
    if variant in (table_codes, hashed_table_codes):
        assert set(codings[1]) == {("ShardUnits", "TableKeys")}, f"seed={seed}: {codings}"
        assert ("RangeCodes", "RangeCodes") in codings[0], f"seed={seed}: {codings}"
    return {name: (first[name], output(spec, name)) for name in names}


METRICS = [
    {"name": "rows", "kind": "count"},
    {"name": "people", "kind": "privacy_id_count"},
    {"name": "total", "kind": "sum", "column": "value", "bounds": [-40, 90]},
    {"name": "average", "kind": "mean", "column": "value", "bounds": [0, 50]},
    {"name": "spread", "kind": "stddev", "column": "value", "bounds": [-10, 60]},
]


TREE = {"name": "p", "kind": "quantile", "column": "value", "bounds": [-20, 80], "q": [0.1, 0.5, 0.9],
        "quantile_method": "tree"}
CANDIDATES = {"name": "mid", "kind": "median", "column": "value", "bounds": [-10, 70], "quantile_method": "candidates"}


@pytest.mark.parametrize("variant", [small_shards, table_codes, compiled_loop, hashed_table_codes])
def test_codes_and_shards_change_no_released_number(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     variant: Variant) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    heavy_tailed_rows(rng, 3000).write_parquet(tmp_path / "data.parquet")
    queries = [
        query("plume", ["key"], METRICS, l0=3, m=2, partitions={"selection": "gaussian_threshold"}),
        query("no_second", ["key"], METRICS, l0=2, m=3,
              partitions={"selection": "laplace_threshold", "second_bounding": False}),
        query("released", ["key"], METRICS[:2], l0=4, m=1, partitions={"selection": "released_count"}),
        # 500 is outside the keys' range and absent from the table of keys: its median has no data.
        query("public", ["key"], [*METRICS, TREE], l0=2, m=2, partitions={"public": [-99, -13, 0, 1, 2, 3, 500]}),
        query("everything", [], METRICS, l0=1, m=5),
    ]
    spec = write_spec(tmp_path, queries, epsilon=20.0, delta=1e-6)
    for name, (fast, general) in both_ways(spec, [q["name"] for q in queries], seed, monkeypatch, variant).items():
        assert fast.height > 0, f"seed={seed}: {name} released nothing; the comparison would be empty"
        assert fast.equals(general), f"seed={seed}: {name} differs between codings:\n{fast}\n{general}"


@pytest.mark.parametrize("lookup_format", ["parquet", "csv"])
def test_keys_from_joins_and_query_derived_keys_release_the_same_tables_by_range_and_by_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lookup_format: str
) -> None:
    """Ranges from a public lookup (its footers, or its CSV read), from a private input's footers,
    or (a key the query derives) from a scan: the same tables as keys coded by table."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = heavy_tailed_rows(rng, 2000)
    rows.write_parquet(tmp_path / "data.parquet")
    # Keys -100..99; the lookup lacks every key above 80 (dropped by inner, a null category by left).
    items = pl.DataFrame({"key": range(-100, 81), "category": [k % 7 * 1000 for k in range(-100, 81)]})
    getattr(items, f"write_{lookup_format}")(tmp_path / f"items.{lookup_format}")
    units = rows["uid"].unique().sort()
    profiles = pl.DataFrame({"uid": units.to_list() * 2, "group": rng.integers(-5, 5, units.len() * 2)})
    profiles.sample(fraction=0.7, seed=seed % 2**32).write_parquet(tmp_path / "profiles.parquet")
    joined = [
        query("inner", ["category"], METRICS[:3], l0=2, m=2, partitions={"selection": "laplace_threshold"},
              input_name={"join": ["data", "items"], "on": "key"}),
        query("left", ["category"], METRICS[:2], l0=2, m=2, partitions={"selection": "laplace_threshold"},
              input_name={"join": ["data", "items"], "on": "key", "how": "left"}),
        query("private", ["group"], METRICS[:3], l0=2, m=3, partitions={"selection": "laplace_threshold"},
              input_name={"join": ["data", "profiles"], "on": "uid",
                          "max_rows_per_unit": {"profiles": 1}}),
        {**query("derived", ["double"], METRICS[:2], l0=3, m=1, partitions={"selection": "laplace_threshold"}),
         "derive": {"double": "key * 2"}},
    ]
    spec = write_spec(tmp_path, joined, epsilon=20.0, delta=1e-6)
    document = json.loads(spec.read_text())
    # A CSV file's types are the spec's to declare.
    types = {"columns": {"key": "int64", "category": "int64"}} if lookup_format == "csv" else {}
    document["inputs"] |= {"items": {"path": f"items.{lookup_format}", "public": True, **types},
                           "profiles": {"path": "profiles.parquet"}}
    spec.write_text(json.dumps(document))
    outputs = both_ways(spec, [q["name"] for q in joined], seed, monkeypatch, table_codes)
    for name, (fast, general) in outputs.items():
        assert fast.height > 1, f"seed={seed}: {name} released too little for the comparison to mean anything"
        assert fast.equals(general), f"seed={seed}: {name} differs between paths:\n{fast}\n{general}"
    assert outputs["left"][0]["category"].null_count() == 1, f"seed={seed}: the unmatched keys' null category"


def test_narrow_and_unsigned_integer_columns_keep_their_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = heavy_tailed_rows(rng, 800, key_dtype=pl.Int8)
    # Keys at both ends of Int8, so the null key's code (one past the largest) is outside Int8,
    # and a null key for every unit.
    extremes = rows.head(40).with_columns(pl.Series("key", [127, -128] * 20, dtype=pl.Int8))
    null_keys = rows.unique("uid").with_columns(pl.lit(None, dtype=pl.Int8).alias("key"))
    frame = pl.concat([rows, extremes, null_keys]).with_columns(
        (pl.col("uid") - pl.col("uid").min() + (2**64 - 10**6)).cast(pl.UInt64).alias("uid"))
    frame.write_parquet(tmp_path / "data.parquet")
    keys = rows["key"].drop_nulls().unique().sort().to_list()
    queries = [query("narrow", ["key"], METRICS[:3], l0=3, m=2, partitions={"public": [*keys[:5], 127, -128]}),
               query("private", ["key"], METRICS[:3], l0=3, m=2, partitions={"selection": "gaussian_threshold"})]
    spec = write_spec(tmp_path, queries, epsilon=20.0, delta=1e-6)
    outputs = both_ways(spec, ["narrow", "private"], seed, monkeypatch, table_codes)
    fast, general = outputs["narrow"]
    assert fast.schema["key"] == pl.Int8, f"seed={seed}"
    assert fast["key"].to_list() == sorted([*keys[:5], 127, -128]), f"seed={seed}"
    assert fast.equals(general), f"seed={seed}:\n{fast}\n{general}"
    fast, general = outputs["private"]
    assert fast["key"].null_count() == 1, f"seed={seed}: the null key's partition, with hundreds of units, is missing"
    assert fast.equals(general), f"seed={seed}:\n{fast}\n{general}"


def codes_of(frame: pl.DataFrame, tmp_path: Path) -> Codes:
    path = tmp_path / "data.csv"
    frame.write_csv(path)
    spec = write_spec(tmp_path, [query("q", ["key"], METRICS[:1])], epsilon=1.0, delta=1e-6, data="data.csv")
    plan = api.plan(api.validate(spec)).queries[0]
    info = InputInfo("data", (path,), "csv", dict(frame.schema), InputSpec(path=str(path)))
    return codes_module.codes_for(pl.scan_csv(path, schema=frame.schema), plan, ["key"], info, 1)


def test_ranges_too_wide_to_pack_are_coded_per_shard_and_by_table(tmp_path: Path) -> None:
    wide_units = codes_of(pl.DataFrame({"uid": [-(2**62), 2**62], "key": [1, 2]}), tmp_path)
    assert isinstance(wide_units.units, ShardUnits) and isinstance(wide_units.keys, RangeCodes)
    wide_keys = codes_of(pl.DataFrame({"uid": [1, 2], "key": [0, codes_module.MAX_KEY_CODES]}), tmp_path)
    assert isinstance(wide_keys.units, RangeCodes) and isinstance(wide_keys.keys, TableKeys)
    assert sorted(wide_keys.keys.table["key"].to_list()) == [0, codes_module.MAX_KEY_CODES]
    codes = codes_of(pl.DataFrame({"uid": [5, 9], "key": [None, 3]}, schema={"uid": pl.Int64, "key": pl.Int64}),
                     tmp_path)
    assert codes.units == RangeCodes((Digit("uid", 5, 5, pl.Int64(), nulls=False),))
    assert codes.keys == RangeCodes((Digit("key", 3, 1, pl.Int64(), nulls=True),))


@pytest.mark.parametrize(("uid", "key", "uid_type"), [
    ([1, 2, 3, 40], [1, 1, 2, 2], pl.Int64),  # a unit above the range
    ([0, 2, 3, 2], [1, 1, 2, 2], pl.UInt64),  # a unit below it, whose offset wraps around in UInt64
    ([2**64 - 1, 2, 3, 2], [1, 1, 2, 2], pl.UInt64),
    ([1, 2, 3, 2], [-(2**63), 1, 2, 2], pl.Int64),  # a key whose offset overflows Int64
    ([1, 2, 3, 2], [1, 1, 2, 2**62], pl.Int64),  # a key that would carry into the unit's bits
])
@pytest.mark.parametrize("sharded", [False, True])
def test_rows_outside_the_footer_ranges_fail_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, uid: list[int],
                                                     key: list[int], uid_type: pl.DataType, sharded: bool) -> None:
    """Parquet statistics are trusted only as far as every row is checked against them: in one
    shard, and in shards of units mixed by `UnitMix` (a sum carries a value column)."""
    if sharded:
        monkeypatch.setattr(shards, "SHARD_ROWS", 1)
    frame = pl.DataFrame({"uid": uid, "key": key, "value": [1.0] * 4},
                         schema={"uid": uid_type, "key": pl.Int64, "value": pl.Float64})
    lying = Codes(RangeCodes((Digit("uid", 1, 3, uid_type, nulls=False),)),
                  RangeCodes((Digit("key", 1, 2, pl.Int64(), nulls=True),)), ("key",), 4)
    pl.DataFrame({"uid": [1], "key": [1], "value": [1.0]}).write_parquet(tmp_path / "data.parquet")
    metrics = [METRICS[2]] if sharded else METRICS[:1]
    spec = write_spec(tmp_path, [query("q", ["key"], metrics, partitions={"public": [1, 2]})], epsilon=1.0)
    plan = api.plan(api.validate(spec)).queries[0]
    with pytest.raises(DataError, match="statistics do not match"):
        sorted_bounding.SortedBounding(plan, frame.lazy(), lying, 1, tmp_path)


def test_date_columns_cast_to_integers_release_what_integer_columns_do(tmp_path: Path) -> None:
    """A Parquet date column the spec casts to int64 (days since 1970) as unit and key: its
    footers hold dates, not integers, so its ranges come from the rows; the same tables as
    the integers written as such."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    days = pl.DataFrame({"uid": rng.integers(18_000, 18_300, 2000), "key": rng.integers(18_000, 18_005, 2000)})
    spec_query = query("q", ["key"], METRICS[:1], l0=2, m=2, partitions={"public": list(range(18_000, 18_005))})
    released = []
    for name, frame in (("ints", days), ("dates", days.cast(pl.Date))):
        (tmp_path / name).mkdir()
        frame.write_parquet(tmp_path / name / "data.parquet")
        spec = write_spec(tmp_path / name, [spec_query], epsilon=1.0)
        document = json.loads(spec.read_text())
        document["inputs"]["data"]["columns"] = {"uid": "int64", "key": "int64"}
        spec.write_text(json.dumps(document))
        run_ok(spec, seed)
        released.append(output(spec, "q"))
    assert released[0].equals(released[1]), f"seed={seed}:\n{released[0]}\n{released[1]}"


@pytest.mark.parametrize("scale", [1, 2**20, 2**40, 2**61])
def test_exact_bincount_matches_python_integers(scale: int) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 50, 200_000)
    values = rng.integers(-scale, scale + 1, keys.size, dtype=np.int64) if scale > 1 else np.ones(keys.size, np.int64)
    expected = [0] * 50
    for key, value in zip(keys.tolist(), values.tolist(), strict=True):
        expected[key] += value
    got = sorted_bounding._exact_bincount(keys, values, 50).to_list()
    assert got == expected, f"seed={seed}: per-key sums differ"


@pytest.mark.parametrize(("scale", "max_rows"), [(10, 1), (2**40, 3), (2**61, 2), (2**62, 7)])
def test_scaled_partials_are_floors_of_python_integers(scale: int, max_rows: int) -> None:
    """floor(total · m / rows) of pairs over m rows, in int64 where the products fit and through
    Int128 where they may not (the two largest scales), negative totals rounded down."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    present = rng.integers(max_rows + 1, max_rows + 50, 10_000)
    total = rng.integers(-scale, scale, present.size, dtype=np.int64)
    expected = [t * max_rows // p for t, p in zip(total.tolist(), present.tolist(), strict=True)]
    got = sorted_bounding._scaled_partials(total, present, max_rows)
    assert got.dtype == np.int64 and got.tolist() == expected, f"seed={seed}: scaled partials differ"


def test_exact_sums_stay_exact_through_int64_carries_and_merges() -> None:
    """Sums of two keys that pass 2^63 (so int64 must be carried into Int128), values large
    enough to need splitting, pair counts, adds through np.bincount and straight into the sums
    (`add_sparse`), and two accumulators merged."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    halves = [sorted_bounding._ExactSums(np.zeros(2, np.int64)), sorted_bounding._ExactSums(np.zeros(2, np.int64))]
    expected = [0, 0]
    for step in range(8000):
        keys = rng.integers(0, 2, 127)
        if step % 11 == 0:
            values = np.ones(keys.size, np.int64)  # the pair-count shortcut
        elif step % 7 == 0:
            values = rng.integers(2**49, 2**50, keys.size)  # sums past 2^53: split into parts
        else:
            values = rng.integers(2**45, 2**46, keys.size)  # each add's bound just under 2^53
        if step % 13 == 0:
            values = rng.integers(2**57, 2**58, keys.size)  # one add's bound past 2^63: summed in Int128 at once
        if step % 3 == 0:
            halves[step % 2].add_sparse(keys, values)
        else:
            halves[step % 2].add(keys, values, np.bincount(keys, minlength=2))
        for key, value in zip(keys.tolist(), values.tolist(), strict=True):
            expected[key] += value
    assert min(expected) > 2**64, f"seed={seed}: each accumulator's sums must pass int64 for the test to mean anything"
    halves[0].merge(halves[1])
    assert every_sum(halves[0]).to_list() == expected, f"seed={seed}: per-key sums differ"
    assert halves[0].total_of(np.array([1, 1, 0])).to_list() == [expected[1], expected[1], expected[0]], (
        f"seed={seed}: the sums of chosen key codes differ")


def test_totals_add_few_and_many_pairs_alike() -> None:
    """Pairs added straight into the running totals (few of them) or through a per-key count
    (many) give the same units and sums."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    size = 1000
    totals = sorted_bounding._Totals.zeros(size, ["q"])
    units, sums = np.zeros(size, np.int64), np.zeros(size, np.int64)
    paths = set()
    for pairs in [10, 5000, 200, 3000, 50]:
        keys = rng.integers(0, size, pairs)
        values = rng.integers(-1000, 1000, pairs)
        paths.add(sorted_bounding._is_sparse(keys, size))
        totals.add(keys, {"q": values})
        np.add.at(units, keys, 1)
        np.add.at(sums, keys, values)
    assert paths == {True, False}, "both ways of adding must run"
    assert totals.units.tolist() == units.tolist(), f"seed={seed}: units differ"
    assert every_sum(totals.sums["q"]).to_list() == sums.tolist(), f"seed={seed}: sums differ"


@pytest.mark.parametrize("family", ["string", "compound", "two_keys", "date_key", "wide_ints"])
def test_every_column_family_releases_the_same_tables_in_small_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      family: str) -> None:
    """Text, compound units, two-column and date keys, integers too far apart to pack by offset:
    every quantity (quantile trees and candidates included) is the same in 500-row shards."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = heavy_tailed_rows(rng, 2000)
    unit: Any = "uid"
    keys = ["key"]
    if family == "string":
        rows = rows.with_columns(("u" + pl.col("uid").cast(pl.String)).alias("uid"),
                                 ("k" + pl.col("key").cast(pl.String)).alias("key"))
    elif family == "compound":
        rows = rows.with_columns((pl.col("key").fill_null(0) % 3).alias("day"))
        unit = ["uid", "day"]
    elif family == "two_keys":
        rows = rows.with_columns((pl.col("value").fill_null(0) > 30).alias("big"))
        keys = ["key", "big"]
    elif family == "date_key":
        rows = rows.with_columns((pl.date(2024, 1, 1) + pl.duration(days=pl.col("key"))).alias("key"))
    else:
        rows = rows.with_columns((pl.col("uid") * 2**50).alias("uid"), (pl.col("key") * 2**40).alias("key"))
    rows.write_parquet(tmp_path / "data.parquet")
    queries = [
        query("plume", keys, [*METRICS, TREE], l0=3, m=2, partitions={"selection": "gaussian_threshold"}),
        query("no_second", keys, [*METRICS, TREE], l0=2, m=3,
              partitions={"selection": "laplace_threshold", "second_bounding": False}),
        query("released", keys, METRICS[:2], l0=4, m=1, partitions={"selection": "released_count"}),
        query("everything", [], [*METRICS, TREE, CANDIDATES], l0=1, m=5),
    ]
    spec = write_spec(tmp_path, queries, epsilon=20.0, delta=1e-6, privacy_unit=unit)
    for name, (whole, sharded) in both_ways(spec, [q["name"] for q in queries], seed, monkeypatch,
                                            small_shards).items():
        assert whole.height > 0, f"seed={seed}: {name} released nothing; the comparison would be empty"
        assert whole.equals(sharded), f"seed={seed}: {name} differs in small shards:\n{whole}\n{sharded}"


@pytest.mark.parametrize("rows", ["shuffled", "unit by unit"])
@pytest.mark.parametrize("compiled_codes", [False, True])
@pytest.mark.parametrize("bits", [40, 4])
def test_shard_unit_codes_tell_every_unit_apart(bits: int, compiled_codes: bool, rows: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """With 40 bits the keyed hash's top bits tell 300 units apart; with 4 bits they cannot (16
    codes), and the units' dense ranks are used instead; the compiled pass numbers the
    distinct hashes densely whatever the bits, and where the rows come unit by unit checks
    them against the runs of equal units, without counting the units: one code per unit."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    names = rng.choice([f"id-{i}" for i in range(300)], 5000)
    shard = pl.DataFrame({"uid": names, "day": rng.integers(0, 3, 5000)})
    if rows == "unit by unit":
        shard = shard.sort("uid", "day")
    units = ShardUnits(("uid", "day"))
    loaded = compiled.compiled_unit_passes().result() if compiled_codes else None
    counted: list[int] = []

    def dense_codes(*args: np.ndarray) -> int:
        assert loaded is not None
        counted.append(loaded.dense_codes(*args))
        return counted[-1]

    passes = dataclasses.replace(loaded, dense_codes=dense_codes) if loaded is not None else None
    counts: list[int] = []
    original = codes_module._distinct_units
    monkeypatch.setattr(codes_module, "_distinct_units", lambda *args: counts.append(original(*args)) or counts[-1])
    codes = codes_module.shard_unit_codes(shard, units, bits, seed % 2**64, passes)
    pairs = shard.with_columns(codes).select("uid", "day", codes_module.UNIT).unique()
    assert pairs.height == shard.select("uid", "day").n_unique() == pairs[codes_module.UNIT].n_unique(), f"seed={seed}"
    dense = compiled_codes or bits == 4
    assert int(codes.max()) == pairs.height - 1 if dense else int(codes.max()) < 2**bits, f"seed={seed}"
    # One dense pass either way: unit by unit, checked against the runs; else against the units counted.
    assert len(counted) == int(compiled_codes), f"seed={seed}: {counted}"
    assert len(counts) == (0 if compiled_codes and rows == "unit by unit" else 1), f"seed={seed}: {counts}"


@pytest.mark.parametrize("rows", ["shuffled", "unit by unit"])
def test_units_whose_hashes_collide_are_coded_by_rank(rows: str) -> None:
    """Where the dense pass finds fewer distinct hashes than units (here it sees only each
    hash's low 4 bits, 16 values for 300 units), or than runs of equal units, the units' dense
    ranks are their codes."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    shard = pl.DataFrame({"uid": rng.choice([f"id-{i}" for i in range(300)], 5000)})
    if rows == "unit by unit":
        shard = shard.sort("uid")

    def colliding(hashes: np.ndarray, slots: np.ndarray, codes: np.ndarray) -> int:
        return distinct_codes.dense_codes(hashes & 15, slots, codes)

    passes = compiled.UnitPasses(key_hashes.fill_slots, key_hashes.find_codes, colliding)
    codes = codes_module.shard_unit_codes(shard, ShardUnits(("uid",)), 40, seed % 2**64, passes)
    ranks = shard.select(pl.col("uid").rank("dense").cast(pl.Int64) - 1).to_series()
    assert (codes == ranks).all(), f"seed={seed}"


@pytest.mark.parametrize("bits,count", [(1, 2), (7, 48), (20, 3), (24, 48), (31, 500)])
def test_unit_mix_is_a_bijection_onto_short_codes(bits: int, count: int) -> None:
    """Every unit code lands in one shard, coded there below ⌈2^bits / count⌉ once the shard's
    first mixed code is taken away, and that code turns back into it."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    units = np.unique(np.concatenate([[0, (1 << bits) - 1], rng.integers(0, 1 << bits, 20_000)]))
    mix = shards.UnitMix(bits, (int(rng.integers(0, 1 << bits)) | 1, int(rng.integers(0, 1 << bits)) | 1), count)
    frame = pl.DataFrame({"u": units}).with_columns(mix.mixed(pl.col("u"))).with_columns(
        mix.shard(pl.col(shards.MIXED)))
    shard_of, mixed = frame[shards.SHARD].to_numpy(), frame[shards.MIXED].to_numpy()
    assert shard_of.min() >= 0 and shard_of.max() < count, f"seed={seed}: a shard out of range"
    assert len(set(mixed.tolist())) == units.size and mixed.max() < 1 << bits, f"seed={seed}: not a bijection"
    for s in np.unique(shard_of).tolist():
        within = mixed[shard_of == s] - mix.first(s)
        assert within.min() >= 0 and within.max() < -(-(1 << bits) // count), f"seed={seed}: shard {s}: codes too long"
        assert (mix.unit_codes(s, within) == units[shard_of == s]).all(), f"seed={seed}: shard {s}: units not recovered"


def test_unit_mix_spreads_strided_ids_over_every_shard() -> None:
    """Ids with a common stride (multiples of 1,000; of 2^10) fill every one of 48 shards to
    within half of the mean, for each of twenty fixed secrets (deterministic: no seed)."""
    for stride in [1000, 1 << 10]:
        units = np.arange(0, 200_000 * stride, stride)
        bits = int(units.max()).bit_length()
        for secret in range(20):  # 0 included: the multipliers are never 1
            mix = shards.UnitMix.of(RangeCodes((Digit("uid", 0, 1 << bits, pl.Int64(), nulls=False),)),
                                    48, secret * 7_919_000_003)
            assert mix is not None
            shard_of = pl.DataFrame({"u": units}).with_columns(mix.mixed(pl.col("u"))).select(
                mix.shard(pl.col(shards.MIXED))).to_series()
            sizes = np.bincount(shard_of.to_numpy(), minlength=48)
            assert sizes.min() > 0.5 * sizes.mean() and sizes.max() < 1.5 * sizes.mean(), (stride, secret, sizes)


def radix_passes() -> compiled.Passes:
    """The compiled passes, sorting by the radix sort whichever sort is faster on this processor."""
    return dataclasses.replace(compiled.compiled_passes().result(), radix_beats_numpy=True)


@pytest.mark.parametrize("radix", [False, True])
@pytest.mark.parametrize("largest", [1000, 2**55])
def test_pair_sums_sort_rows_with_their_values_by_places_or_by_polars(largest: int, radix: bool) -> None:
    """Short codes are sorted with their row places by numpy or the compiled radix sort, long
    ones by Polars: either way every pair's rows and sums are a group-by's, in code order, and
    carried rows follow their codes."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    n = 5000
    frame = pl.DataFrame({sorted_bounding.PACKED: rng.integers(0, largest, n) // (largest // 400),
                          "a": rng.integers(-50, 50, n), "leaf": np.arange(n)})
    frame = frame.with_columns(pl.col(sorted_bounding.PACKED) * (largest // 400))
    passes = radix_passes() if radix else None
    assert (sorted_bounding._sorted_with_places(frame, passes) is None) == (largest > 2**40), \
        "the path this case means to run"
    pairs = sorted_bounding._pair_sums(frame, passes, carried=["leaf"])
    truth = frame.group_by(sorted_bounding.PACKED).agg(pl.len().alias("rows"), pl.col("a").sum()).sort(
        sorted_bounding.PACKED)
    assert pairs[sorted_bounding.PACKED].tolist() == truth[sorted_bounding.PACKED].to_list(), f"seed={seed}"
    assert pairs[sorted_bounding.ROWS].tolist() == truth["rows"].to_list(), f"seed={seed}: rows per pair"
    assert pairs["a"].tolist() == truth["a"].to_list(), f"seed={seed}: sums per pair"
    codes = frame[sorted_bounding.PACKED].to_numpy()
    carried_codes = codes[pairs["leaf"]]
    assert (np.diff(carried_codes) >= 0).all(), f"seed={seed}: carried rows must follow their codes"
    if largest <= 2**40:  # sorted with places: a pair's rows stay in their order
        in_run = np.flatnonzero(np.diff(carried_codes) == 0)
        assert (pairs["leaf"][in_run + 1] > pairs["leaf"][in_run]).all(), f"seed={seed}: a pair's rows in place order"


@pytest.mark.parametrize("radix", [False, True])
def test_lone_codes_column_sorts_like_numpy(radix: bool) -> None:
    """A shard of codes alone (a count) gives a group-by's pairs and rows, by numpy's sort or the
    compiled radix sort, whether Polars' memory is writable or not."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    frame = pl.DataFrame({sorted_bounding.PACKED: rng.integers(0, 2**37, 30_000) // 2**20 * 2**20
                          + rng.integers(0, 40, 30_000)})
    passes = radix_passes() if radix else None
    pairs = sorted_bounding._pair_sums(frame, passes)
    truth = frame.group_by(sorted_bounding.PACKED).agg(pl.len().alias("rows")).sort(sorted_bounding.PACKED)
    assert pairs[sorted_bounding.PACKED].tolist() == truth[sorted_bounding.PACKED].to_list(), f"seed={seed}"
    assert pairs[sorted_bounding.ROWS].tolist() == truth["rows"].to_list(), f"seed={seed}: rows per pair"


@pytest.mark.parametrize("radix", [False, True])
@pytest.mark.parametrize("case", ["spread", "equal_top_bits", "too_wide_to_pack"])
def test_choice_order_is_the_three_key_lexsort(case: str, radix: bool) -> None:
    """The packed sort orders pairs exactly as np.lexsort((hashes, -rows, runs)): ties of the hash's
    top bits sorted by the whole hash, then by place; rows too large to pack fall back to it."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, 400)
    runs = np.repeat(np.arange(lengths.size), lengths)
    rows = rng.geometric(0.4, runs.size).astype(np.int64)
    hashes = rng.integers(0, 2**64, runs.size, dtype=np.uint64)
    if case == "equal_top_bits":
        # Only the low bits differ (often not at all): every tie goes through the second sort.
        hashes = rng.integers(0, 4, runs.size, dtype=np.uint64) << np.uint64(62) | rng.integers(0, 3, runs.size,
                                                                                                dtype=np.uint64)
    if case == "too_wide_to_pack":
        rows[rng.integers(0, runs.size)] = 2**40
    expected = np.lexsort((hashes, -rows, runs))
    passes = radix_passes() if radix else None
    assert sorted_bounding._choice_order(runs, rows, hashes, passes).tolist() == expected.tolist(), f"seed={seed}"


@pytest.mark.parametrize(("rows", "workers", "count"), [
    (10**7, 2, 5),          # SHARD_ROWS (2^21) decides on two cores
    (10**7, 16, 16),        # one shard per worker on sixteen
    (10**8, 16, 48),
    (3 * 10**6, 64, 11),    # never below MIN_SHARD_ROWS (2^18) rows a shard
    (2**21, 64, 1),         # one shard stays one, in memory
])
def test_rows_split_into_shards_give_every_worker_one(monkeypatch: pytest.MonkeyPatch, rows: int, workers: int,
                                                      count: int) -> None:
    monkeypatch.setattr(shards, "WORKERS", workers)
    assert shards.shard_count(rows) == count

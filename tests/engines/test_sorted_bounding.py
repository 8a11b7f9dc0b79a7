"""The sorted fast path (dprun/engines/sorted_bounding.py) against the general hash path.

Both paths bound contributions with the same partials and the same keyed hash, so under
one test seed they must release identical tables: every test here runs a spec twice, once
as it is and once with the fast path switched off, and compares the outputs exactly.
Seeds come from os.urandom and are part of every assertion message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import fresh_seed
from engine_specs import output, query, run_ok, write_spec

from dprun import api
from dprun.engines import polars_engine, sorted_bounding
from dprun.errors import DataError
from dprun.spec.input_schema import InputInfo
from dprun.spec.models import InputSpec


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


def both_paths(spec: Path, names: list[str], seed: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[pl.DataFrame, pl.DataFrame]]:
    """Each query's output from the fast path and from the general path, same seed."""
    taken: list[bool] = []
    original = sorted_bounding.SortedBounding.__init__

    def spy(self: sorted_bounding.SortedBounding, *args: Any) -> None:
        taken.append(True)
        original(self, *args)

    with monkeypatch.context() as patch:
        patch.setattr(sorted_bounding.SortedBounding, "__init__", spy)
        run_ok(spec, seed)
    assert len(taken) == len(names), f"seed={seed}: the fast path ran for {len(taken)} of {len(names)} queries"
    fast = {name: output(spec, name) for name in names}
    with monkeypatch.context() as patch:
        patch.setattr(polars_engine, "packable", lambda *args: False)
        run_ok(spec, seed)
    return {name: (fast[name], output(spec, name)) for name in names}


METRICS = [
    {"name": "rows", "kind": "count"},
    {"name": "people", "kind": "privacy_id_count"},
    {"name": "total", "kind": "sum", "column": "value", "bounds": [-40, 90]},
    {"name": "average", "kind": "mean", "column": "value", "bounds": [0, 50]},
    {"name": "spread", "kind": "stddev", "column": "value", "bounds": [-10, 60]},
]


@pytest.mark.parametrize("shard_rows", [2**23, 500])
def test_fast_and_general_paths_release_identical_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shard_rows: int
) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    heavy_tailed_rows(rng, 3000).write_parquet(tmp_path / "data.parquet")
    monkeypatch.setattr(sorted_bounding, "SHARD_ROWS", shard_rows)
    queries = [
        query("plume", ["key"], METRICS, l0=3, m=2, partitions={"selection": "gaussian_threshold"}),
        query("no_second", ["key"], METRICS, l0=2, m=3,
              partitions={"selection": "laplace_threshold", "second_bounding": False}),
        query("released", ["key"], METRICS[:2], l0=4, m=1, partitions={"selection": "released_count"}),
        query("public", ["key"], METRICS, l0=2, m=2, partitions={"public": [-99, -13, 0, 1, 2, 3, 500]}),
        query("everything", [], METRICS, l0=1, m=5),
    ]
    spec = write_spec(tmp_path, queries, epsilon=20.0, delta=1e-6)
    for name, (fast, general) in both_paths(spec, [q["name"] for q in queries], seed, monkeypatch).items():
        assert fast.height > 0, f"seed={seed}: {name} released nothing; the comparison would be empty"
        assert fast.equals(general), f"seed={seed}: {name} differs between paths:\n{fast}\n{general}"


@pytest.mark.parametrize("lookup_format", ["parquet", "csv"])
def test_keys_from_joins_and_query_derived_keys_take_the_fast_path_with_the_same_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lookup_format: str
) -> None:
    """Ranges from a public lookup (its footers, or its CSV read), from a private input's footers,
    or (a key the query derives) from a scan: the fast path runs and matches the general path."""
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
    document["inputs"] |= {"items": {"path": f"items.{lookup_format}", "public": True},
                           "profiles": {"path": "profiles.parquet"}}
    spec.write_text(json.dumps(document))
    outputs = both_paths(spec, [q["name"] for q in joined], seed, monkeypatch)
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
    outputs = both_paths(spec, ["narrow", "private"], seed, monkeypatch)
    fast, general = outputs["narrow"]
    assert fast.schema["key"] == pl.Int8, f"seed={seed}"
    assert fast["key"].to_list() == sorted([*keys[:5], 127, -128]), f"seed={seed}"
    assert fast.equals(general), f"seed={seed}:\n{fast}\n{general}"
    fast, general = outputs["private"]
    assert fast["key"].null_count() == 1, f"seed={seed}: the null key's partition, with hundreds of units, is missing"
    assert fast.equals(general), f"seed={seed}:\n{fast}\n{general}"


def codes_of(frame: pl.DataFrame, tmp_path: Path) -> sorted_bounding.Codes | None:
    path = tmp_path / "codes.csv"
    frame.write_csv(path)
    info = InputInfo("data", (path,), "csv", dict(frame.schema), InputSpec(path=str(path)))
    return sorted_bounding.codes_for(pl.scan_csv(path, schema=frame.schema), "uid", "key", info)


def test_ranges_too_wide_to_pack_fall_back_to_the_general_path(tmp_path: Path) -> None:
    wide_units = pl.DataFrame({"uid": [-(2**62), 2**62], "key": [1, 2]})
    wide_keys = pl.DataFrame({"uid": [1, 2], "key": [0, sorted_bounding.MAX_KEY_CODES]})
    assert codes_of(wide_units, tmp_path) is None
    assert codes_of(wide_keys, tmp_path) is None
    codes = codes_of(pl.DataFrame({"uid": [5, 9], "key": [None, 3]}, schema={"uid": pl.Int64, "key": pl.Int64}), tmp_path)
    assert codes is not None and (codes.unit_min, codes.unit_max, codes.key_min, codes.key_span) == (5, 9, 3, 1)


@pytest.mark.parametrize(("uid", "key", "uid_type"), [
    ([1, 2, 3, 40], [1, 1, 2, 2], pl.Int64),  # a unit above the range
    ([0, 2, 3, 2], [1, 1, 2, 2], pl.UInt64),  # a unit below it, whose offset wraps around in UInt64
    ([2**64 - 1, 2, 3, 2], [1, 1, 2, 2], pl.UInt64),
    ([1, 2, 3, 2], [-(2**63), 1, 2, 2], pl.Int64),  # a key whose offset overflows Int64
    ([1, 2, 3, 2], [1, 1, 2, 2**62], pl.Int64),  # a key that would carry into the unit's bits
])
def test_rows_outside_the_footer_ranges_fail_the_run(tmp_path: Path, uid: list[int], key: list[int],
                                                     uid_type: pl.DataType) -> None:
    """Parquet statistics are trusted only as far as every row is checked against them."""
    frame = pl.DataFrame({"uid": uid, "key": key}, schema={"uid": uid_type, "key": pl.Int64})
    lying = sorted_bounding.Codes("uid", 1, 3, uid_type, "key", 1, 2, pl.Int64, 2, 4)
    pl.DataFrame({"uid": [1], "key": [1]}).write_parquet(tmp_path / "data.parquet")
    spec = write_spec(tmp_path, [query("q", ["key"], METRICS[:1], partitions={"public": [1, 2]})], epsilon=1.0)
    plan = api.plan(api.validate(spec)).queries[0]
    with pytest.raises(DataError, match="statistics do not match"):
        sorted_bounding.SortedBounding(plan, frame.lazy(), lying, 1, tmp_path)


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


def test_exact_sums_stay_exact_through_int64_carries_and_merges() -> None:
    """Sums of two keys that pass 2^63 (so int64 must be carried into Int128), with take-aways,
    values large enough to need splitting, pair counts, and two accumulators merged."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    halves = [sorted_bounding._ExactSums(2), sorted_bounding._ExactSums(2)]
    expected = [0, 0]
    for step in range(8000):
        keys = rng.integers(0, 2, 127)
        if step % 11 == 0:
            values = np.ones(keys.size, np.int64)  # the pair-count shortcut
        elif step % 7 == 0:
            values = rng.integers(2**49, 2**50, keys.size)  # sums past 2^53: split into parts
        else:
            values = rng.integers(2**45, 2**46, keys.size)  # each add's bound just under 2^53
        sign = -1 if step % 10 == 0 else 1
        halves[step % 2].add(keys, values, sign * np.bincount(keys, minlength=2), sign)
        for key, value in zip(keys.tolist(), values.tolist(), strict=True):
            expected[key] += sign * value
    assert min(expected) > 2**64, f"seed={seed}: each accumulator's sums must pass int64 for the test to mean anything"
    halves[0].merge(halves[1])
    assert halves[0].total().to_list() == expected, f"seed={seed}: per-key sums differ"

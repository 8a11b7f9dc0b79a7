"""Shards of whole units (dprun/engines/shards.py), read as runs of row groups where a Parquet
input's footers show them in order of its unit, or where its row groups hold its text units'
rows together.

No released number may depend on how rows are sharded: each test runs a spec twice under one
test seed, with the row groups read as shards and with the rows sharded by a hash of the unit,
and compares the outputs exactly. Seeds come from os.urandom and are part of every message.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from dprun_testing import fresh_seed, invoke
from engine_specs import output, query, run_ok, write_spec
from test_sorted_bounding import CANDIDATES, METRICS, TREE, heavy_tailed_rows

from dprun.engines import compiled, shards, sorted_bounding
from dprun.engines.codes import UNIT, UNIT_HASH, Codes, Digit, RangeCodes, ShardUnits


class Spans:
    """Counts the row groups read as shards, those that span two files, and the units split between two shards."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.loaded = 0
        self.across_files = 0
        self.split = 0
        original_load, original_add = shards._load_span, shards._SplitUnits.add

        def load(*args: Any) -> pl.DataFrame:
            self.loaded += 1
            self.across_files += args[3].first != args[3].last
            return original_load(*args)

        def add(units: shards._SplitUnits, part: pl.DataFrame | None, *kept: Any) -> None:
            self.split += 0 if part is None else part.height
            original_add(units, part, *kept)

        monkeypatch.setattr(shards, "_load_span", load)
        monkeypatch.setattr(shards._SplitUnits, "add", add)


def hashed_shards(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(shards, "unit_ordered_shards", lambda *args: None)


def ordered_rows(rng: np.random.Generator, units: int) -> pl.DataFrame:
    """`heavy_tailed_rows` ordered by unit, one unit with 5,000 rows in the middle (it spans
    several row groups and shards), the rows of each unit in random order."""
    rows = heavy_tailed_rows(rng, units)
    middle = int(rows["uid"].sort()[rows.height // 2])
    heavy = pl.DataFrame({"uid": np.full(5000, middle), "key": rng.integers(-100, 100, 5000),
                          "value": rng.normal(20, 30, 5000)})
    return pl.concat([rows, heavy]).sort("uid", maintain_order=True)


QUERIES = [
    query("plume", ["key"], METRICS, l0=3, m=2, partitions={"selection": "gaussian_threshold"}),
    query("public", ["key"], [*METRICS, TREE, CANDIDATES], l0=2, m=2, partitions={"public": [-99, -13, 0, 1, 2, 500]}),
    {**query("filtered", ["key"], METRICS[:3], l0=2, m=3, partitions={"selection": "laplace_threshold"}),
     "filter": "uid % 3 = 0 and uid > 0"},
    query("auto", ["key"], METRICS[:3], partitions={"public": [-99, -13, 0, 1, 2, 500]}) | {
        "contribution_bounds": {"max_partitions_contributed": "auto", "max_contributions_per_partition": "auto"}},
]


def releases_both_ways(spec: Path, seed: int, monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[pl.DataFrame,
                                                                                                 pl.DataFrame]]:
    names = [q["name"] for q in json.loads(spec.read_text())["queries"]]
    run_ok(spec, seed)
    ordered = {name: output(spec, name) for name in names}
    with monkeypatch.context() as patch:
        hashed_shards(patch)
        run_ok(spec, seed)
    return {name: (ordered[name], output(spec, name)) for name in names}


def test_row_groups_in_unit_order_release_the_same_tables_as_hashed_shards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small row groups (units cut between them) in three files, many small shards (one across
    two files), one unit over several shards, a filter that empties some shards, quantiles and
    auto bounds."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = ordered_rows(rng, 1500)
    (tmp_path / "data").mkdir()
    # 20 row groups of 500 rows and one of 250 a file: shards of 4 groups, then the 250 rows
    # with the next file's first three groups.
    ends = [0, 20 * 500 + 250, 2 * (20 * 500 + 250), rows.height]
    assert rows.height > ends[2], f"seed={seed}: too few rows for three files"
    for index, (start, end) in enumerate(pairwise(ends)):
        rows[start:end].write_parquet(tmp_path / "data" / f"part-{index}.parquet", row_group_size=500)
    monkeypatch.setattr(shards, "SHARD_ROWS", 2000)
    monkeypatch.setattr(shards, "MIN_SHARD_ROWS", 500)
    spec = write_spec(tmp_path, QUERIES, epsilon=20.0, delta=1e-6, data="data/*.parquet")
    spans = Spans(monkeypatch)
    for name, (ordered, hashed) in releases_both_ways(spec, seed, monkeypatch).items():
        assert ordered.height > 1, f"seed={seed}: {name} released too little for the comparison to mean anything"
        assert ordered.equals(hashed), f"seed={seed}: {name} differs:\n{ordered}\n{hashed}"
    # Four queries (auto bounds read the rows twice), each over rows.height / 2000 shards or more.
    assert spans.loaded >= 5 * rows.height // 2000, f"seed={seed}: {spans.loaded} row groups read as shards"
    # The plume query keeps every row: the long unit's 5,000 at least were bounded apart.
    assert spans.split >= 5000, f"seed={seed}: the long unit's rows were not bounded apart ({spans.split})"
    assert spans.across_files >= 5 * 2, f"seed={seed}: no shard read two files ({spans.across_files})"


@pytest.mark.parametrize("rows_in_groups", ["in unit order", "shuffled"])
def test_compiled_passes_take_rows_in_unit_order_as_they_are_and_release_the_same_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows_in_groups: str) -> None:
    """The compiled passes (large inputs) bound the light units of row groups whose rows are in
    unit order without sorting them (`light_units.add_light_runs`), and sort those whose footers
    are in unit order but whose rows are shuffled within each group: both release what hashed
    shards, always sorted, do. Counts, and sums, means and deviations."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = ordered_rows(rng, 1500)
    if rows_in_groups == "shuffled":
        rows = pl.concat(rows[start:start + 500].sample(fraction=1.0, shuffle=True, seed=start)
                         for start in range(0, rows.height, 500))
    rows.write_parquet(tmp_path / "data.parquet", row_group_size=500)
    monkeypatch.setattr(shards, "SHARD_ROWS", 2000)
    monkeypatch.setattr(shards, "MIN_SHARD_ROWS", 500)
    monkeypatch.setattr(compiled, "COMPILED_FROM_ROWS", 0)
    taken: list[bool] = []
    original = sorted_bounding._Totals.add_light_runs

    def counted(*args: Any) -> np.ndarray | None:
        found = original(*args)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(sorted_bounding._Totals, "add_light_runs", counted)
    counts = query("counts", ["key"], METRICS[:2], l0=3, m=2, partitions={"selection": "gaussian_threshold"})
    spec = write_spec(tmp_path, [QUERIES[0], counts], epsilon=20.0, delta=1e-6, data="data.parquet")
    for name, (ordered, hashed) in releases_both_ways(spec, seed, monkeypatch).items():
        assert ordered.height > 1, f"seed={seed}: {name} released too little for the comparison to mean anything"
        assert ordered.equals(hashed), f"seed={seed}: {name} differs:\n{ordered}\n{hashed}"
    # Two queries over about rows.height / 2000 shards each.
    assert len(taken) >= rows.height // 2000, f"seed={seed}: {len(taken)} shards offered to the runs pass"
    # Shuffled, a shard of the long unit's rows alone is still in unit order.
    assert all(taken) if rows_in_groups == "in unit order" else taken.count(False) > len(taken) // 2, \
        f"seed={seed}: {taken}"


def test_a_shuffled_file_or_one_without_statistics_is_sharded_by_hash(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = ordered_rows(rng, 800)
    monkeypatch.setattr(shards, "SHARD_ROWS", 400)
    spans = Spans(monkeypatch)
    unit = RangeCodes((Digit("uid", -1000, 10_000, pl.Int64(), nulls=False),))
    cases = {
        "shuffled": lambda path: rows.sample(fraction=1.0, shuffle=True, seed=seed % 2**32).write_parquet(
            path, row_group_size=97),
        "no statistics": lambda path: pq.write_table(rows.to_arrow(), path, row_group_size=97, write_statistics=False),
        "ordered": lambda path: rows.write_parquet(path, row_group_size=97),
    }
    for case, write in cases.items():
        path = tmp_path / f"{case}.parquet"
        write(path)
        found = shards._row_groups_in_unit_order((path,), unit.digits[0].column)
        assert (found is not None) == (case == "ordered"), f"seed={seed}: {case}: {found}"
    spec = write_spec(tmp_path, QUERIES[:1], epsilon=20.0, delta=1e-6, data="shuffled.parquet")
    run_ok(spec, seed)
    assert spans.loaded == 0, f"seed={seed}: a shuffled file was read as row groups"


def test_a_unit_outside_its_row_groups_range_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Footers only choose the shards: a row whose unit lies outside what the footers gave its
    row group (a file whose statistics lie) fails the run without showing the unit."""
    seed = fresh_seed()
    rows = ordered_rows(np.random.default_rng(seed), 800)
    rows.write_parquet(tmp_path / "data.parquet", row_group_size=97)
    monkeypatch.setattr(shards, "SHARD_ROWS", 400)
    original = shards._row_groups_in_unit_order

    def lying(*args: Any) -> list[shards._Span] | None:
        found = original(*args)
        assert found is not None
        # Each group's range says one unit less at its top than its rows hold.
        return [replace(group, high=group.high - 1) for group in found]

    monkeypatch.setattr(shards, "_row_groups_in_unit_order", lying)
    spec = write_spec(tmp_path, QUERIES[:1], epsilon=20.0, delta=1e-6)
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 3, f"seed={seed}: {result.exit_code}: {result.output}"
    assert "statistics do not match" in result.output and "Traceback" not in result.output, f"seed={seed}"
    assert not (tmp_path / "out" / "plume.parquet").exists(), f"seed={seed}: a failed run published"


def test_row_groups_group_into_shards_of_at_most_shard_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Consecutive groups up to SHARD_ROWS rows a shard (fewer where the workers would go
    without one); a unit is split where one shard ends with it and the next begins with it."""
    monkeypatch.setattr(shards, "WORKERS", 2)
    # Five row groups of 2^20 rows, two in each of the first two files, one in the third.
    groups = [shards._Span(i // 2, i // 2, i % 2 * 2**20, 2**20, 10 * i, 10 * i + 10) for i in range(5)]
    assert [(s.first, s.last, s.offset, s.rows, s.low, s.high) for s in shards._spans(groups)] == [
        (0, 0, 0, 2**21, 0, 20), (1, 1, 0, 2**21, 20, 40), (2, 2, 0, 2**20, 40, 50)]
    across = groups[1:]  # the second group of file 0 starts at 2^20: it pairs with file 1's first
    assert [(s.first, s.last, s.offset, s.rows) for s in shards._spans(across)] == [
        (0, 1, 2**20, 2**21), (1, 2, 2**20, 2**21)]
    monkeypatch.setattr(shards, "WORKERS", 16)
    assert len(shards._spans(groups)) == 5
    # Fewer shards than the hash would give (three row groups of 3 shards' rows each): by hash.
    too_large = [shards._Span(0, 0, i * 3 * 2**21, 3 * 2**21, 10 * i, 10 * i + 9) for i in range(3)]
    slices = shards.InputSlices((), lambda paths, offset, length: pl.LazyFrame())
    codes = Codes(RangeCodes((Digit("uid", 0, 30, pl.Int64(), nulls=False),)),
                  RangeCodes((Digit("key", 0, 10, pl.Int64(), nulls=True),)), ("key",), 9 * 2**21)
    monkeypatch.setattr(shards, "_row_groups_in_unit_order", lambda *args: too_large)
    assert shards.unit_ordered_shards(slices, codes, []) is None
    # The five groups of 2^20 rows: three shards on two cores, as the hash; five on sixteen, not sixteen.
    monkeypatch.setattr(shards, "_row_groups_in_unit_order", lambda *args: groups)
    assert shards.unit_ordered_shards(slices, codes, []) is None
    monkeypatch.setattr(shards, "WORKERS", 2)
    found = shards.unit_ordered_shards(slices, codes, [])
    assert found is not None and len(found) == 3 + 1  # the last: units split between shards


def test_pyarrow_statistics_of_unsigned_units_are_their_values(tmp_path: Path) -> None:
    """UInt64 units above 2^63 keep their order in the footers dprun reads."""
    table = pa.table({"uid": pa.array([2**63 + 5, 2**63 + 9, 2**64 - 1], pa.uint64())})
    pq.write_table(table, tmp_path / "u.parquet", row_group_size=2)
    found = shards._row_groups_in_unit_order((tmp_path / "u.parquet",), "uid")
    assert found is not None and [(g.low, g.high) for g in found] == [(2**63 + 5, 2**63 + 9), (2**64 - 1, 2**64 - 1)]


def test_each_unit_s_rows_are_in_one_shard_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded shards, split units' shard included, hold every row once and each unit in one
    shard, whatever key its rows have (every unit has rows of the smallest key code, 0)."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    per_unit = rng.integers(1, 6, 600)
    units = np.repeat(np.arange(600), per_unit)
    keys = rng.integers(0, 10, units.size)
    keys[np.r_[0, np.cumsum(per_unit)[:-1]]] = 0
    pl.DataFrame({"uid": units, "key": keys}).write_parquet(tmp_path / "data.parquet", row_group_size=97)
    monkeypatch.setattr(shards, "WORKERS", 2)
    monkeypatch.setattr(shards, "SHARD_ROWS", 400)
    monkeypatch.setattr(shards, "MIN_SHARD_ROWS", 100)
    slices = shards.InputSlices((tmp_path / "data.parquet",),
                                lambda paths, offset, length: pl.scan_parquet(list(paths)).slice(offset, length))
    codes = Codes(RangeCodes((Digit("uid", 0, 600, pl.Int64(), nulls=False),)),
                  RangeCodes((Digit("key", 0, 10, pl.Int64(), nulls=False),)), ("key",), units.size)
    found = shards.unit_ordered_shards(slices, codes, [])
    assert found is not None and len(found) > 5, f"seed={seed}: {found}"
    seen: list[np.ndarray] = []
    for shard in found:  # in order: the split units' shard, last, waits for the others' loads
        packed = shard.load()[shards.PACKED].to_numpy()
        seen.append(np.unique((packed >> codes.key_bits) + shard.first_unit))
    every = np.concatenate(seen)
    assert np.array_equal(np.sort(every), np.arange(600)), f"seed={seed}: a unit is in two shards or in none"


class Clustered:
    """Counts the queries whose text units' row groups were read as shards, and those whose
    bounding found a unit in two of them (and went back to hash shards)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.taken = 0
        self.refused = 0
        # Shards whose unit codes came from the hashes their load computed, and those of them
        # whose hashes were not the units' keyed hashes under the bounding's seed.
        self.carried = 0
        self.wrongly_carried = 0
        original_shards, original_load = shards.clustered_shards, shards._SplitUnits.load
        original_codes = shards.shard_unit_codes

        def clustered(*args: Any) -> list[shards.Shard] | None:
            found = original_shards(*args)
            self.taken += found is not None
            return found

        def load(units: shards._SplitUnits) -> pl.DataFrame:
            try:
                return original_load(units)
            except shards.UnitsNotClustered:
                self.refused += 1
                raise

        def unit_codes(shard: pl.DataFrame, units: ShardUnits, bits: int, seed: int, passes: Any) -> pl.Series:
            if UNIT_HASH in shard.columns:
                self.carried += 1
                self.wrongly_carried += not shard[UNIT_HASH].equals(
                    shard.select(units.value().hash(seed)).to_series(), check_names=False)
            return original_codes(shard, units, bits, seed, passes)

        monkeypatch.setattr(shards, "clustered_shards", clustered)
        monkeypatch.setattr(shards._SplitUnits, "load", load)
        monkeypatch.setattr(shards, "shard_unit_codes", unit_codes)


def text_unit_rows(rng: np.random.Generator) -> pl.DataFrame:
    """`ordered_rows` with text ids and a text key beside the integer one, each unit's rows
    together but the units in no order (text ids sorted as numbers overlap as text)."""
    rows = ordered_rows(rng, 1500).with_columns(pl.format("u{}", "uid").alias("uid"),
                                                pl.format("k{}", "key").alias("tkey"))
    order = pl.DataFrame({"uid": rows["uid"].unique(maintain_order=True).shuffle(int(rng.integers(2**32)))})
    return order.with_row_index("place").join(rows, on="uid").sort("place", maintain_order=True).drop("place")


TEXT_QUERIES = [
    QUERIES[0],
    query("text_key", ["tkey"], METRICS[:3], l0=3, m=2, partitions={"selection": "gaussian_threshold"}),
    query("auto", ["key"], [*METRICS[:3], TREE], partitions={"selection": "gaussian_threshold"}) | {
        "contribution_bounds": {"max_partitions_contributed": "auto", "max_contributions_per_partition": "auto"}},
    # Matched against its public partitions, a join that may reorder them: sharded by hash.
    QUERIES[1],
]


def clustered_and_hashed(spec: Path, seed: int, monkeypatch: pytest.MonkeyPatch
                         ) -> dict[str, tuple[pl.DataFrame, pl.DataFrame]]:
    """Each query's output with text units' row groups read as shards where they hold the units
    together, and sharded by hash, same seed."""
    names = [q["name"] for q in json.loads(spec.read_text())["queries"]]
    run_ok(spec, seed)
    clustered = {name: output(spec, name) for name in names}
    with monkeypatch.context() as patch:
        patch.setattr(shards, "clustered_shards", lambda *args: None)
        run_ok(spec, seed)
    return {name: (clustered[name], output(spec, name)) for name in names}


def counted_same_as_hashed(tmp_path: Path, queries: list[dict[str, Any]], data: str, seed: int,
                           monkeypatch: pytest.MonkeyPatch) -> Clustered:
    """Run the queries over `data` with and without row-group shards for text units, check that
    every output is the same, and return how often row groups were taken and refused."""
    spec = write_spec(tmp_path, queries, epsilon=20.0, delta=1e-6, data=data)
    clustered = Clustered(monkeypatch)
    for name, (found, hashed) in clustered_and_hashed(spec, seed, monkeypatch).items():
        assert found.height > 1, f"seed={seed}: {name} released too little for the comparison to mean anything"
        assert found.equals(hashed), f"seed={seed}: {name} differs:\n{found}\n{hashed}"
    return clustered


def small_compiled_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shards, "SHARD_ROWS", 2000)
    monkeypatch.setattr(shards, "MIN_SHARD_ROWS", 500)
    monkeypatch.setattr(compiled, "COMPILED_FROM_ROWS", 0)


def test_row_groups_holding_text_units_together_release_the_same_tables_as_hashed_shards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Text ids whose rows come together in two files of small row groups (units cut between
    them, one unit over several shards): the groups are read as shards, each span's first and
    last units bounded apart, and every query (a text key, auto bounds, quantiles) releases
    what hash shards do; public partitions are sharded by hash."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = text_unit_rows(rng)
    (tmp_path / "data").mkdir()
    half = rows.height // 2
    for index, part in enumerate((rows[:half], rows[half:])):
        part.write_parquet(tmp_path / "data" / f"part-{index}.parquet", row_group_size=500)
    small_compiled_shards(monkeypatch)
    spans = Spans(monkeypatch)
    clustered = counted_same_as_hashed(tmp_path, TEXT_QUERIES, "data/*.parquet", seed, monkeypatch)
    # Four boundings in row groups (auto bounds read the rows twice), none of which found a unit in two spans.
    assert (clustered.taken, clustered.refused) == (4, 0), f"seed={seed}: {clustered.taken}, {clustered.refused}"
    # The spans' units are hashed once, as they load, and coded from those hashes.
    assert clustered.carried >= 4 and clustered.wrongly_carried == 0, (
        f"seed={seed}: {clustered.carried} shards coded from their loads' hashes, {clustered.wrongly_carried} wrong")
    assert spans.split >= 5000, f"seed={seed}: the long unit's rows were not bounded apart ({spans.split})"


def test_a_text_unit_in_two_row_groups_sends_the_rows_to_hash_shards(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """One row of a unit moved into a span far from its own, where the sample of row groups
    does not see it: the bounding finds the unit in two spans, throws its totals away and
    shards the rows by hash; the release is the hash shards' own."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = text_unit_rows(rng)
    # The long unit last: every unit before it has at most 300 rows.
    longest = rows["uid"].mode()[0]
    rows = pl.concat([rows.filter(pl.col("uid") != longest), rows.filter(pl.col("uid") == longest)])
    # A unit of two rows or more inside the first span (rows 0–1999), its last row moved inside
    # the third (4000–5999): a unit of one row would only move (and no span would share it).
    unit = next(u for u in rows["uid"][1000:1900] if (rows["uid"] == u).sum() >= 2)
    places = np.flatnonzero((rows["uid"] == unit).to_numpy())
    moved = int(places[-1])
    rows = pl.concat([rows[:moved], rows[moved + 1:5000], rows[moved:moved + 1], rows[5000:]])
    assert 0 < places[0] and places[-1] < 1999 and rows["uid"][4999] == unit not in (rows["uid"][4000],
                                                                                    rows["uid"][5999]), (
        f"seed={seed}: the unit must be inside both spans")
    rows.write_parquet(tmp_path / "data.parquet", row_group_size=500)
    small_compiled_shards(monkeypatch)
    monkeypatch.setattr(shards, "_sampled_unit_density", lambda *args: 0.0)
    clustered = counted_same_as_hashed(tmp_path, TEXT_QUERIES[:1], "data.parquet", seed, monkeypatch)
    assert (clustered.taken, clustered.refused) == (1, 1), f"seed={seed}: {clustered.taken}, {clustered.refused}"


def test_text_units_in_no_order_are_sharded_by_hash_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows shuffled: the sample of row groups shares units, and no row group is read as a shard."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    text_unit_rows(rng).sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**32))).write_parquet(
        tmp_path / "data.parquet", row_group_size=500)
    small_compiled_shards(monkeypatch)
    loads: list[Any] = []
    monkeypatch.setattr(shards, "_load_clustered_span", lambda *args: loads.append(args))
    run_ok(write_spec(tmp_path, TEXT_QUERIES[:1], epsilon=20.0, delta=1e-6), seed)
    assert loads == [], f"seed={seed}: {len(loads)} row groups of shuffled rows read as shards"


@pytest.mark.parametrize("sampled", ["as read", "too few units"])
def test_more_units_than_the_check_keeps_send_the_rows_to_hash_shards(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampled: str) -> None:
    """The check keeps 8 bytes a unit, up to MAX_KEPT_UNITS: where the sample of row groups
    foresees more, the rows go by hash at once; where it foresaw too few, the bounding stops
    keeping them, fails the check and goes back to hash shards. The release is the same."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    text_unit_rows(rng).write_parquet(tmp_path / "data.parquet", row_group_size=500)
    small_compiled_shards(monkeypatch)
    monkeypatch.setattr(shards, "MAX_KEPT_UNITS", 200)
    if sampled == "too few units":
        monkeypatch.setattr(shards, "_sampled_unit_density", lambda *args: 0.0)
    clustered = counted_same_as_hashed(tmp_path, TEXT_QUERIES[:1], "data.parquet", seed, monkeypatch)
    expected = (0, 0) if sampled == "as read" else (1, 1)
    assert (clustered.taken, clustered.refused) == expected, f"seed={seed}: {clustered.taken}, {clustered.refused}"


def test_distinct_values_are_those_of_np_unique_whatever_their_runs() -> None:
    """`_distinct` drops repeats in a row before it sorts: the same values as np.unique, sorted,
    for values in runs (units listed together), in no order, or none."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for _ in range(200):
        values = rng.integers(0, int(rng.choice([3, 50, 2**62])), int(rng.integers(0, 400)), dtype=np.int64)
        listed = np.repeat(values, rng.integers(1, 5, values.size)) if rng.random() < 0.5 else values
        found = shards._distinct(listed)
        assert np.array_equal(found, np.unique(listed)), f"seed={seed}: {listed} gave {found}"


@pytest.mark.parametrize("layout", ["in order", "dense, in no order", "sparse, in no order"])
def test_unit_values_are_those_of_each_code_asked_for_whatever_the_shard_s_order(layout: str) -> None:
    """`_unit_values` gives each code's unit values, in the order asked (repeats included):
    from a binary search where the shard's codes are in order, a scatter of places where they
    are dense, a filter where they are neither, and the same values in all three."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    for _ in range(50):
        units = int(rng.integers(1, 60))
        codes_of_units = np.arange(units) * (3 * 2**40 if layout.startswith("sparse") else 1)
        rows = np.repeat(codes_of_units, rng.integers(1, 6, units))
        if layout != "in order":
            rng.shuffle(rows)
        names = np.array([f"u{code}" for code in codes_of_units])
        shard_units = pl.DataFrame({UNIT: rows, "user": names[np.searchsorted(codes_of_units, rows)],
                                    "day": (rows % 7).astype(np.int8)})
        asked = rng.choice(codes_of_units, int(rng.integers(0, 3 * units)))
        found = shards._unit_values(shard_units, asked)
        expected = pl.DataFrame({"user": names[np.searchsorted(codes_of_units, asked)],
                                 "day": (asked % 7).astype(np.int8)})
        assert found.equals(expected), f"seed={seed}: {layout}"


@pytest.mark.parametrize("batch", [shards.DISTINCT_CHECK_BATCH, 64, 1])
def test_the_distinct_hashes_check_finds_a_hash_in_two_parts_in_every_range(monkeypatch: pytest.MonkeyPatch,
                                                                             batch: int) -> None:
    """`_all_distinct` checks sorted sets of hashes range by range of values (up to 256 ranges):
    it agrees with np.unique on random sets, and a hash shared by two of them, wherever it lies
    (the ends of the range of uint64 included), makes it false."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(shards, "DISTINCT_CHECK_BATCH", batch)
    for _ in range(60):
        parts = [shards._distinct(np.concatenate([rng.integers(0, 2**64, int(size), dtype=np.uint64),
                                                  rng.choice(np.array([0, 2**63, 2**64 - 1], np.uint64), 1)]))
                 for size in rng.integers(0, 3000, int(rng.integers(2, 6)))]
        joined = np.concatenate(parts)
        assert shards._all_distinct(parts) == (np.unique(joined).size == joined.size), f"seed={seed}, batch={batch}"
        shared = joined[int(rng.integers(joined.size))]
        others = [i for i, part in enumerate(parts) if shared not in part]
        if not others:  # an end of the range drawn into every part: already shared
            continue
        into = others[int(rng.integers(len(others)))]
        parts[into] = np.sort(np.append(parts[into], shared))
        assert not shards._all_distinct(parts), f"seed={seed}, batch={batch}: hash {shared} in two parts not found"

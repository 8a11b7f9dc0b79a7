"""Rows of packed codes gathered into shards in memory (dprun/engines/shard_scatter.py and
`shards.scattered_shards`): the compiled pass groups exactly as its reference, units with a
common stride fill every shard, rows held past the budget go to scratch files and come back
whole, and no released number depends on how the rows reached their shards. Seeds come from
os.urandom and are part of every message.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import fresh_seed, invoke
from engine_specs import output, query, run_ok, write_spec
from test_sorted_bounding import METRICS, heavy_tailed_rows

from dprun.engines import compiled, shard_scatter, shards


def reference_shards(codes: np.ndarray, key_bits: int, seed: int, count: int) -> np.ndarray:
    """Each code's shard as `group_by_shard`'s docstring defines it, in Python integers."""
    first, second = shard_scatter.multipliers(seed)
    mask = (1 << 32) - 1
    found = []
    for code in codes.tolist():
        unit = code >> key_bits
        mixed = ((unit ^ (unit >> 32)) & mask) * first & mask
        mixed = (mixed ^ (mixed >> 16)) * second & mask
        found.append(mixed * count >> 32)
    return np.array(found, np.int64)


def grouped(group: compiled.GroupByShard, codes: np.ndarray, key_bits: int, seed: int, count: int
            ) -> tuple[np.ndarray, np.ndarray]:
    first, second = shard_scatter.multipliers(seed)
    out, bounds = np.empty_like(codes), np.empty(count + 1, np.int64)
    group(codes, key_bits, first, second, count, out, bounds)
    return out, bounds


@pytest.mark.parametrize("run", ["python", "compiled"])
def test_codes_are_grouped_by_their_unit_s_shard_in_their_order(run: str) -> None:
    seed = fresh_seed(8)
    rng = np.random.default_rng(seed)
    key_bits, count = 20, 37
    units = rng.integers(0, 2**40, 3000)
    codes = units[rng.integers(0, units.size, 20_000)] << key_bits | rng.integers(0, 2**key_bits, 20_000)
    codes.flags.writeable = False  # as Polars gives them
    group = shard_scatter.group_by_shard if run == "python" else compiled.compiled_scatter().result()
    out, bounds = grouped(group, codes, key_bits, seed, count)
    expected = reference_shards(codes, key_bits, seed, count)
    order = np.argsort(expected, kind="stable")
    assert np.array_equal(out, codes[order]), f"seed={seed}"
    assert np.array_equal(bounds, np.r_[0, np.cumsum(np.bincount(expected, minlength=count))]), f"seed={seed}"


@pytest.mark.parametrize("stride", [1, 7, 1000, 2**10, 2**20])
def test_units_with_a_common_stride_fill_every_shard(stride: int) -> None:
    """48 shards of 10^5 units (ids in steps of `stride`) each hold within 1.25× of the mean, for
    each of ten secrets: a shard's count is binomial with a standard deviation of 45 around its
    mean of 2,083 where the mix spreads them, so a correct mix passes by more than ten of them."""
    units = np.arange(100_000, dtype=np.int64) * stride
    group = compiled.compiled_scatter().result()
    for _ in range(10):
        seed = fresh_seed(8)
        _, bounds = grouped(group, units << 20, 20, seed, 48)
        sizes = np.diff(bounds)
        assert sizes.max() < 1.25 * units.size / 48 and sizes.min() > 0.75 * units.size / 48, f"seed={seed}: {sizes}"


def test_rows_held_past_the_budget_are_spilled_and_loaded_whole(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed(8)
    rng = np.random.default_rng(seed)
    count = 5
    monkeypatch.setattr(shard_scatter, "HELD_BYTES", 3000 * 8)
    held = shard_scatter.HeldShards(count, tmp_path / "held")
    # 900 to 1,099 rows a batch: a spill every three or four batches, the last batches' rows held.
    batches = [rng.integers(0, 2**40, int(rng.integers(900, 1100))) for _ in range(14)]
    spills = 0
    for batch in batches:
        out, bounds = grouped(shard_scatter.group_by_shard, batch, 10, seed, count)
        spilled = held.held
        held.add(out, bounds)
        spills += held.held < spilled + out.nbytes
    assert spills >= 3, f"seed={seed}: {spills} spills"
    every = np.concatenate(batches)
    expected = reference_shards(every, 10, seed, count)
    assert held.with_rows() == sorted(set(expected.tolist())), f"seed={seed}"
    for shard in held.with_rows():
        loaded = held.load(shard)
        assert loaded.flags.writeable, f"seed={seed}: shard {shard} is not its own array"
        assert np.array_equal(np.sort(loaded), np.sort(every[expected == shard])), f"seed={seed}: shard {shard}"
    assert not list((tmp_path / "held").iterdir()), f"seed={seed}: scratch files left"


def test_shards_gathered_in_memory_spilled_or_sunk_release_the_same_tables(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A shuffled input, a count's query: its shards gathered in memory, then with every few
    batches spilled to files, then through Polars' partitioned sink (numpy's passes): the same
    tables under one seed."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    rows = heavy_tailed_rows(rng, 1500)
    rows.sample(fraction=1.0, shuffle=True, seed=seed % 2**32).write_parquet(tmp_path / "data.parquet",
                                                                             row_group_size=500)
    monkeypatch.setattr(shards, "SHARD_ROWS", 2000)
    monkeypatch.setattr(shards, "MIN_SHARD_ROWS", 500)
    monkeypatch.setattr(shards, "SCATTER_BATCH_ROWS", 700)
    monkeypatch.setattr(compiled, "COMPILED_FROM_ROWS", 0)
    loads, spills = [0], [0]
    original_load, original_spill = shard_scatter.HeldShards.load, shard_scatter.HeldShards.spill

    def load(held: shard_scatter.HeldShards, shard: int) -> np.ndarray:
        loads[0] += 1
        return original_load(held, shard)

    def spill(held: shard_scatter.HeldShards) -> None:
        spills[0] += 1
        original_spill(held)

    monkeypatch.setattr(shard_scatter.HeldShards, "load", load)
    monkeypatch.setattr(shard_scatter.HeldShards, "spill", spill)
    counts = query("counts", ["key"], METRICS[:2], l0=3, m=2, partitions={"selection": "gaussian_threshold"})
    spec = write_spec(tmp_path, [counts], epsilon=20.0, delta=1e-6)
    released: list[pl.DataFrame] = []

    def release(**patches: Any) -> None:
        with monkeypatch.context() as patch:
            for name, value in patches.items():
                patch.setattr(shard_scatter if name == "HELD_BYTES" else compiled, name, value)
            run_ok(spec, seed)
        released.append(output(spec, "counts"))

    release()
    assert loads[0] >= rows.height // 2000 and spills[0] == 0, f"seed={seed}: {loads} loads, {spills} spills"
    release(HELD_BYTES=1500 * 8)
    # A spill each time more than 1,500 rows are held: with batches of up to ~700 rows, one in 4,000 at the least.
    assert spills[0] >= rows.height // 4000, f"seed={seed}: {spills} spills"
    loaded = loads[0]
    release(COMPILED_FROM_ROWS=2**62)
    assert loads[0] == loaded, f"seed={seed}: numpy's passes gathered the shards in memory"
    assert released[0].height > 1, f"seed={seed}: too little released for the comparison to mean anything"
    for other in released[1:]:
        assert released[0].equals(other), f"seed={seed}:\n{released[0]}\n{other}"


def test_a_row_without_a_code_fails_the_run_without_publishing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row the footers' ranges do not hold (its code null) fails the run as the sorted path's
    own check does (exit 3, no value shown, nothing published)."""
    seed = fresh_seed()
    rows = heavy_tailed_rows(np.random.default_rng(seed), 800)
    rows.sample(fraction=1.0, shuffle=True, seed=seed % 2**32).write_parquet(tmp_path / "data.parquet")
    monkeypatch.setattr(shards, "SHARD_ROWS", 400)
    monkeypatch.setattr(compiled, "COMPILED_FROM_ROWS", 0)
    original = shards._packed_frame

    def one_null(*args: Any) -> pl.LazyFrame:
        frame = original(*args)
        return frame.with_columns(pl.when(pl.int_range(pl.len()) == 17).then(None).otherwise(pl.col(shards.PACKED))
                                  .alias(shards.PACKED))

    monkeypatch.setattr(shards, "_packed_frame", one_null)
    spec = write_spec(tmp_path, [query("counts", ["key"], METRICS[:2], l0=3, m=2)], epsilon=20.0, delta=1e-6)
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 3, f"seed={seed}: {result.exit_code}: {result.output}"
    assert "statistics do not match" in result.output and "Traceback" not in result.output, f"seed={seed}"
    assert not (tmp_path / "out" / "counts.parquet").exists(), f"seed={seed}: a failed run published"


def test_a_scratch_disk_that_fails_a_spill_ends_the_run_as_the_scratch_disk_s_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows held past the budget that cannot be written out: exit 6 with the operating system's
    words and the scratch folder named, no traceback, nothing published."""
    seed = fresh_seed()
    rows = heavy_tailed_rows(np.random.default_rng(seed), 800)
    rows.sample(fraction=1.0, shuffle=True, seed=seed % 2**32).write_parquet(tmp_path / "data.parquet")
    monkeypatch.setattr(shards, "SHARD_ROWS", 400)
    monkeypatch.setattr(shards, "SCATTER_BATCH_ROWS", 300)
    monkeypatch.setattr(compiled, "COMPILED_FROM_ROWS", 0)
    monkeypatch.setattr(shard_scatter, "HELD_BYTES", 500 * 8)

    def full_disk(held: shard_scatter.HeldShards) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(shard_scatter.HeldShards, "spill", full_disk)
    spec = write_spec(tmp_path, [query("counts", ["key"], METRICS[:2], l0=3, m=2)], epsilon=20.0, delta=1e-6)
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 6, f"seed={seed}: {result.exit_code}: {result.output}"
    assert "cannot write intermediate files" in result.output and os.strerror(errno.ENOSPC) in result.output, \
        f"seed={seed}: {result.output}"
    assert "Traceback" not in result.output and not (tmp_path / "out" / "counts.parquet").exists(), f"seed={seed}"

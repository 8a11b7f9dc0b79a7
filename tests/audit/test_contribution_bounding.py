"""Contribution bounding, checked on the engine's exact integer aggregates.

A privacy unit with 10^5 rows spread over 10^3 partitions, its values far outside the bounds
(±10^9, ±inf, NaN, nulls), is added to a background of 5,000 ordinary units. With the same hash
key for both datasets, the engine's pre-noise per-partition sums (`dp_audit.pre_noise_sums`: the
sorted path's bounding and `partition_sums`) with and without that unit may differ only by what
the bounds allow: in at most L0 partitions, by at most L∞ (m rows' worth at the largest bounded
value) per partition and quantity, so by at most L0·L∞ in total. When every heavy value sits
beyond the upper bound the difference is exactly that worst case (the bound is tight, not just
respected). Sharding the units over several files changes no sum, and the unit counts that
private partition selection reads move by at most one in at most L0 partitions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import dp_audit
from dprun.engines import polars_steps, shards
from dprun.plan import QueryPlan

HEAVY = "SECRET-HEAVY-UNIT"
LOWER, UPPER = -5.0, 10.0
L0, M = 5, 3
N_KEYS, HEAVY_ROWS = 1000, 100_000
METRICS = [
    {"name": "n", "kind": "count"},
    {"name": "people", "kind": "privacy_id_count"},
    {"name": "total", "kind": "sum", "column": "v", "bounds": [LOWER, UPPER]},
    {"name": "avg", "kind": "mean", "column": "v", "bounds": [LOWER, UPPER]},
    {"name": "var", "kind": "variance", "column": "v", "bounds": [LOWER, UPPER]},
]
KEYS = [f"k{i:04d}" for i in range(N_KEYS)]


def background(rng: np.random.Generator) -> pl.DataFrame:
    units = 5000
    per_unit = rng.integers(1, 9, units)  # many units exceed L0 or m
    rows = int(per_unit.sum())
    values = rng.uniform(LOWER - 10, UPPER + 10, rows)
    values[rng.random(rows) < 0.02] = np.nan
    values[rng.random(rows) < 0.01] = np.inf
    keys = [KEYS[i] if i < N_KEYS else f"unlisted-{i}" for i in rng.integers(0, N_KEYS + 50, rows)]
    frame = pl.DataFrame({"uid": np.repeat([f"u{i}" for i in range(units)], per_unit), "key": keys, "v": values})
    return frame.with_columns(v=pl.when(pl.Series(rng.random(rows) < 0.02)).then(None).otherwise(pl.col("v")))


def heavy_unit(rng: np.random.Generator, values: str) -> pl.DataFrame:
    """10^5 rows over the 10^3 listed keys (100 each), plus rows in unlisted keys."""
    keys = np.repeat(KEYS, HEAVY_ROWS // N_KEYS).tolist() + [f"unlisted-h{i}" for i in range(500)]
    if values == "beyond_upper":
        v = np.full(len(keys), 1e9)
    else:
        v = rng.choice(np.array([1e9, -1e9, np.inf, -np.inf, np.nan, 3.3, -4.9]), len(keys))
    frame = pl.DataFrame({"uid": [HEAVY] * len(keys), "key": keys, "v": v})
    if values == "mixed":
        frame = frame.with_columns(v=pl.when(pl.Series(rng.random(len(keys)) < 0.1)).then(None).otherwise(pl.col("v")))
    return frame


def write(folder: Path, frame: pl.DataFrame, rng: np.random.Generator, partitions: dict[str, Any] | None,
          group_by: bool = True) -> tuple[QueryPlan, Any]:
    folder.mkdir(parents=True)
    frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**32))).write_parquet(folder / "data.parquet")
    query: dict[str, Any] = {
        "name": "q", "input": "data",
        "contribution_bounds": {"max_partitions_contributed": L0, "max_contributions_per_partition": M},
        "metrics": METRICS, "output": {"path": "out/q.parquet"},
    }
    if group_by:
        query["group_by"] = ["key"]
    if partitions is not None:
        query["partitions"] = partitions
    spec = {"version": 1, "privacy_unit": "uid", "budget": {"epsilon": 1.0, "delta": 1e-6},
            "inputs": {"data": {"path": "data.parquet"}}, "queries": [query], "report": "out/report.json"}
    (folder / "spec.yaml").write_text(json.dumps(spec))
    plan, validated = dp_audit.plan_and_inputs(folder / "spec.yaml")
    return plan, validated


def check_bounded_difference(plan: QueryPlan, before: pl.DataFrame, after: pl.DataFrame, seed: int,
                             exact: bool, l0: int = L0) -> None:
    changed = dp_audit.changed_partitions(before, after, plan)
    assert len(changed) <= l0, f"seed={seed}: the unit changed {len(changed)} partitions > L0 = {l0}"
    for noisy in plan.quantities:
        q = noisy.quantity
        diff = [int(after[q.id][i]) - int(before[q.id][i]) for i in range(before.height)]
        worst = max(abs(d) for d in diff)
        assert worst <= q.linf_units, f"seed={seed}: {q.id} moved by {worst} units > L∞ = {q.linf_units}"
        assert sum(abs(d) for d in diff) <= l0 * q.linf_units, f"seed={seed}: {q.id}: L1 above L0·L∞"
        if exact:
            # Every heavy value lies beyond the upper bound: exactly L0 partitions move by exactly L∞.
            assert sorted(abs(d) for d in diff if d) == [q.linf_units] * l0, (
                f"seed={seed}: {q.id}: {[d for d in diff if d]}, expected {l0} × {q.linf_units}")


@pytest.mark.parametrize("values", ["beyond_upper", "mixed"])
def test_a_unit_with_a_hundred_thousand_rows_moves_the_exact_sums_by_at_most_its_bounds(
        tmp_path: Path, values: str) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    rng = np.random.default_rng(seed % 2**63)
    base = background(rng)
    with_heavy = pl.concat([base, heavy_unit(rng, values)])
    plan, v_without = write(tmp_path / "without", base, rng, {"public": KEYS})
    plan_with, v_with = write(tmp_path / "with", with_heavy, rng, {"public": KEYS})
    for trial in range(3):  # three hash keys: the unit keeps different partitions each time
        hash_seed = (seed + trial) % 2**64
        before = dp_audit.pre_noise_sums(plan, v_without, hash_seed, tmp_path / f"w{trial}")
        after = dp_audit.pre_noise_sums(plan_with, v_with, hash_seed, tmp_path / f"h{trial}")
        assert before.height == after.height == N_KEYS
        check_bounded_difference(plan, before, after, seed, exact=values == "beyond_upper")


def test_sharding_the_units_changes_no_exact_sum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    rng = np.random.default_rng(seed % 2**63)
    plan, validated = write(tmp_path / "data", pl.concat([background(rng), heavy_unit(rng, "mixed")]), rng,
                            {"public": KEYS})
    hash_seed = seed % 2**64
    whole = dp_audit.pre_noise_sums(plan, validated, hash_seed, tmp_path / "one")
    rows = pl.scan_parquet(validated.inputs["data"].paths).select(pl.len()).collect().item()
    monkeypatch.setattr(shards, "SHARD_ROWS", rows // 8)
    count = -(-rows // shards.SHARD_ROWS)
    assert count >= 8, f"the test should split the units over several shards, not {count}"
    sharded = dp_audit.pre_noise_sums(plan, validated, hash_seed, tmp_path / "many")
    assert sharded.equals(whole), f"seed={seed}: {count} shards give other exact sums than one"


def test_the_global_partition_moves_by_at_most_one_partitions_worth(tmp_path: Path) -> None:
    """Without group_by there is one partition: the unit's 10^5 rows count as at most m rows."""
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    rng = np.random.default_rng(seed % 2**63)
    base = background(rng)
    plan, v_without = write(tmp_path / "without", base, rng, None, group_by=False)
    plan_with, v_with = write(tmp_path / "with", pl.concat([base, heavy_unit(rng, "beyond_upper")]), rng, None,
                              group_by=False)
    before = dp_audit.pre_noise_sums(plan, v_without, seed % 2**64, tmp_path / "a")
    after = dp_audit.pre_noise_sums(plan_with, v_with, seed % 2**64, tmp_path / "b")
    check_bounded_difference(plan, before, after, seed, exact=True, l0=1)


def unit_counts(plan: QueryPlan, validated: Any, hash_seed: int, workdir: Path) -> pl.DataFrame:
    """The per-partition unit counts private selection decides on (the engine's first bounding)."""
    counts = dp_audit.bounding(plan, validated, hash_seed, workdir).unit_counts()
    return counts.rename({polars_steps.UNITS: "units"})


def test_private_selection_sees_the_unit_in_at_most_l0_partitions(tmp_path: Path) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    rng = np.random.default_rng(seed % 2**63)
    base = background(rng)
    plan, v_without = write(tmp_path / "without", base, rng, {"selection": "truncated_geometric"})
    plan_with, v_with = write(tmp_path / "with", pl.concat([base, heavy_unit(rng, "mixed")]), rng,
                              {"selection": "truncated_geometric"})
    before = unit_counts(plan, v_without, seed % 2**64, tmp_path / "a")
    after = unit_counts(plan_with, v_with, seed % 2**64, tmp_path / "b")
    joined = after.join(before, on="key", how="full", coalesce=True, suffix="_before").fill_null(0)
    diff = (joined["units"] - joined["units_before"]).to_numpy()
    assert set(np.unique(diff).tolist()) <= {0, 1}, f"seed={seed}: unit counts moved by {np.unique(diff)}"
    # The unit has rows in 10^3 listed and 500 unlisted keys, all eligible here: it counts in exactly L0.
    assert int(diff.sum()) == L0, f"seed={seed}: the unit counts in {int(diff.sum())} partitions, L0 = {L0}"

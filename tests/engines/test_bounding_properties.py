"""The engine's bounded per-partition sums against a brute-force reference, on random small tables.

Units are integers, text or compound (text, integer); keys are integers, text, dates or two
columns (text, boolean), with nulls. The reference walks the rows in Python: per (unit,
partition) pair it bounds the partials to m rows' worth, and per unit it keeps the L0 pairs
with the most rows, ties by the smallest keyed hash of the unit's and the key's values — the
choice the engine makes with the same key. Both boundings are checked: the first, and Plume's second among a random
set of chosen partitions; light units through numpy's passes or the compiled loop.
"""

from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from datetime import date, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dprun import api
from dprun.engines import compiled as compiled_passes
from dprun.engines import polars_engine, shards, sorted_bounding
from dprun.engines.polars_steps import UNITS, row_units
from dprun.engines.sorted_bounding import key_seed, tie_hashes, value_hashes
from dprun.plan import QueryPlan

UNIT_KINDS = {"int": ["uid"], "text": ["uid"], "compound": ["uid", "day"]}
KEY_KINDS = {"int": ["key"], "text": ["key"], "date": ["key"], "two": ["key", "flag"]}
Sums = dict[tuple[Any, ...], dict[str, int]]


def random_rows(rng: np.random.Generator, unit_kind: str, key_kind: str, units: int, keys: int) -> pl.DataFrame:
    per_unit = rng.integers(1, 25, units)
    uid = np.repeat(rng.permutation(units) * 3 - 20, per_unit)
    n = uid.size
    key = rng.integers(0, keys, n)
    columns: dict[str, Any] = {
        "uid": uid.tolist() if unit_kind == "int" else [f"user-{u}" for u in uid],
        "key": {"int": (key * 5 - 7).tolist(), "text": [f"k{k}" for k in key], "two": [f"k{k % 3}" for k in key],
                "date": [date(2024, 1, 1) + timedelta(days=int(k)) for k in key]}[key_kind],
        "value": np.round(rng.normal(4, 5, n), 2).tolist(),
    }
    nulls = rng.random(n) < 0.1
    columns["key"] = [None if null else k for k, null in zip(columns["key"], nulls, strict=True)]
    # Missing values in some shards and not in others (a shard without any counts a pair's rows as its values).
    missing = rng.random(n) < rng.choice([0.0, 0.05])
    columns["value"] = [None if gone else v for v, gone in zip(columns["value"], missing, strict=True)]
    if unit_kind == "compound":
        columns["day"] = rng.integers(0, 2, n).tolist()
    if key_kind == "two":
        columns["flag"] = [None if k % 4 == 3 else bool(k % 2) for k in key.tolist()]
    return pl.DataFrame(columns).sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**32)))


def write_spec(folder: Path, unit_kind: str, key_kind: str, l0: int, m: int, counts_only: bool) -> Path:
    """A spec of a count, a count of units and, unless `counts_only`, a sum (counts alone sort
    the codes without their places, and read no value)."""
    total = [] if counts_only else [{"name": "total", "kind": "sum", "column": "value", "bounds": [-3, 12]}]
    spec = {
        "version": 1,
        "privacy_unit": UNIT_KINDS[unit_kind],
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"data": {"path": "data.parquet"}},
        "queries": [{
            "name": "q", "input": "data", "group_by": KEY_KINDS[key_kind],
            "contribution_bounds": {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
            "metrics": [{"name": "rows", "kind": "count"}, {"name": "people", "kind": "privacy_id_count"}, *total],
            "partitions": {"selection": "gaussian_threshold"},
            "output": {"path": "out/q.parquet"},
        }],
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec))
    return path


def reference(rows: pl.DataFrame, plan: QueryPlan, seed: int, chosen: set[tuple[Any, ...]] | None) -> Sums:
    """Per partition key: units and each quantity's bounded sum, by brute force."""
    units, keys, m = list(plan.privacy_unit), list(plan.group_by), plan.max_rows
    summed = [q.quantity for q in plan.quantities if q.quantity.aggregate not in ("rows", "privacy_units")]
    table = rows.with_columns(pl.col("value").cast(pl.Float64)).with_columns(
        row_units(q).alias(q.id) for q in summed)
    pairs: dict[tuple[Any, ...], dict[tuple[Any, ...], list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in table.iter_rows(named=True):
        pairs[tuple(row[c] for c in units)][tuple(row[c] for c in keys)].append(row)
    pairs_present = table.select(*units, *keys).unique()
    hashed = pairs_present.with_columns(h=tie_hashes(value_hashes(pairs_present.select(units), seed),
                                                     value_hashes(pairs_present.select(keys), key_seed(seed))))
    rank = {(tuple(r[c] for c in units), tuple(r[c] for c in keys)): r["h"] for r in hashed.iter_rows(named=True)}
    sums: Sums = defaultdict(lambda: defaultdict(int))
    for unit, by_key in pairs.items():
        eligible = [k for k in by_key if chosen is None or k in chosen]
        for key in sorted(eligible, key=lambda k: (-len(by_key[k]), rank[(unit, k)]))[:plan.max_partitions]:
            values = by_key[key]
            total = sums[key]
            total[UNITS] += 1
            for noisy in plan.quantities:
                q = noisy.quantity
                if q.aggregate == "rows":
                    total[q.id] += min(len(values), m)
                elif q.aggregate == "privacy_units":
                    total[q.id] += 1
                else:
                    present = [v[q.id] for v in values if v[q.id] is not None]
                    # A kept pair whose values are all missing adds nothing, but its partition has the sum (0).
                    total[q.id] += sum(present) * min(len(present), m) // len(present) if present else 0
    return {key: dict(value) for key, value in sums.items()}


def engine_sums(frame: pl.DataFrame, keys: list[str]) -> Sums:
    return {tuple(r[c] for c in keys): {c: int(v) for c, v in r.items() if c not in keys}
            for r in frame.iter_rows(named=True)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**63 - 1), unit_kind=st.sampled_from(sorted(UNIT_KINDS)),
       key_kind=st.sampled_from(sorted(KEY_KINDS)), units=st.integers(1, 40), keys=st.integers(1, 12),
       l0=st.integers(1, 4), m=st.integers(1, 3), small_shards=st.booleans(), compiled=st.booleans(),
       counts_only=st.booleans())
def test_bounded_sums_match_a_brute_force_reference(seed: int, unit_kind: str, key_kind: str, units: int,
                                                    keys: int, l0: int, m: int, small_shards: bool,
                                                    compiled: bool, counts_only: bool) -> None:
    rng = np.random.default_rng(seed)
    rows = random_rows(rng, unit_kind, key_kind, units, keys)
    with tempfile.TemporaryDirectory() as folder, mock.patch.object(
            shards, "SHARD_ROWS", 40 if small_shards else shards.SHARD_ROWS), mock.patch.object(
            compiled_passes, "COMPILED_FROM_ROWS", 0 if compiled else compiled_passes.COMPILED_FROM_ROWS):
        rows.write_parquet(Path(folder) / "data.parquet")
        validated = api.validate(write_spec(Path(folder), unit_kind, key_kind, l0, m, counts_only))
        plan = api.plan(validated).queries[0]
        group = list(plan.group_by)
        bounding = polars_engine._bounding(plan, validated.query_inputs["q"], group, (seed, seed), Path(folder))
        first = reference(rows, plan, seed, None)
        counts = engine_sums(bounding.unit_counts(), group)
        assert counts == {k: {UNITS: v[UNITS]} for k, v in first.items()}, f"seed={seed}: units per partition"
        assert engine_sums(bounding.partition_sums(), group) == first, f"seed={seed}: first bounding"
        chosen = {k for k in first if rng.random() < 0.5}
        bounding.restrict(pl.DataFrame([dict(zip(group, k, strict=True)) for k in chosen],
                                       schema=rows.select(group).schema), rebound=True)
        second = reference(rows, plan, seed, chosen)
        assert engine_sums(bounding.partition_sums(), group) == second, f"seed={seed}: second bounding"
    distinct_units = rows.select(list(plan.privacy_unit)).n_unique()
    count = next(q.quantity.id for q in plan.quantities if q.quantity.aggregate == "rows")
    assert sum(t[UNITS] for t in first.values()) <= l0 * distinct_units, f"seed={seed}: a unit kept over L0 partitions"
    assert all(t[count] <= m * t[UNITS] for t in first.values()), f"seed={seed}: a unit counted over m rows"

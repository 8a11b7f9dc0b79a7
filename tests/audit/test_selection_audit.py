"""DP audit of private partition selection: every mechanism the planner can choose.

A partition that exists only because of one privacy unit must appear with probability at most
δ/L0 (the δ the plan spends on selection, spread over the L0 partitions a unit can make
eligible), and partitions whose unit counts differ by one must satisfy the (ε, δ) inequalities;
a partition with many units must almost always appear.

1. Mechanism layer: `selection.select_partitions` on the plan's selection mechanism, vectorised
   over 2·10^6 single-unit partitions (δ = 0.05, large enough to observe); Clopper–Pearson bounds.
   A broken variant (threshold lowered by three noise standard deviations; for the truncated
   geometric, three times the δ) is caught.
2. End to end through the CLI: 2,000 privacy units with far more rows than the bounds allow, each
   alone in its 50 partitions; the share of units that got any partition released must stay
   below δ. An engine without contribution bounding is caught.

Statistical checks fail by chance with probability at most 1e-9 each; the seed comes from
os.urandom and is printed and part of every assertion message.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

import dp_audit
from dp_audit import ALPHA, cp_lower, cp_upper
from dprun import api
from dprun.engines import polars_engine
from dprun.mechanisms import selection
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan
from dprun_testing import invoke

MECHANISMS = ["truncated_geometric", "laplace_threshold", "gaussian_threshold", "released_count"]
DELTA = 0.05
N = 2 * 10**6


def write_spec(folder: Path, mechanism: str, *, l0: int, m: int = 1, epsilon: float = 1.0, delta: float = DELTA,
               data: str = "data.parquet", output: str = "out/q.parquet") -> Path:
    # released_count thresholds the row count, which per-partition bounding caps at m rows per unit;
    # the other mechanisms count units.
    metric = {"name": "rows", "kind": "count"} if mechanism == "released_count" else \
        {"name": "people", "kind": "privacy_id_count"}
    # `basic`: the selection keeps its own planned (ε, δ), which the audits check; under `pld` its noise
    # is scaled down with the others' and only the composed total holds.
    spec = {
        "version": 1, "privacy_unit": "uid", "budget": {"epsilon": epsilon, "delta": delta, "accounting": "basic"},
        "inputs": {"data": {"path": data}},
        "queries": [{"name": "q", "input": "data", "group_by": ["key"],
                     "partitions": {"selection": mechanism, "min_privacy_units": 1},
                     "contribution_bounds": {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
                     "metrics": [metric], "output": {"path": output}}],
        "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def selection_plan(folder: Path, mechanism: str, l0: int, m: int = 1) -> QueryPlan:
    if not (folder / "data.parquet").exists():
        pl.DataFrame({"uid": ["SECRET-ID-9e1f", "u2"], "key": ["a", "b"]}).write_parquet(folder / "data.parquet")
    plan = api.plan(api.validate(write_spec(folder, mechanism, l0=l0, m=m))).queries[0]
    assert plan.selection.mode == "private" and plan.selection.mechanism == mechanism
    return plan


def one_unit_count(plan: QueryPlan) -> int:
    """What one unit adds to the number the mechanism looks at: 1 unit, or m rows (released_count)."""
    detail = plan.selection.detail
    return detail.contribution if isinstance(detail, selection.NoisyThreshold) else 1


def keep_rate(detail: selection.SelectionMechanism, count: int, n: int, source: RandomSource) -> int:
    """How many of n partitions holding `count` are kept (one vectorised call)."""
    return int(selection.select_partitions(detail, np.full(n, count), source).sum())


def broken(detail: selection.SelectionMechanism) -> selection.SelectionMechanism:
    if isinstance(detail, selection.NoisyThreshold):
        return dataclasses.replace(detail, threshold=detail.threshold - 3 * detail.noise.std)
    return dataclasses.replace(detail, delta=3 * detail.delta)


# --- mechanism layer --------------------------------------------------------------------------


@pytest.mark.parametrize("l0", [1, 3])
@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_partition_of_one_unit_appears_with_probability_at_most_delta_over_l0(
        tmp_path: Path, mechanism: str, l0: int) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    plan = selection_plan(tmp_path, mechanism, l0, m=2)
    claim = plan.selection.delta / l0
    assert plan.selection.delta <= DELTA, f"{mechanism}: selection spends δ {plan.selection.delta} > budget"
    source = RandomSource.from_seed(seed)
    count = one_unit_count(plan)
    kept = keep_rate(plan.selection.detail, count, N, source)
    a = ALPHA / 3
    low, high = cp_lower(kept, N, a), cp_upper(kept, N, a)
    print(f"seed={seed} {mechanism} L0={l0}: kept {kept}/{N} single-unit partitions; P(keep) in [{low:.5f}, "
          f"{high:.5f}], claim δ/L0 = {claim:.5f}")
    assert low <= claim, f"seed={seed}: {mechanism} L0={l0}: P(keep | one unit) >= {low:.5f} > δ/L0 = {claim:.5f}"
    # Not vacuous: the mechanisms spend a good part of that δ.
    assert high >= 0.25 * claim, f"seed={seed}: {mechanism}: kept {kept}/{N}, far below the claim {claim}"

    bad = broken(plan.selection.detail)
    kept = keep_rate(bad, count, N, source)
    low = cp_lower(kept, N, a)
    print(f"seed={seed} {mechanism} L0={l0}, broken: kept {kept}/{N}; P(keep) >= {low:.5f}")
    assert low > claim, f"seed={seed}: {mechanism} L0={l0}: the broken selection went unnoticed ({kept}/{N})"


def neighbour_violations(detail: selection.SelectionMechanism, step: int, epsilon: float, delta: float,
                         n_max: int, draws: int, source: RandomSource) -> list[str]:
    """Unit counts n and n+1 (numbers n·step and (n+1)·step) whose keep rates break
    P(keep | n+1) <= e^ε P(keep | n) + δ or P(drop | n) <= e^ε P(drop | n+1) + δ beyond doubt."""
    kept = [0] + [keep_rate(detail, n * step, draws, source) for n in range(1, n_max + 1)]
    a = ALPHA / (4 * n_max)
    found = []
    for n in range(n_max):
        k0, k1 = kept[n], kept[n + 1]
        # A partition with no unit is never kept: P(keep | 0) = 0 exactly.
        if cp_lower(k1, draws, a) - math.exp(epsilon) * (cp_upper(k0, draws, a) if n > 0 else 0.0) > delta:
            found.append(f"keep {n}→{n + 1}: {k0} vs {k1} of {draws}")
        drop0, drop1 = draws - k0, draws - k1
        if n > 0 and cp_lower(drop0, draws, a) - math.exp(epsilon) * cp_upper(drop1, draws, a) > delta:
            found.append(f"drop {n}→{n + 1}: {drop0} vs {drop1} of {draws}")
    return found


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_neighbouring_unit_counts_satisfy_the_dp_inequalities(tmp_path: Path, mechanism: str) -> None:
    """With L0 = 1 a partition's keep decision is the whole selection of one unit's partition: it
    must be (ε, δ)-DP in the unit count (the count released_count thresholds is the noisy row count,
    whose ε is the count's)."""
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    plan = selection_plan(tmp_path, mechanism, 1, m=2)
    detail = plan.selection.detail
    epsilon, delta = plan.selection.epsilon, plan.selection.delta
    if mechanism == "released_count":
        # Selection is post-processing of the released count, plus the threshold's δ.
        epsilon, delta = detail.noise.epsilon, delta + detail.noise.delta
    step = one_unit_count(plan)
    n_max = selection.units_to_keep(detail, 0.999) + 1
    source = RandomSource.from_seed(seed)
    found = neighbour_violations(detail, step, epsilon, delta, n_max, 2 * 10**5, source)
    print(f"seed={seed} {mechanism}: ε={epsilon:.4f} δ={delta:.4g}, n = 0..{n_max}: {found}")
    assert not found, f"seed={seed}: {mechanism} breaks (ε, δ)-DP between unit counts: {found}"
    # The broken variant breaks the inequality at 0 → 1.
    found = neighbour_violations(broken(detail), step, epsilon, delta, n_max, 2 * 10**5, source)
    assert found, f"seed={seed}: {mechanism}: the broken selection went unnoticed"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_partition_with_many_units_is_almost_always_kept(tmp_path: Path, mechanism: str) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    plan = selection_plan(tmp_path, mechanism, 3, m=2)
    detail = plan.selection.detail
    step = one_unit_count(plan)
    source = RandomSource.from_seed(seed)
    draws = 10**5
    # The plan's promise: units_for_95pct units are kept at least 95% of the time.
    n95 = plan.selection.units_for_95pct
    kept = keep_rate(detail, n95 * step, draws, source)
    assert cp_upper(kept, draws, ALPHA) >= 0.95, f"seed={seed}: {mechanism}: {n95} units kept {kept}/{draws}"
    # Twice as many units as for a 1 − 10^-6 chance: at most a few drops in 10^5.
    many = 2 * selection.units_to_keep(detail, 1 - 1e-6)
    dropped = draws - keep_rate(detail, many * step, draws, source)
    print(f"seed={seed} {mechanism}: {n95} units kept {kept}/{draws}; {many} units dropped {dropped}/{draws}")
    assert dropped <= stats.binom.isf(ALPHA, draws, 1e-6), f"seed={seed}: {mechanism}: {many} units dropped {dropped}"


# --- weighted Gaussian threshold --------------------------------------------------------------


def weighted_keep_rate(detail: selection.WeightedGaussianThreshold, weight: int, n: int,
                       source: RandomSource) -> int:
    """How many of n one-unit partitions holding `weight` (in 2^-20 units) are kept."""
    return int(selection.select_partitions(detail, np.ones(n, dtype=np.int64), source,
                                           np.full(n, weight, dtype=np.int64)).sum())


@pytest.mark.parametrize("partitions", [1, 2, 5])
def test_a_weighted_unit_in_n_partitions_shows_up_in_any_with_probability_at_most_half_delta(
        tmp_path: Path, partitions: int) -> None:
    """A unit alone in its n ≤ L0 partitions adds w(n) to each: each is kept with probability at
    most δ/(2n), so the unit shows up with probability at most δ/2 (the other δ/2 is the noise's).
    The broken variant (threshold lowered by three noise standard deviations) is caught."""
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    plan = selection_plan(tmp_path, "weighted_gaussian_threshold", 5)
    detail = plan.selection.detail
    assert isinstance(detail, selection.WeightedGaussianThreshold)
    claim = plan.selection.delta / 2 / partitions
    weight = int(selection.unit_weights(np.array([partitions]))[0])
    source = RandomSource.from_seed(seed)
    a = ALPHA / 6
    kept = weighted_keep_rate(detail, weight, N, source)
    low, high = cp_lower(kept, N, a), cp_upper(kept, N, a)
    print(f"seed={seed} n={partitions}: kept {kept}/{N}; P(keep) in [{low:.5f}, {high:.5f}], claim {claim:.5f}")
    assert low <= claim, f"seed={seed}: n={partitions}: P(keep) >= {low:.5f} > δ/(2n) = {claim:.5f}"
    if partitions == 5:  # the threshold is set by n = L0 here: the claim is nearly spent
        assert high >= 0.25 * claim, f"seed={seed}: kept {kept}/{N}, far below the claim {claim}"
    lowered = dataclasses.replace(detail, threshold=detail.threshold - 3 * detail.noise.std)
    kept = weighted_keep_rate(lowered, weight, N, source)
    assert cp_lower(kept, N, a) > claim, f"seed={seed}: the broken weighted selection went unnoticed ({kept}/{N})"


def test_weighted_neighbouring_counts_satisfy_the_dp_inequalities(tmp_path: Path) -> None:
    """With L0 = 1 every unit weighs one count: partitions of n and n + 1 units must satisfy (ε, δ)."""
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    plan = selection_plan(tmp_path, "weighted_gaussian_threshold", 1)
    detail = plan.selection.detail
    assert isinstance(detail, selection.WeightedGaussianThreshold)
    one = int(selection.unit_weights(np.array([1]))[0])
    n_max = selection.units_to_keep(detail, 0.999) + 1
    source = RandomSource.from_seed(seed)
    draws = 2 * 10**5
    a = ALPHA / (4 * n_max)
    kept = [0] + [weighted_keep_rate(detail, n * one, draws, source) for n in range(1, n_max + 1)]
    eps, delta = plan.selection.epsilon, plan.selection.delta
    for n in range(n_max):
        k0, k1 = kept[n], kept[n + 1]
        gap = cp_lower(k1, draws, a) - math.exp(eps) * (cp_upper(k0, draws, a) if n > 0 else 0.0)
        assert gap <= delta, f"seed={seed}: keep {n}→{n + 1}: {k0} vs {k1} of {draws}"
        if n > 0:
            gap = cp_lower(draws - k0, draws, a) - math.exp(eps) * cp_upper(draws - k1, draws, a)
            assert gap <= delta, f"seed={seed}: drop {n}→{n + 1}: {k0} vs {k1} of {draws}"


# --- end to end through the CLI ------------------------------------------------------------------


UNITS, PER_UNIT, ROWS, L0 = 2000, 50, 3, 4
BIG_UNITS = 1000


@pytest.fixture(scope="module")
def heavy_units(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 units, each alone in its 50 partitions with 3 rows there (L0 = 4, m = 1), and 5
    partitions of 1,000 one-row units each."""
    folder = tmp_path_factory.mktemp("heavy")
    unit = np.repeat(np.arange(UNITS), PER_UNIT * ROWS)
    part = np.repeat(np.arange(UNITS * PER_UNIT), ROWS)
    heavy = pl.DataFrame({"uid": [f"SECRET-ID-{u}" for u in unit], "key": [f"h{u}-{p}" for u, p in zip(unit, part)]})
    big = pl.DataFrame({"uid": [f"b{i}" for i in range(5 * BIG_UNITS)],
                        "key": [f"big{i % 5}" for i in range(5 * BIG_UNITS)]})
    pl.concat([heavy, big]).sample(fraction=1.0, shuffle=True, seed=11).write_parquet(folder / "data.parquet")
    return folder / "data.parquet"


def released_units(spec: Path, seed: int) -> tuple[int, set[str]]:
    result = invoke("run", str(spec), "--seed", str(seed), "--overwrite")
    assert result.exit_code == 0, f"seed={seed}: exit {result.exit_code}: {result.output}"
    keys = pl.read_parquet(spec.parent / "out" / "q.parquet")["key"].to_list()
    heavy = {k.split("-")[0] for k in keys if k.startswith("h")}
    return len(heavy), {k for k in keys if k.startswith("big")}


@pytest.mark.parametrize("mechanism", [*MECHANISMS, "weighted_gaussian_threshold"])
def test_units_alone_in_their_partitions_show_up_at_most_with_probability_delta(
        tmp_path: Path, heavy_units: Path, mechanism: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = dp_audit.fresh_seed() % 2**62
    print(f"seed={seed}")
    monkeypatch.delenv("DPRUN_LEDGER", raising=False)
    spec = write_spec(tmp_path, mechanism, l0=L0, data=str(heavy_units))
    plan = api.plan(api.validate(spec)).queries[0]
    claim = plan.selection.delta
    bound = int(stats.binom.isf(ALPHA, UNITS, claim))
    seen, big = released_units(spec, seed)
    print(f"seed={seed} {mechanism}: {seen}/{UNITS} units made a partition appear; δ = {claim:.4g} allows {bound}")
    assert seen <= bound, f"seed={seed}: {mechanism}: {seen} of {UNITS} lone units appeared, δ={claim} allows {bound}"
    assert big == {f"big{i}" for i in range(5)}, f"seed={seed}: {mechanism}: partitions of 1,000 units dropped: {big}"
    if mechanism == "weighted_gaussian_threshold":
        # Without the L0 cap a unit's 50 weights still have an L2 norm of 1: what unbounding breaks
        # there is the metrics' sensitivity, which the end-to-end audits catch.
        return

    # The same run with contribution bounding switched off in the engine.
    real_bounding = polars_engine._bounding
    monkeypatch.setattr(polars_engine, "_bounding",
                        lambda plan, *args: real_bounding(dp_audit.unbounded(plan), *args))
    seen, _ = released_units(spec, seed + 1)
    print(f"seed={seed} {mechanism}, no contribution bounding: {seen}/{UNITS} units made a partition appear")
    assert seen > bound, f"seed={seed}: {mechanism}: the engine without bounding went unnoticed ({seen} <= {bound})"

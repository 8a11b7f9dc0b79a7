"""DP audit of released numbers on public partitions, through the plan and the mechanism layer.

For count, sum (Laplace and Gaussian noise), mean (its two quantities, alone and together) and
privacy_id_count: D is a small dataset, D' is D plus one privacy unit with the worst case the
bounds allow (values far beyond the bounds) and far more rows than they allow (10^3 rows in the
partition, more in unlisted partitions, or 10^4 rows over 10^3 partitions when L0 = 3).

1. The exact integer aggregates of D and D' come from the engine's own pre-noise steps
   (`dp_audit.pre_noise_sums`) with one hash key, so they differ only where bounding let the
   heavy unit in; the test checks that it got in exactly the worst case (m rows at the bound,
   in L0 partitions).
2. Each changed aggregate is released 10^6 times on D and on D' through `add_noise` with the
   plan's `NoisePlan`, and ε is bounded from below from the two samples
   (`dp_audit.epsilon_lower_bound`: likelihood-ratio tail sets with Clopper–Pearson intervals,
   δ subtracted for Gaussian noise).
3. The bound must stay at or below the plan's claimed (ε, δ) for the quantity, and must exceed it
   for two broken variants: the noise parameter halved, and contribution bounding skipped (the
   heavy unit's unbounded aggregate released with the planned noise).

Every estimate errs with probability at most dp_audit.ALPHA = 1e-9; broken variants are detected
with margins of many standard errors (checked analytically for Gaussian noise). The seed comes
from os.urandom and is printed and part of every assertion message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

import dp_audit
from dp_audit import Coordinate, audit, halved, pre_noise_sums, unbounded
from dprun import api
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan

HEAVY = "SECRET-HEAVY-UNIT"
LOWER, UPPER = -5.0, 10.0
Metrics = dict[str, Any] | list[dict[str, Any]]
ByQuantity = dict[str, list[Coordinate]]


def write_spec(folder: Path, metric: Metrics, *, l0: int, m: int, keys: list[str], epsilon: float = 1.0,
               delta: float = 1e-5, accounting: str = "basic") -> Path:
    spec = {
        "version": 1,
        "privacy_unit": "uid",
        "budget": {"epsilon": epsilon, "delta": delta, "accounting": accounting},
        "inputs": {"data": {"path": "data.parquet"}},
        "queries": [{
            "name": "q", "input": "data", "group_by": ["key"], "partitions": {"public": keys},
            "contribution_bounds": {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
            "metrics": metric if isinstance(metric, list) else [metric], "output": {"path": "out/q.parquet"},
        }],
        "report": "out/report.json",
    }
    path = folder / "spec.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def datasets(folder: Path, rng: np.random.Generator, keys: list[str], heavy_keys: list[str],
             heavy_rows_per_key: int) -> tuple[Path, Path]:
    """D (background only) and D' (background plus the heavy unit), each in its own folder."""
    units = 400
    per_unit = rng.integers(1, 5, units)
    rows = int(per_unit.sum())
    values = rng.uniform(LOWER - 5, UPPER + 5, rows)
    values[rng.random(rows) < 0.05] = np.nan
    background = pl.DataFrame({
        "uid": np.repeat([f"u{i}" for i in range(units)], per_unit),
        # Mostly listed keys, some unlisted ones (dropped before bounding).
        "key": [keys[i] if i < len(keys) else f"unlisted-{i}" for i in rng.integers(0, len(keys) + 5, rows)],
        "v": values,
    })
    heavy_key = [k for k in heavy_keys for _ in range(heavy_rows_per_key)] + [f"unlisted-h{i}" for i in range(200)]
    heavy = pl.DataFrame({"uid": [HEAVY] * len(heavy_key), "key": heavy_key, "v": np.full(len(heavy_key), 1e9)})
    paths = []
    for name, frame in (("D", background), ("D_prime", pl.concat([background, heavy]))):
        (folder / name).mkdir()
        frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(2**32))).write_parquet(
            folder / name / "data.parquet")
        paths.append(folder / name)
    return paths[0], paths[1]


def coordinates(tmp_path: Path, seed: int, metric: Metrics, *, l0: int, m: int, n_keys: int, heavy_keys: int,
                rows_per_key: int, **spec_args: Any) -> tuple[QueryPlan, ByQuantity, ByQuantity]:
    """The plan, and per quantity the coordinates (changed partitions) of the correct engine and of
    the engine without contribution bounding."""
    rng = np.random.default_rng(seed % 2**63)
    keys = [f"k{i:04d}" for i in range(n_keys)]
    d_dir, d_prime_dir = datasets(tmp_path, rng, keys, keys[:heavy_keys], rows_per_key)
    plans = {}
    for folder in (d_dir, d_prime_dir):
        write_spec(folder, metric, l0=l0, m=m, keys=keys, **spec_args)
        plans[folder] = dp_audit.plan_and_inputs(folder / "spec.yaml")
    plan = plans[d_dir][0]
    hash_seed = seed % 2**64
    sums = {folder: pre_noise_sums(p, v, hash_seed, tmp_path / "work" / folder.name)
            for folder, (p, v) in plans.items()}
    # The broken engine: no contribution bounding on either dataset.
    raw = {folder: pre_noise_sums(unbounded(p), v, hash_seed, tmp_path / "work" / f"unbounded-{folder.name}")
           for folder, (p, v) in plans.items()}
    before, after = sums[d_dir], sums[d_prime_dir]
    changed = dp_audit.changed_partitions(before, after, plan)
    # Bounding let the heavy unit into exactly L0 partitions (it has rows in heavy_keys >= L0 of them).
    assert len(changed) == l0, f"seed={seed}: the heavy unit changed {len(changed)} partitions, L0 = {l0}"
    # Without bounding it changes every listed partition it has rows in; ten of them are enough to
    # show it (all of them would take 10^3 noise draws per sample).
    changed_raw = dp_audit.changed_partitions(raw[d_dir], raw[d_prime_dir], plan)[:10]
    assert len(changed_raw) == min(heavy_keys, 10), f"seed={seed}: {len(changed_raw)}"
    correct: ByQuantity = {}
    broken: ByQuantity = {}
    for noisy in plan.quantities:
        q = noisy.quantity
        a = [int(before[q.id][i]) for i in changed]
        a_prime = [int(after[q.id][i]) for i in changed]
        a_raw = [(int(raw[d_dir][q.id][i]), int(raw[d_prime_dir][q.id][i])) for i in changed_raw]
        # The worst case the bounds allow, and no more: every value sits beyond the upper bound.
        assert [y - x for x, y in zip(a, a_prime, strict=True)] == [q.linf_units] * l0, (
            f"seed={seed}: {q.id}: the heavy unit moved the aggregates by {[y - x for x, y in zip(a, a_prime)]}, "
            f"the bounds allow {q.linf_units} per partition")
        correct[q.id] = [Coordinate(noisy.noise, q.unit_exponent, x, y) for x, y in zip(a, a_prime, strict=True)]
        broken[q.id] = [Coordinate(noisy.noise, q.unit_exponent, x, y) for x, y in a_raw]
    return plan, correct, broken


def check_audit(name: str, coords: list[Coordinate], epsilon: float, delta: float, seed: int, n: int,
                source: RandomSource, raw: list[Coordinate] | None = None, halved_n: int | None = None,
                broken_n: int | None = None) -> None:
    """The correct mechanism is sampled n times; the broken ones move the releases more, so fewer
    draws are enough to catch them: halved_n for halved noise, broken_n for no contribution
    bounding (n unless given)."""
    halved_n = n if halved_n is None else halved_n
    broken_n = n if broken_n is None else broken_n
    estimate = audit(coords, n, source, delta)
    print(f"seed={seed} {name}: claimed ε={epsilon:.4f} δ={delta:.3g}; correct: {estimate}")
    assert estimate.epsilon <= epsilon, (
        f"seed={seed}: {name}: the releases are distinguishable beyond the claim: {estimate} > ε = {epsilon}")
    # Not vacuous: the estimate gets close to the claim (Laplace: within the sampling error).
    if all(c.noise.kind == "laplace" for c in coords):
        assert estimate.epsilon >= 0.8 * epsilon, f"seed={seed}: {name}: the audit has no power ({estimate})"

    noisier = [c.with_noise(halved(c.noise)) for c in coords]
    if all(c.noise.kind == "gaussian" for c in coords):
        # The design can tell σ/2 apart: the expected estimate clears the claim by 6 standard errors.
        expected, error = dp_audit.gaussian_audit_power(coords, 0.5, delta, halved_n)
        assert expected - epsilon > 6 * error, (name, expected, error, epsilon)
        assert dp_audit.gaussian_audit_power(coords, 1.0, delta, halved_n)[0] <= epsilon
    estimate = audit(noisier, halved_n, source, delta, claim_noise=[c.noise for c in coords])
    print(f"seed={seed} {name}: broken (noise halved): {estimate}")
    assert estimate.epsilon > epsilon, f"seed={seed}: {name}: halved noise went unnoticed: {estimate} <= {epsilon}"

    if raw is not None and [c.shift for c in raw] == [c.shift for c in coords]:
        # privacy_id_count with one listed partition per unit: a unit adds 1 however many rows it
        # has, so skipping bounding changes nothing here (the L0 = 3 case shows it).
        print(f"seed={seed} {name}: skipping contribution bounding does not change this release")
    elif raw is not None:
        estimate = audit(raw, broken_n, source, delta)
        print(f"seed={seed} {name}: broken (no contribution bounding): {estimate}")
        assert estimate.epsilon > epsilon, (
            f"seed={seed}: {name}: skipping contribution bounding went unnoticed: {estimate} <= {epsilon}")


N = 10**6

CASES = {
    # name: (metric, l0, m, n_keys, heavy_keys, rows per heavy key)
    "count": ({"name": "n", "kind": "count", "noise": "laplace"}, 1, 3, 8, 1, 1000),
    "count_l0_3": ({"name": "n", "kind": "count", "noise": "laplace"}, 3, 2, 1000, 1000, 10),
    "sum_laplace": ({"name": "s", "kind": "sum", "column": "v", "bounds": [LOWER, UPPER], "noise": "laplace"},
                    1, 3, 8, 1, 1000),
    "sum_gaussian": ({"name": "s", "kind": "sum", "column": "v", "bounds": [LOWER, UPPER], "noise": "gaussian"},
                     1, 3, 8, 1, 1000),
    "privacy_id_count": ({"name": "p", "kind": "privacy_id_count", "noise": "laplace"}, 1, 3, 8, 1, 1000),
    "privacy_id_count_l0_3": ({"name": "p", "kind": "privacy_id_count", "noise": "laplace"}, 3, 1, 1000, 1000, 10),
}


@pytest.mark.parametrize("case", list(CASES))
def test_single_quantity_metrics_stay_within_their_claimed_epsilon(tmp_path: Path, case: str) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    metric, l0, m, n_keys, heavy_keys, rows = CASES[case]
    plan, correct, broken = coordinates(tmp_path, seed, metric, l0=l0, m=m, n_keys=n_keys, heavy_keys=heavy_keys,
                                        rows_per_key=rows)
    [noisy] = plan.quantities
    source = RandomSource.from_seed(seed)
    qid = noisy.quantity.id
    check_audit(f"{case} [{qid}]", correct[qid], noisy.noise.epsilon, noisy.noise.delta, seed, N, source,
                raw=broken[qid])


def test_the_mean_stays_within_the_claims_of_its_two_quantities(tmp_path: Path) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    metric = {"name": "avg", "kind": "mean", "column": "v", "bounds": [LOWER, UPPER], "noise": "laplace"}
    plan, correct, broken = coordinates(tmp_path, seed, metric, l0=1, m=3, n_keys=8, heavy_keys=1, rows_per_key=1000)
    assert [q.quantity.aggregate for q in plan.quantities] == ["rows", "centered_sum"]
    source = RandomSource.from_seed(seed)
    for noisy in plan.quantities:
        qid = noisy.quantity.id
        check_audit(f"mean [{qid}]", correct[qid], noisy.noise.epsilon, 0.0, seed, N, source, raw=broken[qid])
    # Together: the pair (count, centred sum) the mean is computed from, against the sum of their claims.
    both = [c for noisy in plan.quantities for c in correct[noisy.quantity.id]]
    raw = [c for noisy in plan.quantities for c in broken[noisy.quantity.id]]
    total = sum(noisy.noise.epsilon for noisy in plan.quantities)
    assert total <= plan.epsilon, f"seed={seed}: the mean's quantities claim {total} > the query's ε {plan.epsilon}"
    check_audit("mean [both quantities]", both, total, 0.0, seed, N, source, raw=raw)


def test_two_metrics_under_tight_accounting_stay_within_the_query_total(tmp_path: Path) -> None:
    """Under `pld` the planner shrinks every noise scale so that the tight composition of all the
    query's mechanisms meets the budget: the joint release of a Laplace count and a Gaussian sum
    must stay within the query's total (ε, δ), each quantity within its own claim."""
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    metrics = [{"name": "n", "kind": "count", "noise": "laplace"},
               {"name": "s", "kind": "sum", "column": "v", "bounds": [LOWER, UPPER], "noise": "gaussian"}]
    plan, correct, broken = coordinates(tmp_path, seed, metrics, l0=1, m=3, n_keys=8, heavy_keys=1,
                                        rows_per_key=1000, accounting="pld")
    whole = api.plan(api.validate(tmp_path / "D" / "spec.yaml"))
    total = (whole.total_epsilon, whole.total_delta)
    assert total[0] <= 1.0 and total[1] <= 1e-5, f"seed={seed}: the plan's total {total} exceeds the budget"
    source = RandomSource.from_seed(seed)
    for noisy in plan.quantities:
        qid = noisy.quantity.id
        check_audit(f"pld [{qid}]", correct[qid], noisy.noise.epsilon, noisy.noise.delta, seed, N, source,
                    raw=broken[qid])
    both = [c for noisy in plan.quantities for c in correct[noisy.quantity.id]]
    raw = [c for noisy in plan.quantities for c in broken[noisy.quantity.id]]
    check_audit("pld [count and sum together]", both, total[0], total[1], seed, N, source, raw=raw)


# --- longer runs ----------------------------------------------------------------------------------


# The quick cases' claims are checked at N draws above; five times as many would add minutes of CI
# and no case the quick ones miss, so the longer runs take the metrics and bounds those do not.
# Only the correct mechanism gets the five million draws: halved noise is caught at 2N (the
# mean's count at N falls short of six standard errors), no contribution bounding at N.
SLOW_CASES = {
    "sum_gaussian_l0_3": ({"name": "s", "kind": "sum", "column": "v", "bounds": [LOWER, UPPER],
                           "noise": "gaussian"}, 3, 2, 1000, 1000, 10),
    "sum_laplace_l0_3": ({"name": "s", "kind": "sum", "column": "v", "bounds": [LOWER, UPPER],
                          "noise": "laplace"}, 3, 2, 1000, 1000, 10),
    "mean_gaussian": ({"name": "avg", "kind": "mean", "column": "v", "bounds": [LOWER, UPPER],
                       "noise": "gaussian"}, 1, 3, 8, 1, 1000),
    "variance_laplace": ({"name": "var", "kind": "variance", "column": "v", "bounds": [LOWER, UPPER],
                          "noise": "laplace"}, 2, 3, 8, 2, 1000),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SLOW_CASES))
def test_every_quantity_stays_within_its_claim_with_five_million_draws(tmp_path: Path, case: str) -> None:
    seed = dp_audit.fresh_seed()
    print(f"seed={seed}")
    metric, l0, m, n_keys, heavy_keys, rows = SLOW_CASES[case]
    plan, correct, broken = coordinates(tmp_path, seed, metric, l0=l0, m=m, n_keys=n_keys, heavy_keys=heavy_keys,
                                        rows_per_key=rows)
    source = RandomSource.from_seed(seed)
    for noisy in plan.quantities:
        qid = noisy.quantity.id
        check_audit(f"{case} [{qid}]", correct[qid], noisy.noise.epsilon, noisy.noise.delta, seed,
                    5 * N, source, raw=broken[qid], halved_n=2 * N, broken_n=N)

"""Shared machinery of the DP audits: neighbouring datasets, exact pre-noise aggregates, noise
draws and a lower bound on ε from two samples of outputs.

The estimate (`epsilon_lower_bound`) follows the usual black-box audit recipe (Jagielski et al.
2020, "Auditing differentially private machine learning"; Nasr et al. 2021): for a family of
output sets S fixed before any draw, and Clopper–Pearson intervals on p = P[M(D) ∈ S] and
q = P[M(D') ∈ S],

    ε̂(S) = log((p_lower − δ) / q_upper)         (and with D, D' swapped),

which is a valid lower bound on the ε of an (ε, δ)-DP mechanism whenever every interval holds.
All intervals of one estimate share the error budget `alpha` (Bonferroni), so the estimate
exceeds the true ε with probability at most `alpha`.

The sets are tails of the privacy loss log(P_D'(x)/P_D(x)) under the planned noise
(`privacy_loss`), the statistic of the Neyman–Pearson optimal tests: for discrete Laplace noise
it is linear between the two aggregates and constant beyond them, so the set {loss = max}
(every coordinate at or beyond its D' aggregate) has a likelihood ratio of exactly e^ε; for
Gaussian noise it is linear in x. Coordinates with Laplace and Gaussian noise can be mixed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy import stats

from dprun import api
from dprun.engines import polars_engine, release_steps
from dprun.engines.sorted_bounding import SortedBounding
from dprun.mechanisms.noise import NoisePlan, add_noise, to_grid
from dprun.mechanisms.sampling import RandomSource
from dprun.plan import QueryPlan
import dprun_testing

# The error budget of one ε estimate (all its Clopper–Pearson intervals together). A test file
# makes at most a few dozen estimates and binomial checks, so it fails by chance well below 1e-6.
ALPHA = 1e-9


def fresh_seed() -> int:
    return dprun_testing.fresh_seed(8)


# --- Clopper–Pearson ------------------------------------------------------------------------


def cp_lower(k: int, n: int, alpha: float) -> float:
    """One-sided lower Clopper–Pearson bound: P[p < bound] <= alpha."""
    return 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))


def cp_upper(k: int, n: int, alpha: float) -> float:
    """One-sided upper Clopper–Pearson bound: P[p > bound] <= alpha."""
    return 1.0 if k == n else float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))


# --- neighbouring datasets and their exact aggregates ----------------------------------------


def plan_and_inputs(spec: Path) -> tuple[QueryPlan, api.ValidatedSpec]:
    validated = api.validate(spec)
    return api.plan(validated).queries[0], validated


def unbounded(plan: QueryPlan) -> QueryPlan:
    """The same plan (same noise) with contribution bounding switched off: the broken variant."""
    return dataclasses.replace(plan, max_rows=10**6, max_partitions=10**6)


def pre_noise_sums(plan: QueryPlan, validated: api.ValidatedSpec, hash_seed: int, workdir: Path) -> pl.DataFrame:
    """The engine's exact per-partition integer sums (before noise), public or global partitions,
    computed with the engine's own bounding (`polars_engine._bounding`) and the given hash key,
    so that two datasets bounded with the same key differ only by what bounding let the extra
    unit keep."""
    assert plan.selection.mode in ("public", "global"), plan.selection.mode
    keys = list(plan.group_by) or [polars_engine.GLOBAL_KEY]
    sums = bounding(plan, validated, hash_seed, workdir).partition_sums()
    sums = release_steps.with_all_keys(sums, release_steps.public_keys(plan), plan)
    return sums.sort(keys, nulls_last=True)


def bounding(plan: QueryPlan, validated: api.ValidatedSpec, hash_seed: int, workdir: Path) -> SortedBounding:
    """The engine's contribution bounding of the query's rows, with the given hash key."""
    keys = list(plan.group_by) or [polars_engine.GLOBAL_KEY]
    workdir.mkdir(parents=True, exist_ok=True)
    return polars_engine._bounding(plan, validated.query_inputs[plan.name], keys, (hash_seed, hash_seed), workdir)


def changed_partitions(before: pl.DataFrame, after: pl.DataFrame, plan: QueryPlan) -> list[int]:
    """Row positions (same key order in both) where any quantity's exact sum differs."""
    keys = list(plan.group_by) or [polars_engine.GLOBAL_KEY]
    assert before.select(keys).equals(after.select(keys)), "both datasets must list the same partitions"
    changed = np.zeros(before.height, dtype=bool)
    for noisy in plan.quantities:
        qid = noisy.quantity.id
        changed |= (before[qid] != after[qid]).to_numpy()
    return np.flatnonzero(changed).tolist()


# --- noise draws ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Coordinate:
    """One released number whose input differs between D and D': exact aggregates in units of
    2**unit_exponent, and the noise it is released with."""

    noise: NoisePlan
    unit_exponent: int
    a: int  # aggregate in D
    a_prime: int  # aggregate in D'

    def grid(self, aggregate: int) -> int:
        return int(to_grid(pl.Series([aggregate], dtype=pl.Int128), self.unit_exponent, self.noise.grid_exponent)[0])

    @property
    def shift(self) -> int:
        """a' − a on the noise grid."""
        return self.grid(self.a_prime) - self.grid(self.a)

    def with_noise(self, noise: NoisePlan) -> Coordinate:
        return dataclasses.replace(self, noise=noise)

    def draw(self, aggregate: int, n: int, source: RandomSource) -> np.ndarray:
        """n releases of `aggregate` through dprun's own `add_noise` (one vectorised call)."""
        series = pl.repeat(aggregate, n, dtype=pl.Int128, eager=True)
        return add_noise(series, self.unit_exponent, self.noise, source)

    def to_grid_units(self, released: np.ndarray) -> np.ndarray:
        return np.rint(np.ldexp(np.asarray(released, dtype=np.float64), -self.noise.grid_exponent))


def halved(noise: NoisePlan) -> NoisePlan:
    """The broken variant: the planned noise parameter (t or σ) halved, the claim unchanged."""
    return dataclasses.replace(noise, parameter=noise.parameter / 2)


def draw_pair(coords: Sequence[Coordinate], n: int, source: RandomSource) -> tuple[np.ndarray, np.ndarray]:
    """n releases of every coordinate on D and on D': arrays of shape (len(coords), n)."""
    on_d = np.stack([c.draw(c.a, n, source) for c in coords])
    on_d_prime = np.stack([c.draw(c.a_prime, n, source) for c in coords])
    return on_d, on_d_prime


# --- the estimate -----------------------------------------------------------------------------


def privacy_loss(coords: Sequence[Coordinate], released: np.ndarray) -> np.ndarray:
    """The privacy loss log(P_D'(x) / P_D(x)) of each sample (one column of `released` each), under
    the noise of `coords` (the plan's, whatever noise was actually drawn).

    Per coordinate, with u = (x − a) / Δ on the noise grid and Δ = a' − a: discrete Laplace
    (|Δ|/t)·(2·clip(u, 0, 1) − 1), linear between the aggregates and constant beyond them;
    discrete Gaussian (Δ/σ)²·(u − 1/2). Coordinates are independent, so the losses add up.
    """
    total = np.zeros(released.shape[1])
    for c, row in zip(coords, released, strict=True):
        shift = c.shift
        assert shift != 0, "a coordinate that does not differ between D and D' tells nothing"
        u = (c.to_grid_units(row) - c.grid(c.a)) / shift
        if c.noise.kind == "laplace":
            total += abs(shift) / c.noise.parameter * (2.0 * np.clip(u, 0.0, 1.0) - 1.0)
        else:
            total += (shift / c.noise.parameter) ** 2 * (u - 0.5)
    return total


def _loss_scales(coords: Sequence[Coordinate]) -> tuple[float, float]:
    """W, the largest Laplace loss, and V, the variance of the Gaussian loss."""
    w = sum(abs(c.shift) / c.noise.parameter for c in coords if c.noise.kind == "laplace")
    v = sum((c.shift / c.noise.parameter) ** 2 for c in coords if c.noise.kind == "gaussian")
    return w, v


def threshold_sets(coords: Sequence[Coordinate]) -> list[tuple[str, float]]:
    """Tail sets ('>=' or '<=', cut) of the privacy loss, fixed from the plan before any draw."""
    w, v = _loss_scales(coords)
    if v == 0:
        # Only Laplace noise: the loss lies in [−W, W]; its extreme sets {L = W} (every coordinate at
        # or beyond a') and {L = −W} hold the whole ratio e^ε. A relative 1e-9 absorbs rounding.
        cuts = [w * (2 * j / 10 - 1) for j in range(11)]
        return [(">=", c - 1e-9 * w) for c in cuts[1:]] + [("<=", c + 1e-9 * w) for c in cuts[:-1]]
    if w == 0:
        zs = np.arange(-1.0, 5.01, 0.25)
        return [(">=", math.sqrt(v) * z) for z in zs] + [("<=", -math.sqrt(v) * z) for z in zs]
    cuts = np.linspace(-w - math.sqrt(v), w + 5 * math.sqrt(v), 41)
    return [(">=", float(c)) for c in cuts] + [("<=", -float(c)) for c in cuts]


@dataclass(frozen=True)
class Estimate:
    epsilon: float  # the lower bound on ε (−inf when no set gives one)
    where: str  # the set and direction that gave it
    n: int

    def __str__(self) -> str:
        return f"ε̂_lower={self.epsilon:.4f} ({self.where}, n={self.n} per dataset)"


def epsilon_lower_bound(t_d: np.ndarray, t_d_prime: np.ndarray, sets: list[tuple[str, float]], delta: float,
                        alpha: float = ALPHA) -> Estimate:
    """max over the sets and both directions of log((CP_lower(p) − δ) / CP_upper(q))."""
    n, n_prime = t_d.size, t_d_prime.size
    a = alpha / (4 * len(sets))
    best, where = -math.inf, "no set"
    for op, cut in sets:
        k = int(np.sum(t_d >= cut)) if op == ">=" else int(np.sum(t_d <= cut))
        k_prime = int(np.sum(t_d_prime >= cut)) if op == ">=" else int(np.sum(t_d_prime <= cut))
        for name, (k1, n1), (k2, n2) in (("P_D'(S) vs P_D(S)", (k_prime, n_prime), (k, n)),
                                         ("P_D(S) vs P_D'(S)", (k, n), (k_prime, n_prime))):
            lower = cp_lower(k1, n1, a) - delta
            upper = cp_upper(k2, n2, a)
            if lower > 0 and upper > 0:
                value = math.log(lower / upper)
                if value > best:
                    best, where = value, f"{name}, S = {{loss {op} {cut:.4g}}}, counts {k1} vs {k2}"
    return Estimate(best, where, min(n, n_prime))


def audit(coords: Sequence[Coordinate], n: int, source: RandomSource, delta: float,
          claim_noise: Sequence[NoisePlan] | None = None, alpha: float = ALPHA) -> Estimate:
    """Draw n releases on D and D' with each coordinate's noise and estimate ε.

    `claim_noise` (default: the coordinates' own) is the planned noise that the statistic and
    its sets are built from; a broken variant draws other noise but is judged by the plan.
    """
    claimed = list(coords) if claim_noise is None else [c.with_noise(p) for c, p in zip(coords, claim_noise,
                                                                                      strict=True)]
    on_d, on_d_prime = draw_pair(coords, n, source)
    return epsilon_lower_bound(privacy_loss(claimed, on_d), privacy_loss(claimed, on_d_prime),
                               threshold_sets(claimed), delta, alpha)


def gaussian_audit_power(coords: Sequence[Coordinate], drawn_sigma_factor: float, delta: float, n: int,
                         alpha: float = ALPHA) -> tuple[float, float]:
    """What `audit` returns for Gaussian noise at typical samples: the estimate computed from the
    expected counts, and its standard error (delta method at the set that gives it), when the noise
    drawn is `drawn_sigma_factor` times the planned one. A design tells a broken variant apart if
    this expected estimate clears the claim by many standard errors.

    The loss (Δ/σ)²(u − 1/2) is normal with mean ∓V/2 on D and D' and standard deviation
    √V · factor, V = Σ (Δ_i/σ_i)²."""
    w, v = _loss_scales(coords)
    assert w == 0, "Gaussian coordinates only"
    spread = math.sqrt(v) * drawn_sigma_factor
    sets = threshold_sets(coords)
    a = alpha / (4 * len(sets))
    best, error = -math.inf, math.inf
    for op, cut in sets:
        tail = stats.norm.sf if op == ">=" else stats.norm.cdf
        p_d, p_d_prime = tail((cut + v / 2) / spread), tail((cut - v / 2) / spread)
        for p, q in ((p_d_prime, p_d), (p_d, p_d_prime)):
            k1, k2 = round(p * n), round(q * n)
            lower, upper = cp_lower(k1, n, a) - delta, cp_upper(k2, n, a)
            if lower > 0 and upper > 0 and k1 > 0 and k2 > 0 and math.log(lower / upper) > best:
                best = math.log(lower / upper)
                error = math.sqrt(1 / k1 + 1 / k2) * max(1.0, p / (p - delta))
    return best, error

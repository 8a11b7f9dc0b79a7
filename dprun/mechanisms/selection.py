"""Private partition selection: which partitions may appear in the output.

A partition's `units` n is the number of privacy units in it after contribution
bounding; each unit is in at most L0 = `max_partitions` partitions. Every
mechanism takes (ε, δ) for the whole selection and gives each partition
ε' = ε/L0, δ' = δ/L0: a unit changes at most L0 per-partition decisions, and
basic composition ([D20 §2.1.6], Proposition 5) adds them up.
This is how PipelineDP and Desfontaines et al. handle L0 > 1.

A `pre_threshold` k >= 1 (the spec's `min_privacy_units`) drops partitions with
n < k outright and runs the mechanism on n − k + 1: a partition then appears,
for a neighbouring dataset, when n goes from k − 1 to k, i.e. from "never kept"
to the mechanism's input 1, which is the case the mechanisms are built for.

Mechanisms ([DPP21], "Private partition selection"):

* `TruncatedGeometric`: Desfontaines, Voss, Gipson, Mandayam 2020,
  "Differentially private partition selection", the optimal keep probability
  π(n) for (ε', δ').
* `laplace_threshold`, `gaussian_threshold`: a noisy privacy-unit count compared
  with a threshold ([D20 §4.2.3], Theorem 12), with the same
  noise as every released number (`dprun.mechanisms.noise`: discrete Laplace on
  the integers, or the lattice Gaussian calibrated by the analytic Gaussian
  mechanism, [D20 §4.3.3], Theorem 16). Only the keep decision
  is released.
* `released_count_threshold`: the same rule on a count a metric releases anyway,
  which costs δ only.

Tail probabilities that decide a threshold are exact (discrete Laplace) or
bounded from above (lattice Gaussian), and required to sit below the target
with a relative margin of 1e-9, so rounding can only make a threshold larger
(safer), never smaller.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from dprun.mechanisms.noise import NoisePlan, add_noise, calibrate
from dprun.mechanisms.normal import log_ndtr, ndtri
from dprun.mechanisms.sampling import RandomSource, bernoulli

# A threshold's tail must be at most (1 − this) times its target: more than the
# relative rounding error of any tail computed below (about 2e-11 at worst), and than
# the factor by which the sampled Gaussian's tail can exceed the exact one
# (e**(GAUSSIAN_SAMPLER_EPSILON/2) − 1, about 2e-12; tests/mechanisms/test_selection.py).
_TAIL_SAFETY = 1e-9


@dataclass(frozen=True)
class TruncatedGeometric:
    """Keep a partition with n units with probability π(n − k + 1) (Desfontaines et al. 2020)."""

    epsilon: float
    delta: float
    max_partitions: int
    pre_threshold: int = 1

    def __post_init__(self) -> None:
        _check_budget(self.epsilon, self.delta, self.max_partitions, self.pre_threshold, 1)
        _exact_partition_budget(self)


@dataclass(frozen=True)
class NoisyThreshold:
    """Keep a partition when its count plus `noise` reaches `threshold` ([D20 §4.2.3], Theorem 12).

    The count is the partition's privacy-unit count (`laplace_threshold`,
    `gaussian_threshold`: only the keep decision is released) or a count that a
    metric releases anyway (`released_count_threshold`: selection is then
    post-processing plus δ). `contribution` c is the most one unit adds to the
    count in one partition. Partitions with fewer than `pre_threshold` k units
    are never kept; the threshold is placed so that a partition one unit makes
    eligible, holding a count of at most c·k, is kept with probability at most
    δ/L0 (see `threshold_for`).
    """

    noise: NoisePlan
    threshold: float
    pre_threshold: int = 1
    contribution: int = 1


SelectionMechanism = TruncatedGeometric | NoisyThreshold


def laplace_threshold(epsilon: float, delta: float, max_partitions: int, pre_threshold: int = 1) -> NoisyThreshold:
    """Discrete Laplace noise on the unit count, t = L0/ε (ε-DP for L1 = L0), threshold for δ."""
    _check_budget(epsilon, delta, max_partitions, pre_threshold, 1)
    noise = calibrate("laplace", 0, 1, max_partitions, epsilon, 0.0)
    return NoisyThreshold(noise, threshold_for(noise, delta, 1, pre_threshold), pre_threshold)


def gaussian_threshold(epsilon: float, delta: float, max_partitions: int, pre_threshold: int = 1) -> NoisyThreshold:
    """Lattice Gaussian noise on the unit count for (ε, δ/2), threshold for the other δ/2 (PipelineDP's split)."""
    _check_budget(epsilon, delta, max_partitions, pre_threshold, 1)
    noise = calibrate("gaussian", 0, 1, max_partitions, epsilon, delta / 2)
    return NoisyThreshold(noise, threshold_for(noise, delta / 2, 1, pre_threshold), pre_threshold)


def released_count_threshold(
    noise: NoisePlan, delta: float, contribution: int, pre_threshold: int = 1
) -> NoisyThreshold:
    """Threshold a count a metric releases with `noise`; costs δ and no ε."""
    _check_budget(1.0, delta, noise.l0, pre_threshold, contribution)
    return NoisyThreshold(noise, threshold_for(noise, delta, contribution, pre_threshold), pre_threshold, contribution)


def with_noise(m: NoisyThreshold, noise: NoisePlan, delta: float) -> NoisyThreshold:
    """The same rule with other noise (tight accounting rescales it); the threshold follows."""
    return NoisyThreshold(noise, threshold_for(noise, delta, m.contribution, m.pre_threshold),
                          m.pre_threshold, m.contribution)


def threshold_for(noise: NoisePlan, delta: float, contribution: int, pre_threshold: int) -> float:
    """Smallest τ (on the noise grid) with L0 · P(c·k + noise >= τ) <= δ.

    A unit makes at most L0 partitions eligible, each holding at most c·k; so its
    presence changes the released partition set with probability at most δ (seed
    001, proof of Theorem 12). Discrete Laplace tails are exact. For the lattice
    Gaussian (spacing h = 2**grid), P(X >= x) <= P(Y >= x − h) for the continuous
    Y ~ N(0, σ²), because the density decreases beyond 0; so τ = c·k + σ·z + h.
    """
    target = delta / noise.l0
    log_target = math.log(target) + math.log1p(-_TAIL_SAFETY)
    base = contribution * pre_threshold
    step = math.ldexp(1.0, noise.grid_exponent)
    if noise.kind == "laplace":
        offset = _smallest_integer(
            lambda k: bool(_discrete_laplace_log_tail(noise.parameter, np.array([k]))[0] <= log_target),
            math.ceil(-noise.parameter * log_target),
        )
        return base + offset * step
    z = -float(ndtri(math.exp(log_target)))
    # On a grid coarser than one count, rounding the count to the grid moves it by up to h/2 more.
    rounding = step if noise.grid_exponent > 0 else 0.0
    return base + noise.std * z + step + rounding


def _noisy_threshold_keep(m: NoisyThreshold, n: np.ndarray) -> np.ndarray:
    """P(n + noise >= τ): exact for discrete Laplace, the normal tail for the lattice Gaussian."""
    step = math.ldexp(1.0, m.noise.grid_exponent)
    if m.noise.kind == "laplace":
        needed = np.ceil((m.threshold - n) / step)
        return np.exp(_discrete_laplace_log_tail(m.noise.parameter, needed))
    return np.exp(log_ndtr((n - m.threshold) / m.noise.std))


def keep_probability(m: SelectionMechanism, units: np.ndarray) -> np.ndarray:
    """Probability that a partition with `units` privacy units is kept.

    Truncated geometric: π(n − k + 1) of Desfontaines et al., in closed form.
    Noisy thresholds: P(n + noise >= τ), counting 1 per unit (the fewest a unit
    adds). n < k: 0.
    """
    n = np.asarray(units, dtype=np.int64)
    eligible = n >= m.pre_threshold
    if isinstance(m, TruncatedGeometric):
        phases = _geometric_phases(*_exact_partition_budget(m))
        return np.where(eligible, phases.pi(n - m.pre_threshold + 1), 0.0)
    return np.where(eligible, _noisy_threshold_keep(m, n.astype(np.float64)), 0.0)


def units_to_keep(m: SelectionMechanism, probability: float) -> int:
    """Smallest n with `keep_probability(m, n) >= probability`, for 0 < probability <= 1."""
    if not 0.0 < probability <= 1.0:
        raise ValueError(f"probability must be in (0, 1], got {probability!r}")
    return _smallest_integer(
        lambda n: bool(keep_probability(m, np.array([n]))[0] >= probability), m.pre_threshold
    )


def select_partitions(m: SelectionMechanism, units: np.ndarray, source: RandomSource) -> np.ndarray:
    """Bool mask: which partitions to keep, drawn from `source`.

    Truncated geometric: an independent Bernoulli(π(n − k + 1)) per partition.
    Noisy thresholds: n + fresh noise >= τ. Partitions with n < k are never kept.
    """
    n = np.asarray(units, dtype=np.int64)
    if n.size and n.min() < 0:
        raise ValueError("units must be >= 0")
    if isinstance(m, TruncatedGeometric):
        return bernoulli(source, keep_probability(m, n))
    noisy = add_noise(pl.Series(n), 0, m.noise, source)
    return (n >= m.pre_threshold) & (noisy >= m.threshold)


# --- truncated geometric ---------------------------------------------------------

# π is computed in float64 to within (nε' + 3)·2**-53 relative (see `_GeometricPhases`),
# nε' below 50 wherever π < 1, and 1 − π is rounded once more: |π_float − π| <= 2**-46.
# The Bernoulli draw is exact for π_float (`sampling.bernoulli`), so for each partition
# the released decision is (ε', δ' + (1 + e^ε')·2**-46)-DP where π's is (ε', δ').
PROBABILITY_ERROR = 2.0**-46


def _exact_partition_budget(m: TruncatedGeometric) -> tuple[float, float]:
    """The per-partition (ε', δ') that π is computed for: the mechanism's share for one
    partition, less the δ its float rounding can add (PROBABILITY_ERROR)."""
    epsilon = m.epsilon / m.max_partitions
    # Beyond e**700 the margin is far above any δ anyway (and math.exp would overflow).
    margin = (1.0 + math.exp(min(epsilon, 700.0))) * PROBABILITY_ERROR
    delta = m.delta / m.max_partitions - margin
    if not delta > 0:
        raise ValueError(f"truncated_geometric needs a δ per partition above {margin:.1e} at this ε to "
                         "cover its float rounding: give it more δ, or use laplace_threshold")
    return epsilon, delta



@dataclass(frozen=True)
class _GeometricPhases:
    """π for per-partition (ε', δ') in closed form (Desfontaines et al. 2020).

    The recursion π(0) = 0, π(n) = min(e^ε π(n−1) + δ, 1 − e^{-ε}(1 − π(n−1) − δ), 1)
    takes its first branch, π(n) = δ(e^{nε} − 1)/(e^ε − 1), for 1 <= n <= `last_first`.
    Then it takes the second, q(n) = e^{-ε}(q(n−1) − δ) in q = 1 − π, whose
    solution from q0 = 1 − π(last_first) is q = c·(e^{(J − j)ε} − 1) with
    j = n − last_first, c = δ/(e^ε − 1) and J = ln(1 + q0/c)/ε, the real j at
    which q would reach 0; π = 1 from `first_one` = last_first + ⌈J⌉ on. Written
    with expm1, both branches keep their relative precision: π is exact to about
    (nε + 3)·2^-53 relative (the conditioning of e^{nε}), 1 − π to the 2^-53
    spacing of floats near 1, i.e. the DP constraints hold to that rounding.
    """

    epsilon: float
    delta: float
    last_first: int
    steps_to_one: float  # J

    @property
    def first_one(self) -> int:
        return self.last_first + max(1, math.ceil(self.steps_to_one))

    def pi(self, n: np.ndarray) -> np.ndarray:
        eps, delta = self.epsilon, self.delta
        n = np.asarray(n, dtype=np.float64)
        first = delta * np.expm1(np.minimum(n, self.last_first) * eps) / math.expm1(eps)
        c = delta / math.expm1(eps)
        remaining = np.maximum(self.steps_to_one - (n - self.last_first), 0.0)
        second = np.where(n >= self.first_one, 1.0, 1.0 - c * np.expm1(remaining * eps))
        return np.where(n <= 0, 0.0, np.where(n <= self.last_first, first, second))


def _first_branch(n: int, epsilon: float, delta: float) -> float:
    return delta * math.expm1(n * epsilon) / math.expm1(epsilon)


@functools.lru_cache(maxsize=64)
def _geometric_phases(epsilon: float, delta: float) -> _GeometricPhases:
    """Where the recursion changes branch, found on the recursion's own terms.

    The first branch is the minimum at n iff π(n−1) <= (1 − δ)/(e^ε + 1) and the
    result is <= 1; both conditions fail from some n on and never hold again,
    so a search over n, started at the closed-form guess, finds the change.
    """

    def leaves_first(n: int) -> bool:
        previous = _first_branch(n - 1, epsilon, delta)
        second = 1.0 - math.exp(-epsilon) * (1.0 - previous - delta)
        return _first_branch(n, epsilon, delta) > min(second, 1.0)

    switch = (1.0 - delta) / (math.exp(epsilon) + 1.0)
    guess = max(1, math.ceil(math.log1p(switch * math.expm1(epsilon) / delta) / epsilon))
    last_first = _smallest_integer(lambda n: n >= 1 and leaves_first(n), guess) - 1
    q0 = 1.0 - _first_branch(last_first, epsilon, delta)
    c = delta / math.expm1(epsilon)
    return _GeometricPhases(epsilon, delta, last_first, math.log1p(max(q0, 0.0) / c) / epsilon)


# --- noise tails -----------------------------------------------------------------


def _discrete_laplace_log_tail(t: float, k: np.ndarray) -> np.ndarray:
    """log P(X >= k) for P(x) = (1−p)/(1+p) p^{|x|}, p = e^{-1/t}.

    k >= 1: P = Σ_{x>=k} (1−p)/(1+p) p^x = p^k/(1+p). k <= 0: by symmetry
    P(X >= k) = 1 − P(X >= 1 − k) = 1 − p^{1−k}/(1+p).
    """
    k = np.asarray(k, dtype=np.float64)
    log1p_p = math.log1p(math.exp(-1.0 / t))
    upper = -k / t - log1p_p
    with np.errstate(divide="ignore"):
        lower = np.log1p(-np.exp(np.minimum(k - 1.0, 0.0) / t - log1p_p))
    return np.where(k >= 1, upper, lower)


# --- helpers ---------------------------------------------------------------------


def _smallest_integer(predicate: Callable[[int], bool], guess: int) -> int:
    """Smallest integer k with predicate(k), for a predicate false below some k and true from it."""
    step = 1
    if predicate(guess):
        hi, lo = guess, guess - 1
        while predicate(lo):
            hi, lo, step = lo, lo - step, 2 * step
    else:
        lo, hi = guess, guess + 1
        while not predicate(hi):
            lo, hi, step = hi, hi + step, 2 * step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if predicate(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _check_budget(epsilon: float, delta: float, max_partitions: int, pre_threshold: int, contribution: int) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    _check_int("max_partitions", max_partitions)
    _check_int("pre_threshold", pre_threshold)
    _check_int("per_partition_contribution", contribution)


def _check_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")

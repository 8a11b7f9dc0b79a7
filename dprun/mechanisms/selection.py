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
* `weighted_gaussian_threshold`: Gaussian thresholding of weighted unit counts, the
  weighted Gaussian policy of Gopi et al. 2020 ("Differentially private set union",
  Section 5): a unit kept in n partitions adds w(n) ≈ 1/√n to each, so its weights have
  L2 norm at most 1 whatever n ≤ L0, and the noise is calibrated for an L2 sensitivity
  of 1 instead of √L0. A unit in few partitions weighs more than with plain counting
  scaled by 1/√L0; one in L0 partitions the same.

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


# Weights are counted in units of 2**-SELECTION_WEIGHT_BITS: w(n) = floor(2**B / √n), exactly.
SELECTION_WEIGHT_BITS = 20


@dataclass(frozen=True)
class WeightedGaussianThreshold:
    """Keep a partition when its units' weights plus lattice Gaussian `noise` reach `threshold`.

    A unit in n partitions after the first bounding (n ≤ L0 = `max_partitions`) adds
    `unit_weights(n)` to each: n · w(n)² ≤ 1, an L2 sensitivity of one count for the weight
    vector of the partitions that exist either way (`noise`, for (ε, δ/2)). A partition only
    the unit makes eligible (k − 1 other units, each adding at most 1) is kept with
    probability at most δ/(2n) per partition, for every n (`weighted_threshold`): at most n
    such partitions, δ/2 in all. Weights and threshold are in counts (`threshold`), the noise
    on a grid of the weights' units or finer.
    """

    noise: NoisePlan
    threshold: float
    max_partitions: int
    pre_threshold: int = 1


SelectionMechanism = TruncatedGeometric | NoisyThreshold | WeightedGaussianThreshold


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


def weighted_gaussian_threshold(epsilon: float, delta: float, max_partitions: int, pre_threshold: int = 1
                                ) -> WeightedGaussianThreshold:
    """Lattice Gaussian noise on the weights for (ε, δ/2) at an L2 sensitivity of one count, threshold for δ/2."""
    _check_budget(epsilon, delta, max_partitions, pre_threshold, 1)
    noise = calibrate("gaussian", -SELECTION_WEIGHT_BITS, 1 << SELECTION_WEIGHT_BITS, 1, epsilon, delta / 2)
    if noise.grid_exponent > -SELECTION_WEIGHT_BITS:
        # Rounding several partitions' weights to a coarser grid is not covered by the L2 sensitivity of 1.
        raise ValueError("the selection's budget share is too small for weighted_gaussian_threshold")
    return WeightedGaussianThreshold(noise, weighted_threshold(noise, delta / 2, max_partitions, pre_threshold),
                                     max_partitions, pre_threshold)


def unit_weights(partitions: np.ndarray) -> np.ndarray:
    """w(n) = floor(2**B / √n) in units of 2**-B, exactly: from the float square root, then corrected
    with integer arithmetic (w² · n ≤ 2**2B < (w + 1)² · n)."""
    n = np.asarray(partitions, dtype=np.int64)
    one = np.int64(1) << np.int64(2 * SELECTION_WEIGHT_BITS)
    w = np.floor(math.ldexp(1.0, SELECTION_WEIGHT_BITS) / np.sqrt(n.astype(np.float64))).astype(np.int64)
    w = np.where(w * w * n > one, w - 1, w)
    return np.where((w + 1) * (w + 1) * n <= one, w + 1, w)


def weighted_threshold(noise: NoisePlan, delta: float, max_partitions: int, pre_threshold: int) -> float:
    """Smallest τ (in counts) with n · P(k − 1 + w(n) + noise ≥ τ) ≤ δ for every n ≤ L0: the most
    probable way one unit adds partitions, whatever the number n it is in.

    As `threshold_for`: P(X ≥ x) ≤ P(Y ≥ x − h) for the lattice Gaussian X and the continuous
    Y ~ N(0, σ²), h its spacing."""
    n = np.arange(1, min(max_partitions, _EXACT_PARTITIONS) + 1)
    step = math.ldexp(1.0, noise.grid_exponent)
    tau = float((_weight_in_counts(n) + noise.std * _tail_z(delta / n)).max())
    if max_partitions > _EXACT_PARTITIONS:
        # Above, w(n) ≤ w(N + 1) and the tail's z grows with n: one bound for them all (larger, so safe).
        tau = max(tau, float(_weight_in_counts(np.array([_EXACT_PARTITIONS + 1]))[0]
                             + noise.std * _tail_z(np.array([delta / max_partitions]))[0]))
    return pre_threshold - 1 + tau + step


# weighted_threshold takes the maximum over every n up to this many partitions, and bounds the rest.
_EXACT_PARTITIONS = 4096


def _weight_in_counts(partitions: np.ndarray) -> np.ndarray:
    return np.ldexp(unit_weights(partitions).astype(np.float64), -SELECTION_WEIGHT_BITS)


def _tail_z(targets: np.ndarray) -> np.ndarray:
    """z with P(N(0, 1) ≥ z) = target, the target lowered by the relative safety margin."""
    return -np.array([ndtri(math.exp(math.log(t) + math.log1p(-_TAIL_SAFETY))) for t in targets])


def with_noise(m: NoisyThreshold | WeightedGaussianThreshold, noise: NoisePlan, delta: float
               ) -> NoisyThreshold | WeightedGaussianThreshold:
    """The same rule with other noise (tight accounting rescales it); the threshold follows."""
    if isinstance(m, WeightedGaussianThreshold):
        return WeightedGaussianThreshold(noise, weighted_threshold(noise, delta, m.max_partitions, m.pre_threshold),
                                         m.max_partitions, m.pre_threshold)
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
    if isinstance(m, WeightedGaussianThreshold):
        # The fewest weight n units can hold: each in L0 partitions.
        least = n * math.ldexp(float(unit_weights(np.array([m.max_partitions]))[0]), -SELECTION_WEIGHT_BITS)
        return np.where(eligible, np.exp(log_ndtr((least - m.threshold) / m.noise.std)), 0.0)
    return np.where(eligible, _noisy_threshold_keep(m, n.astype(np.float64)), 0.0)


def units_to_keep(m: SelectionMechanism, probability: float) -> int:
    """Smallest n with `keep_probability(m, n) >= probability`, for 0 < probability <= 1."""
    if not 0.0 < probability <= 1.0:
        raise ValueError(f"probability must be in (0, 1], got {probability!r}")
    return _smallest_integer(
        lambda n: bool(keep_probability(m, np.array([n]))[0] >= probability), m.pre_threshold
    )


def select_partitions(m: SelectionMechanism, units: np.ndarray, source: RandomSource,
                      weights: np.ndarray | None = None) -> np.ndarray:
    """Bool mask: which partitions to keep, drawn from `source`.

    Truncated geometric: an independent Bernoulli(π(n − k + 1)) per partition.
    Noisy thresholds: n + fresh noise >= τ; weighted: the partition's `weights` (in units of
    2**-SELECTION_WEIGHT_BITS) + fresh noise >= τ. Partitions with n < k are never kept.
    """
    n = np.asarray(units, dtype=np.int64)
    if n.size and n.min() < 0:
        raise ValueError("units must be >= 0")
    if isinstance(m, TruncatedGeometric):
        return bernoulli(source, keep_probability(m, n))
    if isinstance(m, WeightedGaussianThreshold):
        assert weights is not None, "weighted selection needs the partitions' weights"
        noisy = add_noise(pl.Series(np.asarray(weights, dtype=np.int64)), -SELECTION_WEIGHT_BITS, m.noise, source)
        return (n >= m.pre_threshold) & (noisy >= m.threshold)
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
    if not delta > 0 and margin >= 1.0:
        raise ValueError(f"truncated_geometric cannot cover its float rounding with any δ at ε = {epsilon:.3g} per "
                         "partition: give it a smaller ε (or more partitions per unit), or use laplace_threshold")
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

"""Noise calibration: how much noise a sensitivity and a budget call for.

Pure functions on floats: noise scales for a budget, and the budget a Gaussian
noise scale spends (`gaussian_delta`, `gaussian_epsilon`). The Laplace
mechanism and its discrete variant (the two-sided geometric distribution) are
from [D20 §2.1.6] (Proposition 6, Definition 8,
Proposition 7); the analytic Gaussian mechanism (Balle & Wang 2018,
"Improving the Gaussian mechanism for differential privacy", Theorem 8 and
Algorithm 1) is Theorem 16 of [D20 §4.3.3]."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dprun.mechanisms.normal import log_ndtr
from dprun.mechanisms.sampling import GAUSSIAN_SAMPLER_EPSILON

# Relative width of the final bracket around the analytic Gaussian σ (or ε).
# The returned value is the bracket's upper end, so at most this much too large.
RELATIVE_TOLERANCE = 1e-12

# `gaussian_delta` loses up to ~1e-8 of relative precision when ε is tiny and δ
# is small (its two log-CDF terms nearly cancel); calibrating against a target
# this much below δ keeps the true δ(σ) under the requested δ despite that.
DELTA_SAFETY = 1e-6

# δ held back for each lattice Gaussian: dprun's Gaussian noise is the discrete Gaussian
# on a lattice of about 2**-40·σ, calibrated and accounted as the continuous Gaussian;
# the two privacy profiles are taken to differ by less than this (docs/mechanisms.md).
# Calibration (`noise.calibrate`) and PLD accounting (`accounting.pld_epsilon`) both
# take it off δ, once per Gaussian mechanism.
GAUSSIAN_DELTA_SLACK = 2.0**-36


def exact_gaussian_budget(epsilon: float, delta: float, changed: int) -> tuple[float, float]:
    """The (ε, δ) to calibrate a continuous Gaussian for, so that dprun's sampled Gaussian is (ε, δ)-DP.

    Two gaps lie between them: the lattice (GAUSSIAN_DELTA_SLACK of δ) and the sampler's
    float64 acceptance step, which moves each outcome's probability by at most a factor
    e**(±GAUSSIAN_SAMPLER_EPSILON/2): for `changed` released values that one unit can
    change, the sampled mechanism is (ε + F, δ·(1 + F))-DP where the exact one is
    (ε, δ)-DP, F = changed·GAUSSIAN_SAMPLER_EPSILON (`dprun.mechanisms.sampling`).
    Returns ε − F and δ/(1 + F) − GAUSSIAN_DELTA_SLACK; either may be <= 0 (no such noise).
    """
    fold = changed * GAUSSIAN_SAMPLER_EPSILON
    return epsilon - fold, delta / (1.0 + fold) - GAUSSIAN_DELTA_SLACK


def sampled_gaussian_guarantee(exact_epsilon: float, continuous_delta: float, changed: int) -> tuple[float, float]:
    """The inverse of `exact_gaussian_budget`: the guarantee of the sampled Gaussian whose
    continuous counterpart is (exact_epsilon, continuous_delta)-DP."""
    fold = changed * GAUSSIAN_SAMPLER_EPSILON
    return exact_epsilon + fold, (continuous_delta + GAUSSIAN_DELTA_SLACK) * (1.0 + fold)


def laplace_scale(l1_sensitivity: float, epsilon: float) -> float:
    """Scale b = Δ1/ε of Laplace noise giving ε-DP ([D20 §2.1.6], Proposition 6)."""
    _require_positive(l1_sensitivity=l1_sensitivity, epsilon=epsilon)
    return l1_sensitivity / epsilon


def discrete_laplace_std(t: float) -> float:
    """Standard deviation of the discrete Laplace distribution P(k) ∝ exp(-|k|/t).

    With p = e^{-1/t} the variance is 2p/(1-p)^2 ([D20 §2.1.6], Definition 8, with
    α = p). `expm1` keeps 1-p accurate when t is large.
    """
    _require_positive(t=t)
    p = math.exp(-1.0 / t)
    return math.sqrt(2.0 * p) / -math.expm1(-1.0 / t)


def gaussian_delta(sigma: float, l2_sensitivity: float, epsilon: float) -> float:
    """Exact δ(ε) of the Gaussian mechanism with noise N(0, σ²) and L2 sensitivity Δ.

    δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) (Balle & Wang 2018,
    Theorem 8; [D20 §4.3.3], Theorem 16): the mechanism is (ε, δ')-DP iff δ' ≥ δ.
    Both terms are formed as logarithms (`log_ndtr`) and subtracted as
    exp(l1)·(1 − exp(l2 − l1)), so nothing overflows for ε up to 50 and tiny
    δ keep their relative precision.
    """
    _require_positive(sigma=sigma, l2_sensitivity=l2_sensitivity)
    if epsilon < 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be finite and >= 0, got {epsilon!r}")
    return float(gaussian_deltas(l2_sensitivity / sigma, epsilon))


def gaussian_deltas(mu: float, epsilons: np.ndarray | float) -> np.ndarray:
    """δ(ε) = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ) of the Gaussian mechanism with Δ/σ = μ > 0,
    for each ε of an array (or one float), negative ones included."""
    log_first = log_ndtr(mu / 2.0 - epsilons / mu)
    log_second = epsilons + log_ndtr(-mu / 2.0 - epsilons / mu)
    # Only rounding can make the second term the larger: the exact difference is >= 0.
    return np.exp(log_first) * -np.expm1(np.minimum(log_second - log_first, 0.0))


def analytic_gaussian_sigma(l2_sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ for which Gaussian noise N(0, σ²) gives (ε, δ)-DP at L2 sensitivity Δ.

    Balle & Wang 2018, Algorithm 1 ([D20 §4.3.3], Theorem 16), solved numerically:
    δ(σ) = `gaussian_delta(σ, Δ, ε)` decreases in σ, so we bracket the
    crossing by doubling/halving and bisect in log σ until the bracket is
    narrower than 1e-12 relative. The upper end of the final bracket is
    returned, and the bracket is placed against δ·(1 − 1e-6) rather than δ, so
    `gaussian_delta(result, Δ, ε) <= delta` holds with room for the rounding of
    `gaussian_delta` itself; the result exceeds the exact smallest σ by about
    1e-7 relative at most. Tested for ε in [1e-4, 50], δ in [1e-15, 0.5), any Δ > 0.
    """
    _require_positive(l2_sensitivity=l2_sensitivity, epsilon=epsilon, delta=delta)
    if delta >= 1.0:
        raise ValueError(f"delta must be < 1, got {delta!r}")

    target = delta * (1.0 - DELTA_SAFETY)

    def satisfies(sigma: float) -> bool:
        return gaussian_delta(sigma, l2_sensitivity, epsilon) <= target

    # The classical bound σ = Δ·sqrt(2 ln(1.25/δ))/ε is within a small factor of
    # the answer across the supported range, so the bracketing is short.
    guess = l2_sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon
    log_hi = math.log(guess)
    while not satisfies(math.exp(log_hi)):
        log_hi += math.log(2.0)
    log_lo = log_hi - math.log(2.0)
    while satisfies(math.exp(log_lo)):
        log_hi, log_lo = log_lo, log_lo - math.log(2.0)
    while log_hi - log_lo > RELATIVE_TOLERANCE:
        mid = 0.5 * (log_lo + log_hi)
        if satisfies(math.exp(mid)):
            log_hi = mid
        else:
            log_lo = mid
    # log_hi only ever holds points where the bound was checked to hold.
    return math.exp(log_hi)


def gaussian_epsilon(sigma: float, l2_sensitivity: float, delta: float) -> float:
    """Smallest ε for which noise N(0, σ²) at L2 sensitivity Δ is (ε, δ)-DP; inverse of the above.

    δ(ε) = `gaussian_delta(σ, Δ, ε)` decreases in ε; bisection to 1e-12
    relative returns the upper end of the bracket, against the same
    δ·(1 − 1e-6) target as `analytic_gaussian_sigma`, so the result is never
    below the exact ε, and `gaussian_epsilon(analytic_gaussian_sigma(Δ, ε, δ), Δ, δ)`
    is ε to within the 1e-12 tolerance.
    δ <= 0 gives infinity: Gaussian noise is never pure DP.
    """
    _require_positive(sigma=sigma, l2_sensitivity=l2_sensitivity)
    if delta <= 0:
        return math.inf
    target = delta * (1.0 - DELTA_SAFETY)
    return smallest_epsilon(lambda epsilon: gaussian_delta(sigma, l2_sensitivity, epsilon) <= target)


def smallest_epsilon(satisfies: Callable[[float], bool]) -> float:
    """The smallest ε >= 0 where `satisfies` holds (false below it, true above), by
    doubling then bisection to 1e-12 relative; the upper end of the bracket is returned,
    so `satisfies` was checked to hold there."""
    if satisfies(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while not satisfies(hi):
        lo, hi = hi, 2.0 * hi
    while hi - lo > RELATIVE_TOLERANCE * hi:
        mid = 0.5 * (lo + hi)
        if satisfies(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _require_positive(**values: float) -> None:
    for name, value in values.items():
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"{name} must be finite and > 0, got {value!r}")

"""Tight composition in closed form: Gaussian noise with a few discrete privacy losses.

Written by hand, beside dp-accounting, for speed where it matters most: dp-accounting
imports scipy.signal and scipy.stats (over a second on the benchmark machine, most of
a planning step) and builds its PLDs on a grid, while the plans `auto` makes are
mostly Gaussian, and a query's Laplace noise on one grid stays a few thousand losses.
Gaussian mechanisms compose exactly into one Gaussian mechanism with
μ² = Σ (Δ_i/σ_i)² (Dong, Roth & Su 2019, "Gaussian differential privacy", Cor. 3.3),
whose δ(ε) is the analytic Gaussian's ([D20 §4.3.3], Theorem 16; `calibration.gaussian_deltas`). Composing it with a
discrete privacy loss L (finitely many losses l_j with masses p_j, plus a mass p_∞ at
+∞) gives, since δ(ε) = E[(1 − e^{ε − L_total})₊] for independent losses,

    δ(ε) = p_∞ + Σ_j p_j · H_μ(ε − l_j),   H_μ(x) = Φ(μ/2 − x/μ) − e^x Φ(−μ/2 − x/μ),

for every real x (H_0(x) = (1 − e^x)₊ with no Gaussian). The discrete losses come from
costs known only by (ε, δ) (their worst case, randomized response with δ at +∞, as
dp-accounting's `from_privacy_parameters`) and from discrete Laplace noise (its losses
rounded up to a grid, as `accounting._discrete_laplace_pld`). Rounding losses up and
worst cases keep the result an upper bound on ε; the Gaussian part is exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from dprun.mechanisms.calibration import (DELTA_SAFETY, RELATIVE_TOLERANCE, gaussian_deltas,
                                          smallest_epsilon)

# Beyond these, dp-accounting: pairs of losses formed by one composition (its sort's work),
# and losses after it (each δ(ε) the search for ε tries costs one Gaussian tail per loss).
MAX_PAIRS = 2**17
MAX_ATOMS = 2**13
# Losses closer than this are one (`_merged`): float sums of grid losses differ by ulps of
# losses of at most a few hundred, and grids are at least 1e-6 (`accounting._discretization`).
MERGE_GAP = 1e-10


class DiscreteLoss:
    """A privacy loss distribution with finitely many losses, and a mass at +∞."""

    def __init__(self, losses: np.ndarray, masses: np.ndarray, infinity: float) -> None:
        self.losses = losses
        self.masses = masses
        self.infinity = infinity

    @classmethod
    def none(cls) -> DiscreteLoss:
        return cls(np.zeros(1), np.ones(1), 0.0)

    @classmethod
    def worst_case(cls, epsilon: float, delta: float) -> DiscreteLoss:
        """The worst (ε, δ)-DP mechanism: loss ±ε as randomized response, +∞ with mass δ."""
        kept = 1.0 - delta
        if epsilon == 0.0:
            return cls(np.zeros(1), np.array([kept]), delta)
        return cls(np.array([epsilon, -epsilon]),
                   np.array([kept / (1.0 + math.exp(-epsilon)), kept / (1.0 + math.exp(epsilon))]), delta)

    def compose(self, other: DiscreteLoss) -> DiscreteLoss:
        losses, masses = _merged(np.add.outer(self.losses, other.losses).ravel(),
                                 np.multiply.outer(self.masses, other.masses).ravel())
        # 1 − (1 − a)(1 − b), in a form exact to a few ulps of δ, not of 1.
        return DiscreteLoss(losses, masses, self.infinity + other.infinity - self.infinity * other.infinity)


def _merged(losses: np.ndarray, masses: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Losses within MERGE_GAP of each other as one, at the largest of them, with their masses summed.

    Composing many costs on one grid must stay small: i·h + j·h and (i + j)·h are the same
    loss but may differ in their last bits, and exact equality would keep both. Moving a mass
    to a larger loss only raises δ(ε) (H_μ falls as its argument grows), so the result stays
    an upper bound.
    """
    order = np.argsort(losses, kind="stable")
    losses, masses = losses[order], masses[order]
    starts = np.flatnonzero(np.diff(losses, prepend=-np.inf) > MERGE_GAP)
    ends = np.append(starts[1:], losses.size) - 1
    return losses[ends], np.add.reduceat(masses, starts)


def gaussian_mu(stddevs_and_sensitivities: Iterable[tuple[float, float]]) -> float:
    """μ of the one Gaussian mechanism that several compose into: sqrt(Σ (Δ/σ)²)."""
    return math.sqrt(math.fsum((sensitivity / sigma) ** 2 for sigma, sensitivity in stddevs_and_sensitivities))


def compose_discrete(parts: list[DiscreteLoss]) -> DiscreteLoss | None:
    """All `parts` composed, or None if that takes more than MAX_PAIRS or MAX_ATOMS losses."""
    composed = DiscreteLoss.none()
    for part in parts:
        if composed.losses.size * part.losses.size > MAX_PAIRS:
            return None
        composed = composed.compose(part)
        if composed.losses.size > MAX_ATOMS:
            return None
    return composed


def delta_for_epsilon(mu: float, discrete: DiscreteLoss, epsilon: float) -> float:
    """δ(ε) of a Gaussian mechanism with this μ composed with `discrete` (module docstring)."""
    return discrete.infinity + _finite_delta(mu, discrete, epsilon)


def _finite_delta(mu: float, discrete: DiscreteLoss, epsilon: float) -> float:
    """δ(ε) less the mass at +∞."""
    x = epsilon - discrete.losses
    if mu == 0.0:
        tails = -np.expm1(np.minimum(x, 0.0))
    else:
        tails = gaussian_deltas(mu, x)
    # Every term is >= 0: numpy's pairwise sum is within (log2 n + 1) ulps of the exact sum
    # relative to it, far inside DELTA_SAFETY (math.fsum was 30 times slower on 4000 losses).
    return float(np.sum(discrete.masses * tails))


def epsilon_for_delta(mu: float, discrete: DiscreteLoss, delta: float) -> float:
    """Smallest ε >= 0 at which the composition is (ε, δ)-DP, to 1e-12 relative and never
    below the exact value; infinity if no ε is (the mass at +∞ uses up δ)."""
    target = _finite_target(discrete, delta)
    if target is None:
        return math.inf
    return smallest_epsilon(lambda epsilon: _finite_delta(mu, discrete, epsilon) <= target)


def within(mu: float, discrete: DiscreteLoss, epsilon: float, delta: float) -> bool:
    """Whether `epsilon_for_delta(mu, discrete, delta)` is at most `epsilon`, from one δ(ε) (the
    bisection takes some forty). δ is checked at ε·(1 − 2·RELATIVE_TOLERANCE): where it holds
    there, the bisection's last bracket (its lower end failing, at most RELATIVE_TOLERANCE
    wide) ends below `epsilon`. So True is exact; False may be said of an ε within 2e-12
    relative above the crossing."""
    target = _finite_target(discrete, delta)
    return target is not None and _finite_delta(
        mu, discrete, epsilon * (1.0 - 2.0 * RELATIVE_TOLERANCE)) <= target


def _finite_target(discrete: DiscreteLoss, delta: float) -> float | None:
    """What the finite part's δ(ε) must not exceed; None if the mass at +∞ leaves no room."""
    room = delta - discrete.infinity
    if room <= 8 * math.ulp(delta):
        # Within the rounding of the mass at +∞: no room left that can be trusted.
        return None
    # As in `calibration`, against a target a hair below the room left: the finite part's
    # two log-CDF terms may nearly cancel, and their rounding must not let the true δ pass it.
    return room * (1.0 - DELTA_SAFETY)

"""Tight composition in closed form: Gaussian noise with a few discrete privacy losses.

Written by hand, beside dp-accounting, for speed where it matters most: dp-accounting
imports scipy.signal and scipy.stats (over a second on the benchmark machine, most of
a planning step) and builds its PLDs on a grid, while the plans `auto` makes are
mostly Gaussian. Gaussian mechanisms compose exactly into one Gaussian mechanism with
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

from dprun.mechanisms.calibration import DELTA_SAFETY, gaussian_deltas, smallest_epsilon

# Discrete losses composed here at most (their product grows fast); beyond, dp-accounting.
MAX_ATOMS = 4096


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
        # Equal losses are merged, so that composing many costs on one grid stays small.
        losses, where = np.unique(np.add.outer(self.losses, other.losses).ravel(), return_inverse=True)
        return DiscreteLoss(losses, np.bincount(where, weights=np.multiply.outer(self.masses, other.masses).ravel()),
                            # 1 − (1 − a)(1 − b), in a form exact to a few ulps of δ, not of 1.
                            self.infinity + other.infinity - self.infinity * other.infinity)


def gaussian_mu(stddevs_and_sensitivities: Iterable[tuple[float, float]]) -> float:
    """μ of the one Gaussian mechanism that several compose into: sqrt(Σ (Δ/σ)²)."""
    return math.sqrt(math.fsum((sensitivity / sigma) ** 2 for sigma, sensitivity in stddevs_and_sensitivities))


def compose_discrete(parts: list[DiscreteLoss]) -> DiscreteLoss | None:
    """All `parts` composed, or None if that takes more than MAX_ATOMS losses."""
    composed = DiscreteLoss.none()
    for part in parts:
        if composed.losses.size * part.losses.size > MAX_ATOMS:
            return None
        composed = composed.compose(part)
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
    return math.fsum((discrete.masses * tails).tolist())


def epsilon_for_delta(mu: float, discrete: DiscreteLoss, delta: float) -> float:
    """Smallest ε >= 0 at which the composition is (ε, δ)-DP, to 1e-12 relative and never
    below the exact value; infinity if no ε is (the mass at +∞ uses up δ)."""
    room = delta - discrete.infinity
    if room <= 8 * math.ulp(delta):
        # Within the rounding of the mass at +∞: no room left that can be trusted.
        return math.inf
    # As in `calibration`, against a target a hair below the room left: the finite part's
    # two log-CDF terms may nearly cancel, and their rounding must not let the true δ pass it.
    target = room * (1.0 - DELTA_SAFETY)
    return smallest_epsilon(lambda epsilon: _finite_delta(mu, discrete, epsilon) <= target)

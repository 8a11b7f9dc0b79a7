"""One candidate out of a list, chosen by a score with differential privacy: permute-and-flip.

McKenna and Sheldon, "Permute-and-Flip: a new mechanism for differentially private selection"
(NeurIPS 2020): visit the candidates in a uniformly random order and accept each with probability
exp(ε·(u(c) − u*)/(2Δ)), u* the best score; the first accepted wins. ε-DP for scores whose
sensitivity is Δ, never worse than the exponential mechanism in expected score, and with
probability at least 1 − β its choice scores at least u* − (2Δ/ε)·ln(K/β) for K candidates
(the exponential mechanism's bound, which permute-and-flip shares).

Monotone scores. The factor 2 pays for scores that move in opposite directions between
neighbours. Where adding a unit never lowers a score and removing one never raises it (every
score a sum of the units' non-negative terms, as the kept shares of `bound_choice` are),
permute-and-flip accepting with exp(ε·(u(c) − u*)/Δ) is ε-DP: it is report-noisy-max with
exponential noise of scale Δ/ε (Ding, Kifer et al., "The permute-and-flip
mechanism is identical to report-noisy-max with exponential noise", 2021), and report-noisy-max
with noise of scale Δ/ε is ε-DP for monotone scores (Dwork and Roth, Claim 3.9's argument; OpenDP's
noisy max takes the same map for monotonic scores). The shortfall halves with it.

Exactness, as for the candidate quantiles (`quantile_candidates`): scores are integers, rounded
to S~ = floor(u·SCORE_STEPS/Δ), whose sensitivity is SCORE_STEPS exactly; ε is rounded down to
a multiple of 2**-EPSILON_BITS (spends less); γ = ε·(S~* − S~)/(2·SCORE_STEPS) is then an exact
dyadic rational and each coin is an exact Bernoulli(exp(−γ)) (`permute_and_flip`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dprun.mechanisms.quantile_candidates import GAMMA_BITS, WHOLE_CAP, EPSILON_BITS, SCORE_STEPS, permute_and_flip
from dprun.mechanisms.sampling import RandomSource

# The confidence the choice's shortfall is stated at (`shortfall`).
CONFIDENCE = 0.95


def epsilon_steps(epsilon: float) -> int:
    """ε in steps of 2**-EPSILON_BITS, rounded down (0 where ε is below one step)."""
    return math.floor(math.ldexp(epsilon, EPSILON_BITS)) if math.isfinite(epsilon) and epsilon > 0 else 0


def choose_one(scores: Sequence[int], sensitivity: int, epsilon: float, source: RandomSource, *,
               monotone: bool = False) -> int:
    """The index of the candidate chosen by permute-and-flip: ε-DP where one privacy unit moves every
    score by at most `sensitivity` (integers, higher is better); with `monotone`, where moreover it
    moves them all the same way (module docstring), at twice the exponent."""
    steps = epsilon_steps(epsilon)
    if steps < 1 or sensitivity < 1 or not scores:
        raise ValueError(f"choose_one needs candidates, a sensitivity >= 1 and ε >= 2**-{EPSILON_BITS}")
    rounded = [(int(score) * SCORE_STEPS) // sensitivity for score in scores]
    best = max(rounded)
    # γ·2**GAMMA_BITS = steps·(S~* − S~): EPSILON_BITS + log2(2·SCORE_STEPS) = GAMMA_BITS (twice that, monotone).
    factor = 2 if monotone else 1
    scaled = [factor * steps * (best - score) for score in rounded]
    whole = np.array([min(g >> GAMMA_BITS, WHOLE_CAP) for g in scaled], dtype=np.int64)
    fraction = np.array([g & ((1 << GAMMA_BITS) - 1) for g in scaled], dtype=np.int64)
    return int(permute_and_flip(whole[None, :], fraction[None, :], source)[0])


def shortfall(epsilon: float, candidates: int, *, monotone: bool = False) -> float:
    """How far below the best the chosen candidate's score may fall, in units of the sensitivity, with
    probability CONFIDENCE: (2/ε)·ln(K/β), (1/ε)·ln(K/β) for monotone scores; 0 for a single candidate."""
    if candidates <= 1:
        return 0.0
    return (1.0 if monotone else 2.0) / epsilon * math.log(candidates / (1 - CONFIDENCE))

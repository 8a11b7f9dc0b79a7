"""Tests for dprun.mechanisms.score_choice: permute-and-flip over integer scores."""

from __future__ import annotations

import itertools
import math

import dprun_testing
import numpy as np
import pytest
from scipy import stats

from dprun.mechanisms.sampling import RandomSource
from dprun.mechanisms.score_choice import CONFIDENCE, choose_one, shortfall


def permute_and_flip_law(accept: list[float]) -> np.ndarray:
    """The exact law of permute-and-flip: over every order, the first candidate accepted."""
    law = np.zeros(len(accept))
    orders = list(itertools.permutations(range(len(accept))))
    for order in orders:
        rejected = 1.0
        for index in order:
            law[index] += rejected * accept[index] / len(orders)
            rejected *= 1 - accept[index]
    return law


@pytest.mark.parametrize("monotone", [False, True], ids=["any", "monotone"])
def test_the_choice_follows_permute_and_flips_law(monotone: bool) -> None:
    """Scores 0, −1, −3 of sensitivity 1 at ε = 1: candidate i is accepted with e^{−(0 − u_i)/2}, or
    e^{−(0 − u_i)} for monotone scores."""
    seed = dprun_testing.fresh_seed()
    source = RandomSource.from_seed(seed)
    draws = 20_000
    counts = np.bincount([choose_one([0, -1, -3], 1, 1.0, source, monotone=monotone) for _ in range(draws)],
                         minlength=3)
    halve = 1.0 if monotone else 0.5
    expected = permute_and_flip_law([1.0, math.exp(-halve), math.exp(-3 * halve)]) * draws
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(statistic, 2) > 1e-7, f"seed {seed}: {counts} against {expected.round()}"


def test_the_scores_are_measured_in_their_sensitivity() -> None:
    """The same scores at 1,000 times the sensitivity are 1,000 times closer: all but uniform."""
    seed = dprun_testing.fresh_seed()
    source = RandomSource.from_seed(seed)
    counts = np.bincount([choose_one([0, -1, -3], 1000, 1.0, source) for _ in range(6000)], minlength=3)
    # Uniform up to e^{-0.0015}: Binomial(6000, ~1/3) lies in [1700, 2300] but with probability below 1e-9.
    assert ((1700 <= counts) & (counts <= 2300)).all(), f"seed {seed}: {counts}"
    far = [choose_one([0, -10**6], 1, 1.0, source) for _ in range(200)]
    assert set(far) == {0}, f"seed {seed}"


def test_a_single_candidate_has_no_shortfall_and_bad_inputs_are_refused() -> None:
    assert shortfall(1.0, 1) == 0.0
    assert shortfall(0.5, 100) == pytest.approx(4 * math.log(100 / (1 - CONFIDENCE)))
    assert shortfall(0.5, 100, monotone=True) == pytest.approx(2 * math.log(100 / (1 - CONFIDENCE)))
    with pytest.raises(ValueError):
        choose_one([], 1, 1.0, RandomSource.from_seed(1))
    with pytest.raises(ValueError):
        choose_one([1, 2], 1, 1e-12, RandomSource.from_seed(1))

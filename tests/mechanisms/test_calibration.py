"""Tests for dprun.mechanisms.calibration, pinned against dp-accounting and an independent integral."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.pld import privacy_loss_mechanism as plm
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from dprun.mechanisms.calibration import (
    GAUSSIAN_DELTA_SLACK,
    analytic_gaussian_sigma,
    discrete_laplace_std,
    exact_gaussian_budget,
    gaussian_delta,
    gaussian_epsilon,
    laplace_scale,
    sampled_gaussian_guarantee,
)
from dprun.mechanisms.noise import calibrate
from dprun.mechanisms.sampling import GAUSSIAN_SAMPLER_EPSILON

EPSILONS = [1e-4, 0.1, 1.0, 5.0, 50.0]
DELTAS = [1e-15, 1e-10, 1e-5, 0.1, 0.49]
SENSITIVITIES = [1.0, 7.3]
GRID = [(e, d, s) for e in EPSILONS for d in DELTAS for s in SENSITIVITIES]


def hockey_stick_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """δ(ε) of N(0, σ²) vs N(Δ, σ²) as the integral of (p − e^ε q)_+, by quadrature.

    Independent of the closed form: in z = x/σ the privacy loss is
    Δ²/2σ² − zΔ/σ, positive part of p − e^ε q lives on z < a − b; the
    integrand φ(z)(1 − e^{ε − loss}) is formed with expm1, so no cancellation.
    """
    a, b = sensitivity / (2 * sigma), epsilon * sigma / sensitivity
    top, ratio = a - b, sensitivity / sigma

    def integrand(u: float) -> float:
        return math.exp(-0.5 * (top - u) ** 2) / math.sqrt(2 * math.pi) * -math.expm1(-ratio * u)

    value, _ = integrate.quad(integrand, 0, math.inf, epsabs=0, epsrel=1e-13, limit=200)
    return value


def test_laplace_scale() -> None:
    assert laplace_scale(1.0, 1.0) == 1.0
    assert laplace_scale(2.0, 0.5) == 4.0
    assert laplace_scale(3.0, 0.1) == pytest.approx(30.0, rel=1e-15)
    for bad in [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (1.0, math.inf), (math.nan, 1.0)]:
        with pytest.raises(ValueError):
            laplace_scale(*bad)


@pytest.mark.parametrize("t", [0.05, 0.5, 1.0, 3.0, 40.0])
def test_discrete_laplace_std_matches_the_summed_variance(t: float) -> None:
    k = np.arange(-4000, 4001, dtype=np.float64)
    weights = np.exp(-np.abs(k) / t)
    variance = float(np.sum(k**2 * weights) / np.sum(weights))
    assert discrete_laplace_std(t) == pytest.approx(math.sqrt(variance), rel=1e-12)


def test_discrete_laplace_std_pins() -> None:
    assert discrete_laplace_std(1.0) == pytest.approx(1.3569624860015788, rel=1e-15)
    # Large t: the continuous Laplace's sqrt(2)·t, with no cancellation in 1 − e^{-1/t}.
    assert discrete_laplace_std(1e6) == pytest.approx(math.sqrt(2) * 1e6, rel=1e-9)
    assert discrete_laplace_std(1e12) == pytest.approx(math.sqrt(2) * 1e12, rel=1e-9)


@pytest.mark.parametrize(
    ("sigma", "sensitivity", "epsilon"),
    [(3.0, 2.0, 0.5), (100.0, 1.0, 0.01), (7.487, 1.0, 1.0), (0.205, 1.0, 50.0), (61463.6, 1.0, 1e-4),
     (0.7, 3.0, 2.0)],
)
def test_gaussian_delta_matches_quadrature(sigma: float, sensitivity: float, epsilon: float) -> None:
    expected = hockey_stick_delta(sigma, sensitivity, epsilon)
    assert gaussian_delta(sigma, sensitivity, epsilon) == pytest.approx(expected, rel=1e-8)


def test_gaussian_delta_pins_and_edges() -> None:
    # ε = 0: δ = 2Φ(Δ/2σ) − 1, the total variation distance.
    assert gaussian_delta(1.0, 1.0, 0.0) == pytest.approx(0.38292492254802624, rel=1e-14)
    # Large ε with a large σ: e^50 must not overflow, the answer underflows to 0 cleanly.
    assert gaussian_delta(1000.0, 1.0, 50.0) == 0.0
    assert gaussian_delta(0.2, 1.0, 50.0) == pytest.approx(hockey_stick_delta(0.2, 1.0, 50.0), rel=1e-8)
    with pytest.raises(ValueError):
        gaussian_delta(0.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        gaussian_delta(1.0, 1.0, -1.0)


@pytest.mark.parametrize(("epsilon", "delta", "sensitivity"), GRID)
def test_analytic_sigma_meets_delta_and_is_tight(epsilon: float, delta: float, sensitivity: float) -> None:
    sigma = analytic_gaussian_sigma(sensitivity, epsilon, delta)
    assert gaussian_delta(sigma, sensitivity, epsilon) <= delta
    assert hockey_stick_delta(sigma, sensitivity, epsilon) <= delta
    # dp-accounting's own closed form for the Gaussian mechanism agrees.
    reference = plm.GaussianPrivacyLoss(sigma, sensitivity).get_delta_for_epsilon(epsilon)
    assert reference == pytest.approx(delta, rel=2e-6)
    # Tight: 0.1% less noise breaks the bound.
    assert gaussian_delta(sigma * (1 - 1e-3), sensitivity, epsilon) > delta


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-5), (0.1, 1e-10), (5.0, 1e-6), (1e-4, 1e-5)])
def test_analytic_sigma_against_dp_accounting_pld(epsilon: float, delta: float) -> None:
    sigma = analytic_gaussian_sigma(1.0, epsilon, delta)
    interval = min(1e-3, epsilon / 100)
    loss = pld.from_gaussian_mechanism(
        standard_deviation=sigma, sensitivity=1.0, value_discretization_interval=interval
    )
    assert loss.get_delta_for_epsilon(epsilon) == pytest.approx(delta, rel=1e-3)
    smaller = pld.from_gaussian_mechanism(
        standard_deviation=sigma * (1 - 1e-3), sensitivity=1.0, value_discretization_interval=interval
    )
    assert smaller.get_delta_for_epsilon(epsilon) > delta


def test_analytic_sigma_pins() -> None:
    # Balle & Wang's example regime: ε = 1, δ = 1e-5, Δ = 1 needs σ ≈ 3.73 (classical bound: 4.84).
    assert analytic_gaussian_sigma(1.0, 1.0, 1e-5) == pytest.approx(3.7306316, rel=1e-7)
    assert analytic_gaussian_sigma(1.0, 0.1, 1e-10) == pytest.approx(54.20629583692886, rel=1e-6)
    assert analytic_gaussian_sigma(1.0, 50.0, 1e-15) == pytest.approx(0.20514271101917425, rel=1e-6)


def test_analytic_sigma_rejects_bad_input() -> None:
    for bad in [(0.0, 1.0, 1e-5), (1.0, 0.0, 1e-5), (1.0, 1.0, 0.0), (1.0, 1.0, 1.0), (1.0, math.nan, 1e-5)]:
        with pytest.raises(ValueError):
            analytic_gaussian_sigma(*bad)


positive_sensitivity = st.floats(min_value=1e-3, max_value=1e6)
epsilon_values = st.floats(min_value=1e-4, max_value=50.0)
delta_values = st.floats(min_value=1e-15, max_value=0.49)


@settings(max_examples=60, deadline=None)
@given(positive_sensitivity, epsilon_values, epsilon_values, delta_values)
def test_sigma_decreases_in_epsilon(sensitivity: float, e1: float, e2: float, delta: float) -> None:
    low, high = sorted((e1, e2))
    less_noise = analytic_gaussian_sigma(sensitivity, high, delta)
    # Up to the solver's documented precision (1e-7 relative): for ε a few ulps apart, the
    # rounding of `gaussian_delta` near δ = 1e-15 moved the crossing by 1.5e-11.
    assert less_noise <= analytic_gaussian_sigma(sensitivity, low, delta) * (1 + 1e-7)


@settings(max_examples=60, deadline=None)
@given(positive_sensitivity, epsilon_values, delta_values, delta_values)
def test_sigma_decreases_in_delta(sensitivity: float, epsilon: float, d1: float, d2: float) -> None:
    low, high = sorted((d1, d2))
    less_noise = analytic_gaussian_sigma(sensitivity, epsilon, high)
    assert less_noise <= analytic_gaussian_sigma(sensitivity, epsilon, low) * (1 + 1e-7)  # precision, as above


@settings(max_examples=60, deadline=None)
@given(positive_sensitivity, st.floats(min_value=1e-3, max_value=1e3), epsilon_values, delta_values)
def test_sigma_is_linear_in_sensitivity(sensitivity: float, factor: float, epsilon: float, delta: float) -> None:
    base = analytic_gaussian_sigma(sensitivity, epsilon, delta)
    scaled = analytic_gaussian_sigma(sensitivity * factor, epsilon, delta)
    assert scaled == pytest.approx(base * factor, rel=1e-9)


@pytest.mark.parametrize(
    ("epsilon", "delta", "sensitivity"), [(1.0, 1e-5, 1.0), (0.1, 1e-10, 7.3), (20.0, 1e-8, 2.0)]
)
def test_gaussian_epsilon_inverts_the_calibration(epsilon: float, delta: float, sensitivity: float) -> None:
    sigma = analytic_gaussian_sigma(sensitivity, epsilon, delta)
    found = gaussian_epsilon(sigma, sensitivity, delta)
    # Both bisections stop at 1e-12 relative; the δ margin makes ε slightly smaller.
    assert found <= epsilon * (1 + 1e-12)
    assert found == pytest.approx(epsilon, rel=1e-5)
    assert gaussian_delta(sigma, sensitivity, found) <= delta


def test_gaussian_epsilon_edges() -> None:
    assert gaussian_epsilon(1.0, 1.0, 0.0) == math.inf
    # So much noise that δ(0) is already below δ: ε = 0.
    assert gaussian_epsilon(1e9, 1.0, 1e-5) == 0.0


@pytest.mark.parametrize(("epsilon", "delta", "l0"), [(1.0, 1e-6, 16), (0.1, 1e-9, 1), (3.0, 1e-5, 500)])
def test_gaussian_noise_is_calibrated_for_the_budget_less_the_lattice_and_the_sampler(
        epsilon: float, delta: float, l0: int) -> None:
    noise = calibrate("gaussian", 0, 1, l0, epsilon, delta)
    fold = l0 * GAUSSIAN_SAMPLER_EPSILON
    exact_epsilon, continuous_delta = exact_gaussian_budget(epsilon, delta, l0)
    assert (exact_epsilon, continuous_delta) == (epsilon - fold, delta / (1 + fold) - GAUSSIAN_DELTA_SLACK)
    # σ is the analytic one for the reduced budget: what it achieves, folded back, fits the budget ...
    achieved = gaussian_epsilon(noise.parameter, noise.sensitivity, continuous_delta)
    assert achieved <= exact_epsilon * (1 + 1e-11)
    folded_epsilon, folded_delta = sampled_gaussian_guarantee(achieved, continuous_delta, l0)
    assert folded_epsilon <= epsilon * (1 + 1e-11) and folded_delta <= delta * (1 + 1e-15)
    # ... and the plan states the budget, which includes the fold.
    assert (noise.epsilon, noise.delta) == (epsilon, delta)
    assert noise.scaled(1.0).epsilon == pytest.approx(epsilon, rel=1e-9)
    assert noise.scaled(1.0).epsilon >= folded_epsilon * (1 - 1e-12)

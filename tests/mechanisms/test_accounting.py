"""Tests for dprun.mechanisms.accounting: exact basic composition and pessimistic PLD composition."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from dprun.mechanisms import accounting
from dprun.mechanisms.accounting import (
    ApproxCost,
    NoiseCost,
    compose_basic,
    epsilon_delta_of,
    pld_epsilon,
    pld_noise_multiplier,
)
from dprun.mechanisms.calibration import (
    GAUSSIAN_DELTA_SLACK,
    analytic_gaussian_sigma,
    exact_gaussian_budget,
    gaussian_delta,
)
from dprun.mechanisms.sampling import GAUSSIAN_SAMPLER_EPSILON


def gaussian(epsilon: float, delta: float, sensitivity: float = 1.0) -> NoiseCost:
    return NoiseCost("gaussian", analytic_gaussian_sigma(sensitivity, epsilon, delta), sensitivity, 1)


def mixed_costs() -> list[NoiseCost | ApproxCost]:
    """Ten mechanisms like a planned release: Gaussian counts, fixed-point Laplace sums, selections."""
    costs: list[NoiseCost | ApproxCost] = [gaussian(0.1, 1e-7, math.sqrt(j + 1)) for j in range(5)]
    costs += [NoiseCost("laplace", 2**30 * (j + 1) / 0.1, float(2**30 * (j + 1))) for j in range(3)]
    return [*costs, ApproxCost(0.1, 1e-7), ApproxCost(0.0, 1e-7)]


# --- basic composition -----------------------------------------------------------


def test_basic_sums_never_under_report() -> None:
    epsilon, delta = compose_basic([(0.1, 1e-10)] * 10)
    assert epsilon >= 1.0 and Fraction(epsilon) >= 10 * Fraction(0.1)
    assert epsilon == math.nextafter(1.0, math.inf)  # the exact sum of ten 0.1 floats is just above 1
    assert Fraction(delta) >= 10 * Fraction(1e-10)
    assert delta == pytest.approx(1e-9, rel=1e-15)


def test_basic_sums_are_exact_when_representable() -> None:
    assert compose_basic([(0.5, 0.0), (0.25, 1e-6), (0.125, 0.0)]) == (0.875, 1e-6)
    assert compose_basic([]) == (0.0, 0.0)
    # float addition would give 0.30000000000000004, which is the correctly rounded-up answer too.
    assert compose_basic([(0.1, 0.0), (0.2, 0.0)])[0] == 0.30000000000000004


def test_epsilon_delta_of() -> None:
    assert epsilon_delta_of(NoiseCost("laplace", 4.0, 2.0), 1e-9) == (0.5, 0.0)
    assert epsilon_delta_of(ApproxCost(0.3, 1e-7), 1e-9) == (0.3, 1e-7)
    epsilon, delta = epsilon_delta_of(gaussian(1.0, 1e-5), 1e-5)
    assert delta == 1e-5 and epsilon == pytest.approx(1.0, rel=1e-5) and epsilon <= 1.0 + 1e-12
    assert epsilon_delta_of(gaussian(1.0, 1e-5), 0.0)[0] == math.inf


def test_costs_validate() -> None:
    for make in [
        lambda: NoiseCost("uniform", 1.0, 1.0),  # type: ignore[arg-type]
        lambda: NoiseCost("laplace", 0.0, 1.0),
        lambda: NoiseCost("gaussian", 1.0, math.inf),
        lambda: ApproxCost(-1.0, 0.0),
        lambda: ApproxCost(1.0, 2.0),
    ]:
        with pytest.raises(ValueError):
            make()


# --- PLD -------------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "delta", "sensitivity"), [(1.0, 1e-5, 1.0), (0.1, 1e-8, 3.0), (4.0, 1e-10, 2.5)])
def test_pld_of_one_gaussian_matches_the_analytic_mechanism(epsilon: float, delta: float, sensitivity: float) -> None:
    # Calibrated as `noise.calibrate` does: for the budget less the lattice slack and the sampler's fold.
    exact_epsilon, continuous_delta = exact_gaussian_budget(epsilon, delta, 1)
    cost = gaussian(exact_epsilon, continuous_delta, sensitivity)
    found = pld_epsilon([cost], delta)
    # Pessimistic: never below the exact ε, and within a few grid steps (1e-3·ε) of it.
    assert gaussian_delta(cost.parameter, cost.sensitivity, found - GAUSSIAN_SAMPLER_EPSILON) <= continuous_delta
    assert epsilon * (1 - 1e-6) <= found <= epsilon * 1.003


def test_pld_holds_back_the_lattice_slack_once_per_gaussian() -> None:
    """Three Gaussians at δ = 2^-33: the continuous composition gets 2^-33 − 3·2^-36 = 5·2^-36."""
    costs = [gaussian(1.0, 1e-9, 1.0)] * 3
    delta = 2.0**-33
    found = pld_epsilon(costs, delta)
    composed = pld.from_gaussian_mechanism(costs[0].parameter, sensitivity=1.0, value_discretization_interval=1e-4)
    composed = composed.self_compose(3)
    assert composed.get_delta_for_epsilon(found - 3 * GAUSSIAN_SAMPLER_EPSILON) <= 5 * GAUSSIAN_DELTA_SLACK * (1 + 1e-3)
    # At the full δ the ε would be 1.2% smaller, well beyond the PLD grid's 0.1%.
    assert found > composed.get_epsilon_for_delta(delta) * 1.006
    with pytest.raises(ValueError, match="too small for 3 Gaussian mechanisms"):
        pld_epsilon(costs, 3 * GAUSSIAN_DELTA_SLACK)


@pytest.mark.parametrize(
    ("t", "sensitivity", "interval"),
    [(1.0, 1, 1e-3), (2.0, 5, 1e-3), (300.7, 1000, 1e-3), (3001.3, 1000, 1e-3), (12_987.65, 20_001, 1e-3),
     (12_987.65, 20_001, 1e-4)],
)
def test_discrete_laplace_pld_matches_dp_accounting(t: float, sensitivity: int, interval: float) -> None:
    # Covers both constructions: one x per grid step (2/t >= interval) and runs of x.
    # No a(Δ − 2x) lands on a grid point here, so the two must agree exactly.
    reference = pld.from_discrete_laplace_mechanism(
        parameter=1 / t, sensitivity=sensitivity, value_discretization_interval=interval
    )
    ours = accounting._discrete_laplace_pld(t, sensitivity, interval)
    epsilons = np.linspace(0.0, 1.1 * sensitivity / t, 12)
    np.testing.assert_allclose(
        ours.get_delta_for_epsilon(epsilons), reference.get_delta_for_epsilon(epsilons), rtol=1e-9, atol=1e-14
    )


def test_discrete_laplace_pld_on_grid_aligned_losses() -> None:
    # Here a(Δ − 2x) hits grid points exactly; float rounding may put such x on
    # either side (in dp_accounting too), which moves δ by a few 1e-5 at most.
    reference = pld.from_discrete_laplace_mechanism(
        parameter=1e-4, sensitivity=20_000, value_discretization_interval=1e-3
    )
    ours = accounting._discrete_laplace_pld(1e4, 20_000, 1e-3)
    epsilons = np.linspace(0.0, 1.8, 10)
    np.testing.assert_allclose(
        ours.get_delta_for_epsilon(epsilons), reference.get_delta_for_epsilon(epsilons), rtol=1e-4
    )


def test_discrete_laplace_with_a_fixed_point_sensitivity_is_bucketed_by_loss_and_pure() -> None:
    sensitivity = 50 * 2**30
    t, interval = sensitivity / 0.5, 1e-4
    # One mass per grid step of the losses' range [−aΔ, aΔ] (aΔ = 0.5), not one per value
    # between 0 and Δ (5·10^10 of them).
    masses = accounting._discrete_laplace_masses(t, sensitivity, interval)
    assert len(masses) <= 2 * math.ceil(0.5 / interval) + 3
    assert math.isclose(sum(masses.values()), 1.0, rel_tol=1e-9)
    found = pld_epsilon([NoiseCost("laplace", t, float(sensitivity))], 1e-12)
    assert 0.5 * (1 - 1e-6) <= found <= 0.5 * 1.002


def test_continuous_laplace_pld_would_under_report_discrete_noise() -> None:
    # Why integer sensitivities use the discrete PLD: at t = Δ = 1 the discrete
    # mechanism is randomized response, whose δ(ε) exceeds the continuous Laplace's.
    discrete = pld.from_discrete_laplace_mechanism(parameter=1.0, sensitivity=1, value_discretization_interval=1e-4)
    continuous = pld.from_laplace_mechanism(parameter=1.0, sensitivity=1, value_discretization_interval=1e-4)
    assert discrete.get_delta_for_epsilon(0.5) > 1.2 * continuous.get_delta_for_epsilon(0.5)


def test_non_integer_laplace_sensitivity_is_accounted_as_pure_dp() -> None:
    found = pld_epsilon([NoiseCost("laplace", 2.0, 1.5)], 1e-12)
    assert 0.75 - 1e-9 <= found <= 0.75 * 1.002
    # Two of them compose below the basic 1.5 at a non-trivial δ, as randomized response does.
    two = pld_epsilon([NoiseCost("laplace", 2.0, 1.5)] * 2, 1e-3)
    assert two <= 1.5 * 1.002


@pytest.mark.parametrize("k", [2, 5, 10])
def test_pld_composition_beats_basic_composition(k: int) -> None:
    epsilon_i, delta_i = 0.5, 1e-6
    found = pld_epsilon([gaussian(epsilon_i, delta_i)] * k, k * delta_i)
    basic = compose_basic([(epsilon_i, delta_i)] * k)[0]
    assert found < basic
    assert found < {2: 0.9, 5: 1.9, 10: 3.0}[k]


def test_pld_pins() -> None:
    # Ten mechanisms of a release: about 0.57 by PLD, 0.9 by basic composition.
    costs = mixed_costs()
    found = pld_epsilon(costs, 1e-6)
    assert found == pytest.approx(0.5718, abs=2e-3)
    assert compose_basic([epsilon_delta_of(c, 1e-7) for c in costs])[0] == pytest.approx(0.9, rel=1e-6)
    assert pld_epsilon([], 1e-6) == 0.0
    with pytest.raises(ValueError):
        pld_epsilon(costs, 0.0)


def test_noise_multiplier_shrinks_noise_within_budget() -> None:
    costs = mixed_costs()
    noise = [c for c in costs if isinstance(c, NoiseCost)]
    fixed = [c for c in costs if isinstance(c, ApproxCost)]
    k = pld_noise_multiplier(noise, fixed, 1.0, 1e-6)
    assert 0.3 < k < 1.0

    def scaled(factor: float) -> list[NoiseCost | ApproxCost]:
        return [dataclasses.replace(c, parameter=c.parameter * factor) for c in noise] + fixed

    assert pld_epsilon(scaled(k), 1e-6) <= 1.0
    assert pld_epsilon(scaled(k * (1 - 3e-4)), 1e-6) > 1.0


def test_noise_multiplier_grows_noise_when_over_budget() -> None:
    costs = [gaussian(1.0, 1e-6)] * 4
    k = pld_noise_multiplier(costs, [], 1.0, 4e-6)
    assert 1.0 < k < 2.0
    assert pld_epsilon([dataclasses.replace(c, parameter=c.parameter * k) for c in costs], 4e-6) <= 1.0


@pytest.mark.parametrize(("costs", "closed_form"), [
    (mixed_costs()[:5] + mixed_costs()[-2:], True),
    ([NoiseCost("laplace", 20.0, 8.0), NoiseCost("laplace", 40.0, 8.0), ApproxCost(0.3, 1e-7)], True),
    (mixed_costs(), False),
], ids=["gaussians and selections", "laplace and a selection", "three fixed-point sums too (dp-accounting)"])
def test_pld_within_says_whether_pld_epsilon_is_within(costs: list[NoiseCost | ApproxCost], closed_form: bool) -> None:
    continuous_delta, interval, _ = accounting._continuous_terms(costs, 1e-6, accounting.RELATIVE_DISCRETIZATION)
    assert (accounting._closed_form_parts(costs, interval) is not None) == closed_form
    found = pld_epsilon(costs, 1e-6)
    assert accounting.pld_within(costs, found * (1 + 1e-9), 1e-6)
    # Never within where pld_epsilon is larger, not even by one ulp.
    assert not accounting.pld_within(costs, math.nextafter(found, 0.0), 1e-6)


def test_noise_multiplier_refuses_an_impossible_budget() -> None:
    with pytest.raises(ValueError):
        pld_noise_multiplier([gaussian(1.0, 1e-6)], [ApproxCost(2.0, 1e-7)], 1.0, 1e-6)
    with pytest.raises(ValueError):
        pld_noise_multiplier([ApproxCost(0.1, 1e-7)], [], 1.0, 1e-6)

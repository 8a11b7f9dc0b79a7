"""Tests for dprun.mechanisms.closed_form_pld: Gaussian noise with discrete losses, in closed form.

The closed form must lie between dp-accounting's optimistic and pessimistic PLDs of
the same mechanisms on the same grid (an exact Gaussian part between the two roundings).
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from dprun.mechanisms import accounting, closed_form_pld
from dprun.mechanisms.accounting import ApproxCost, Cost, NoiseCost
from dprun.mechanisms.calibration import gaussian_delta, gaussian_epsilon
from dprun.mechanisms.closed_form_pld import DiscreteLoss, delta_for_epsilon, epsilon_for_delta

INTERVAL = 1e-4


def optimistic_epsilon(costs: list[Cost], delta: float) -> float:
    """A lower bound on the composition's ε from dp-accounting (losses rounded down)."""
    composed = None
    for cost in costs:
        if isinstance(cost, ApproxCost):
            # The worst case, with ±ε on the grid: no rounding either way.
            step, kept = round(cost.epsilon / INTERVAL), 1 - cost.delta
            masses = {step: kept / (1 + math.exp(-cost.epsilon)), -step: kept / (1 + math.exp(cost.epsilon))}
            if step == 0:
                masses = {0: kept}
            part = pld.PrivacyLossDistribution.create_from_rounded_probability(
                masses, cost.delta, INTERVAL, pessimistic_estimate=False)
        elif cost.noise == "gaussian":
            part = pld.from_gaussian_mechanism(cost.parameter, sensitivity=cost.sensitivity, pessimistic_estimate=False,
                                               value_discretization_interval=INTERVAL)
        else:
            part = pld.from_discrete_laplace_mechanism(1 / cost.parameter, sensitivity=int(cost.sensitivity),
                                                       pessimistic_estimate=False,
                                                       value_discretization_interval=INTERVAL)
        composed = part if composed is None else composed.compose(part)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(delta))


def random_costs(rng: np.random.Generator) -> list[Cost]:
    """1–4 Gaussians, and maybe a selection's worst case, a discrete Laplace and a pure δ."""
    costs: list[Cost] = [NoiseCost("gaussian", float(rng.uniform(0.5, 20.0)), float(rng.choice([1.0, 8.0, 3.5])), 1)
                         for _ in range(int(rng.integers(1, 5)))]
    if rng.random() < 0.5:
        costs.append(ApproxCost(round(float(rng.uniform(0.05, 1.0)), 2), float(rng.choice([0.0, 1e-7]))))
    if rng.random() < 0.5:
        sensitivity = int(rng.choice([1, 4, 64]))
        costs.append(NoiseCost("laplace", sensitivity / float(rng.uniform(0.1, 1.0)), float(sensitivity)))
    if rng.random() < 0.5:
        costs.append(ApproxCost(0.0, 1e-8))
    return costs


@pytest.mark.parametrize("seed", range(12))
def test_closed_form_lies_between_dp_accountings_bounds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = random_costs(rng)
    delta = float(rng.choice([1e-5, 1e-6, 1e-3]))
    closed = accounting._closed_form_epsilon(costs, delta, INTERVAL)
    assert closed is not None
    pessimistic = accounting._dp_accounting_epsilon(costs, delta, INTERVAL)
    optimistic = optimistic_epsilon(costs, delta)
    assert optimistic * (1 - 1e-6) <= closed <= pessimistic * (1 + 1e-6), (seed, costs, optimistic, closed, pessimistic)
    # The two bounds are close, so the test pins the closed form down.
    assert pessimistic - optimistic < 0.01 * pessimistic + 5 * len(costs) * INTERVAL


@pytest.mark.parametrize(("k", "sigma", "sensitivity", "delta"), [(1, 3.0, 1.0, 1e-5), (4, 10.0, 2.0, 1e-6),
                                                                   (25, 40.0, 1.5, 1e-9)])
def test_gaussians_compose_into_one_gaussian(k: int, sigma: float, sensitivity: float, delta: float) -> None:
    mu = closed_form_pld.gaussian_mu([(sigma, sensitivity)] * k)
    assert mu == pytest.approx(math.sqrt(k) * sensitivity / sigma, rel=1e-15)
    found = epsilon_for_delta(mu, DiscreteLoss.none(), delta)
    assert found == pytest.approx(gaussian_epsilon(sigma / math.sqrt(k), sensitivity, delta), rel=1e-10)
    assert delta_for_epsilon(mu, DiscreteLoss.none(), 0.7) == pytest.approx(
        gaussian_delta(sigma / math.sqrt(k), sensitivity, 0.7), rel=1e-9)


def test_worst_case_alone_gives_back_its_epsilon() -> None:
    # Randomized response with ε = 0.5 and δ = 1e-6: at δ just above 1e-6 its ε is a hair below 0.5.
    found = epsilon_for_delta(0.0, DiscreteLoss.worst_case(0.5, 1e-6), 1e-6 * (1 + 1e-3))
    assert 0.499 < found <= 0.5
    assert epsilon_for_delta(0.0, DiscreteLoss.worst_case(0.5, 1e-6), 1e-6) == math.inf
    # The mass at +∞ counts in full: pure δ composed with a Gaussian moves the Gaussian's δ by exactly that much.
    mu = 0.4
    with_delta = DiscreteLoss.worst_case(0.0, 1e-7)
    assert delta_for_epsilon(mu, with_delta, 1.0) == pytest.approx(
        1e-7 + (1 - 1e-7) * delta_for_epsilon(mu, DiscreteLoss.none(), 1.0), rel=1e-12)


def test_many_selections_pure_deltas_stay_in_closed_form() -> None:
    # A spec of many queries has one threshold δ each; equal losses merge, so they compose in closed form.
    costs: list[Cost] = [NoiseCost("gaussian", 4.0 + j, 2.0, 1) for j in range(3)] + [ApproxCost(0.0, 1e-8)] * 20
    closed = accounting._closed_form_epsilon(costs, 1e-5, INTERVAL)
    assert closed is not None
    assert optimistic_epsilon(costs, 1e-5) * (1 - 1e-6) <= closed <= accounting._dp_accounting_epsilon(
        costs, 1e-5, INTERVAL) * (1 + 1e-6)


def test_laplace_noise_on_one_grid_composes_in_closed_form() -> None:
    # restaurants_private.yaml's plan: a count's and a mean's discrete Laplace noise (a fixed-point
    # sum's ~200 losses) and a selection. Their float sums differ in the last bits; merged,
    # they stay a few hundred losses, where distinct floats would be thousands.
    costs: list[Cost] = [NoiseCost("laplace", 23.0, 8.0), NoiseCost("laplace", 46.0, 8.0),
                         NoiseCost("laplace", 5e4, 2000.0), ApproxCost(0.33, 1e-7)]
    interval = 1e-3 * 0.35  # as the planner's: relative to the largest ε (`accounting._discretization`)
    closed = accounting._closed_form_epsilon(costs, 1e-6, interval)
    assert closed is not None
    assert optimistic_epsilon(costs, 1e-6) * (1 - 1e-6) <= closed <= accounting._dp_accounting_epsilon(
        costs, 1e-6, interval) * (1 + 1e-6)


def test_losses_equal_but_for_rounding_merge_at_the_larger() -> None:
    composed = DiscreteLoss(np.array([0.1, 0.5]), np.array([0.5, 0.5]), 0.0).compose(
        DiscreteLoss(np.array([0.2, -0.2]), np.array([0.25, 0.75]), 0.0))
    assert 0.1 + 0.2 != 0.5 - 0.2
    assert composed.losses.tolist() == [-0.1, max(0.1 + 0.2, 0.5 - 0.2), 0.7]
    assert composed.masses.tolist() == pytest.approx([0.375, 0.125 + 0.375, 0.125], abs=1e-16)


def test_too_many_discrete_losses_go_to_dp_accounting() -> None:
    big = NoiseCost("laplace", 2**30 / 0.1, float(2**30))
    assert accounting._closed_form_epsilon([big] * 3, 1e-6, 1e-3) is not None
    assert accounting._closed_form_epsilon([big] * 5, 1e-6, 1e-3) is None
    assert accounting._closed_form_epsilon([big, NoiseCost("gaussian", 3.0, 1.0, 1)], 1e-6, 1e-3) is not None


def test_planning_a_gaussian_release_does_not_import_dp_accounting(tmp_path) -> None:
    # dp-accounting's import (scipy.signal, scipy.stats) costs more than the whole plan: the
    # benchmark's automatic plan (a Gaussian threshold on weighted counts, and counts) must not need it.
    data = tmp_path / "rows.csv"
    data.write_text("user_id,key\n1,2\n")
    spec = tmp_path / "spec.json"
    spec.write_text(
        '{"version": 1, "name": "g", "privacy_unit": "user_id",'
        ' "budget": {"epsilon": 1.0986, "delta": 1e-5, "accounting": "pld"},'
        f' "inputs": {{"rows": {{"path": "{data}"}}}},'
        ' "queries": [{"name": "q", "input": "rows", "group_by": ["key"],'
        '   "contribution_bounds": {"max_partitions_contributed": 64, "max_contributions_per_partition": 1},'
        '   "metrics": [{"name": "n", "kind": "count"}], "output": {"path": "out.parquet"}}]}'
    )
    code = ("import sys; from dprun import api; p = api.plan(api.validate(sys.argv[1]));"
            " print(p.queries[0].selection.mechanism, 'dp_accounting' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["weighted_gaussian_threshold", "False"]


def test_a_mass_at_infinity_just_under_delta_leaves_a_pure_composition() -> None:
    # The planner gives a selection δ·(1 − 2^-40) of its query's δ; the sliver left must still
    # let pure Laplace noise compose (restaurants_multi.yaml's per_day query).
    costs: list[Cost] = [NoiseCost("laplace", 20.0, 5.0), ApproxCost(0.25, 2.5e-6 * (1 - 2**-40))]
    found = accounting._closed_form_epsilon(costs, 2.5e-6, 1e-3)
    assert found == pytest.approx(accounting._dp_accounting_epsilon(costs, 2.5e-6, 1e-3), abs=1e-9)
    assert 0.5 <= found <= 0.501

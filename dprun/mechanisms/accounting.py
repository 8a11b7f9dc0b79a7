"""Composition: the total (ε, δ) of everything a release publishes.

Two accountants:

* `compose_basic`: sums of ε and of δ ([D20 §2.1.6],
  Proposition 5), exact.
* `pld_epsilon`: tight composition of the actual noise distributions with
  privacy loss distributions (dp_accounting.pld; Koskela et al., Doroshenko et
  al. 2022 "Connect the dots"), the route [D20 §4.3.3]
  ("Gaussian noise") points to for many Gaussian mechanisms; Gaussian noise
  with few other losses in closed form (`closed_form_pld`). All PLDs are
  pessimistic, so the ε they give is an upper bound.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from dp_accounting.pld import privacy_loss_distribution as pld

from dprun.mechanisms import closed_form_pld
from dprun.mechanisms.calibration import GAUSSIAN_DELTA_SLACK, gaussian_epsilon
from dprun.mechanisms.sampling import GAUSSIAN_SAMPLER_EPSILON

# Privacy-loss grid of the PLDs, relative to the largest standalone ε of the
# composed mechanisms, and at most that much in absolute terms (see `_discretization`).
RELATIVE_DISCRETIZATION = 1e-3
ROUGH_DISCRETIZATION = 1e-2
_MIN_DISCRETIZATION = 1e-6

# pld_noise_multiplier stops when its bracket is this narrow, relatively.
MULTIPLIER_TOLERANCE = 1e-4
ROUGH_TOLERANCE = 0.02
# and gives up looking for a large enough multiplier beyond this one.
_MAX_MULTIPLIER = 2.0**40


@dataclass(frozen=True)
class NoiseCost:
    """One noise mechanism as released.

    `noise`: discrete Laplace P(k) ∝ e^{-|k|/t} or discrete Gaussian with σ, on
    the same integer grid as `sensitivity` (L1 for Laplace, L2 for Gaussian).
    """

    noise: Literal["laplace", "gaussian"]
    parameter: float
    sensitivity: float
    # Gaussian: how many released values one unit can change (its L0), for the sampler's
    # float64 error (`calibration.exact_gaussian_budget`); Laplace is sampled exactly.
    changed: int = 0

    def __post_init__(self) -> None:
        if self.noise not in ("laplace", "gaussian"):
            raise ValueError(f"noise must be 'laplace' or 'gaussian', got {self.noise!r}")
        if self.noise == "gaussian" and self.changed < 1:
            raise ValueError("a Gaussian NoiseCost needs `changed` >= 1, the values one unit can change")
        for name in ("parameter", "sensitivity"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")


@dataclass(frozen=True)
class ApproxCost:
    """A mechanism known only by its (ε, δ) guarantee (partition selection, or anything else)."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        if not (self.epsilon >= 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be finite and >= 0, got {self.epsilon!r}")
        if not 0 <= self.delta <= 1:
            raise ValueError(f"delta must be in [0, 1], got {self.delta!r}")


Cost = NoiseCost | ApproxCost


def epsilon_delta_of(cost: Cost, delta_for_gaussian: float) -> tuple[float, float]:
    """Standalone (ε, δ) guarantee of one mechanism.

    Discrete Laplace: (Δ1/t, 0), the geometric mechanism ([D20 §2.1.6],
    Proposition 7). Discrete Gaussian: (ε, `delta_for_gaussian`) with ε from
    the analytic Gaussian mechanism ([D20 §4.3.3], Theorem 16); infinite ε when
    `delta_for_gaussian` is 0.
    """
    if isinstance(cost, ApproxCost):
        return cost.epsilon, cost.delta
    if cost.noise == "laplace":
        return cost.sensitivity / cost.parameter, 0.0
    return gaussian_epsilon(cost.parameter, cost.sensitivity, delta_for_gaussian), delta_for_gaussian


def compose_basic(parts: list[tuple[float, float]]) -> tuple[float, float]:
    """(Σε, Σδ) ([D20 §2.1.6], Proposition 5), summed exactly and rounded up to a float.

    Every float is an exact rational; the sums are taken in `Fraction` and the
    result is the smallest float not below the exact sum, so it never
    under-reports (ten times 0.1 gives 1.0000000000000002, the float above
    the exact sum of the ten floats 0.1).
    """
    return (
        _float_at_least(sum((Fraction(e) for e, _ in parts), Fraction(0))),
        _float_at_least(sum((Fraction(d) for _, d in parts), Fraction(0))),
    )


def pld_epsilon(costs: list[Cost], delta: float, relative_discretization: float = RELATIVE_DISCRETIZATION) -> float:
    """Upper bound on the ε of all `costs` composed, at total `delta`, by PLD accounting.

    PLDs: discrete Laplace with an integer sensitivity exactly, its losses
    rounded up to the grid (`_discrete_laplace_masses`); discrete Laplace with a
    non-integer sensitivity as a generic pure (Δ1/t)-DP mechanism (the worst
    case for that ε, randomized response; the continuous Laplace PLD is not an
    upper bound for discrete noise); Gaussian noise as the continuous Gaussian
    at the same σ and L2 sensitivity, which describes a discrete Gaussian only
    on a lattice fine relative to σ (as in `dprun.mechanisms.noise`; on the
    integers with σ of a few units, the discrete Gaussian's δ can be several
    percent higher); ApproxCost as the worst case for its (ε, δ). As calibration does
    for one Gaussian (`calibration.exact_gaussian_budget`), the continuous Gaussians are
    composed at δ/(1 + F) less GAUSSIAN_DELTA_SLACK per Gaussian (the lattice's gap),
    and F is added to the ε found, F being GAUSSIAN_SAMPLER_EPSILON per value a unit
    can change in a Gaussian (the sampler's float64 acceptance step; docs/mechanisms.md,
    "Accounting").

    Gaussian noise with few other losses (every plan `auto` makes for counts) is
    composed in closed form (`closed_form_pld`), exactly for the Gaussians; the
    rest with dp_accounting's PLDs (`_dp_accounting_epsilon`). Everything is
    pessimistic. Returns 0 for no costs.
    """
    if not costs:
        return 0.0
    continuous_delta, interval, fold = _continuous_terms(costs, delta, relative_discretization)
    closed = _closed_form_epsilon(costs, continuous_delta, interval)
    exact = closed if closed is not None else _dp_accounting_epsilon(costs, continuous_delta, interval)
    return exact + fold


def pld_within(costs: list[Cost], epsilon: float, delta: float,
               relative_discretization: float = RELATIVE_DISCRETIZATION) -> bool:
    """Whether `pld_epsilon(costs, delta, relative_discretization)` is at most `epsilon`.

    In closed form from one δ(ε) (`closed_form_pld.within`), not the forty of finding ε; never
    True where `pld_epsilon` would exceed `epsilon`, and False only within 2e-12 relative of it.
    """
    if not costs:
        return epsilon >= 0.0
    continuous_delta, interval, fold = _continuous_terms(costs, delta, relative_discretization)
    closed = _closed_form_parts(costs, interval)
    if closed is None:
        return _dp_accounting_epsilon(costs, continuous_delta, interval) + fold <= epsilon
    return closed_form_pld.within(*closed, epsilon - fold, continuous_delta)


def _continuous_terms(costs: list[Cost], delta: float, relative_discretization: float) -> tuple[float, float, float]:
    """The δ the continuous Gaussians are composed at, the loss grid, and the samplers' ε (`pld_epsilon`)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    gaussians = [c for c in costs if isinstance(c, NoiseCost) and c.noise == "gaussian"]
    changed = sum(c.changed for c in gaussians)
    # As `exact_gaussian_budget` for one Gaussian: the samplers' fold is one factor over all.
    fold = changed * GAUSSIAN_SAMPLER_EPSILON
    continuous_delta = delta / (1.0 + fold) - len(gaussians) * GAUSSIAN_DELTA_SLACK
    if not continuous_delta > 0:
        raise ValueError(f"delta {delta!r} is too small for {len(gaussians)} Gaussian mechanisms "
                         f"(each holds back {GAUSSIAN_DELTA_SLACK:.1e} for its lattice)")
    return continuous_delta, _discretization(costs, continuous_delta, relative_discretization), fold


def _closed_form_epsilon(costs: list[Cost], delta: float, interval: float) -> float | None:
    """The composition's ε in closed form, or None if its discrete losses are too many."""
    closed = _closed_form_parts(costs, interval)
    return None if closed is None else closed_form_pld.epsilon_for_delta(*closed, delta)


def _closed_form_parts(costs: list[Cost], interval: float) -> tuple[float, closed_form_pld.DiscreteLoss] | None:
    """The Gaussians' μ and the other losses composed, or None if those are too many."""
    gaussians = [(c.parameter, c.sensitivity) for c in costs if isinstance(c, NoiseCost) and c.noise == "gaussian"]
    discrete = closed_form_pld.compose_discrete(
        [_discrete_loss(c, interval) for c in costs if not (isinstance(c, NoiseCost) and c.noise == "gaussian")])
    return None if discrete is None else (closed_form_pld.gaussian_mu(gaussians), discrete)


def _discrete_loss(cost: Cost, interval: float) -> closed_form_pld.DiscreteLoss:
    if isinstance(cost, ApproxCost):
        return closed_form_pld.DiscreteLoss.worst_case(cost.epsilon, cost.delta)
    if not float(cost.sensitivity).is_integer():
        return closed_form_pld.DiscreteLoss.worst_case(cost.sensitivity / cost.parameter, 0.0)
    masses = _discrete_laplace_masses(cost.parameter, int(cost.sensitivity), interval)
    return closed_form_pld.DiscreteLoss(np.array(list(masses), dtype=np.float64) * interval,
                                        np.array(list(masses.values())), 0.0)


def _dp_accounting_epsilon(costs: list[Cost], delta: float, interval: float) -> float:
    composed: pld.PrivacyLossDistribution | None = None
    for cost, count in Counter(costs).items():
        single = _cost_pld(cost, interval)
        part = single.self_compose(count) if count > 1 else single
        composed = part if composed is None else composed.compose(part)
    assert composed is not None
    return float(composed.get_epsilon_for_delta(delta))


def pld_noise_multiplier(
    costs: Sequence[Cost], fixed: Sequence[ApproxCost], epsilon: float, delta: float, rough: bool = False
) -> float:
    """Smallest factor k (to 1e-4 relative, rounded up) keeping the composition within (ε, δ).

    `rough` searches to 2% on a 10 times coarser loss grid (still an upper bound on ε),
    several times faster: enough to compare plans, not to release with.

    Every NoiseCost parameter in `costs` is multiplied by k; ApproxCosts in
    `costs` and `fixed` are kept as they are. The bracket is bisected in
    log k and its upper end returned, so `pld_epsilon` of the scaled costs and
    `fixed` is at most `epsilon` at `delta`. Raises ValueError when there is no
    noise to scale or no k works (the fixed costs alone exceed the budget).
    """
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
    if not any(isinstance(c, NoiseCost) for c in costs):
        raise ValueError("no NoiseCost to scale")

    def fits(k: float) -> bool:
        scaled: list[Cost] = [
            NoiseCost(c.noise, c.parameter * k, c.sensitivity, c.changed) if isinstance(c, NoiseCost) else c
            for c in costs
        ]
        return pld_within([*scaled, *fixed], epsilon, delta, relative_discretization)

    tolerance, relative_discretization = (ROUGH_TOLERANCE, ROUGH_DISCRETIZATION) if rough else (
        MULTIPLIER_TOLERANCE, RELATIVE_DISCRETIZATION)

    hi = 1.0
    while not fits(hi):
        hi *= 2.0
        if hi > _MAX_MULTIPLIER:
            raise ValueError("no noise multiplier fits the budget: the fixed costs alone exceed it")
    lo = hi / 2.0
    while fits(lo):
        hi, lo = lo, lo / 2.0
    while math.log(hi / lo) > tolerance:
        mid = math.sqrt(lo * hi)
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _float_at_least(value: Fraction) -> float:
    result = float(value)  # correctly rounded, to either side
    return math.nextafter(result, math.inf) if Fraction(result) < value else result


def _discretization(costs: list[Cost], delta: float, relative: float) -> float:
    """Grid of the privacy loss: `relative` (1e-3) of the largest standalone ε, within [1e-6, relative].

    Pessimistic rounding adds at most one grid step per composed mechanism to
    the loss; a grid relative to the mechanisms' own ε keeps that overhead near
    0.1% per mechanism for small budgets, and the PLDs near a few thousand
    points for any budget.
    """
    share = delta / len(costs)
    largest = max(epsilon_delta_of(c, share)[0] for c in costs)
    return min(relative, max(_MIN_DISCRETIZATION, relative * largest))


def _cost_pld(cost: Cost, interval: float) -> pld.PrivacyLossDistribution:
    # Imported here: dp_accounting pulls in scipy.signal and scipy.stats (over a second), which
    # only compositions the closed form does not cover need.
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld
    if isinstance(cost, ApproxCost):
        return pld.from_privacy_parameters(
            common.DifferentialPrivacyParameters(cost.epsilon, cost.delta), value_discretization_interval=interval
        )
    if cost.noise == "gaussian":
        return pld.from_gaussian_mechanism(
            standard_deviation=cost.parameter,
            sensitivity=cost.sensitivity,
            pessimistic_estimate=True,
            value_discretization_interval=interval,
        )
    if float(cost.sensitivity).is_integer():
        return _discrete_laplace_pld(cost.parameter, int(cost.sensitivity), interval)
    # Whatever grid the noise lives on, the mechanism is pure (Δ1/t)-DP, and
    # randomized response is the worst case of every pure ε-DP mechanism.
    return pld.from_privacy_parameters(
        common.DifferentialPrivacyParameters(cost.sensitivity / cost.parameter, 0.0),
        value_discretization_interval=interval,
    )


def _discrete_laplace_pld(t: float, sensitivity: int, interval: float) -> pld.PrivacyLossDistribution:
    """Pessimistic PLD of f + X, X with P(x) ∝ e^{-a|x|} (a = 1/t), integer sensitivity Δ."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.PrivacyLossDistribution.create_from_rounded_probability(
        _discrete_laplace_masses(t, sensitivity, interval), infinity_mass=0.0,
        value_discretization_interval=interval, pessimistic_estimate=True,
    )


def _discrete_laplace_masses(t: float, sensitivity: int, interval: float) -> dict[int, float]:
    """The PLD of discrete Laplace noise (above) as {loss in grid steps, rounded up: mass}.

    The same privacy-buckets construction as dp_accounting's
    `from_discrete_laplace_mechanism`, which enumerates every x in [0, Δ] and so
    cannot handle the sensitivities of fixed-point sums (Δ ~ 2^30). With
    x ~ X, the privacy loss is a(|x − Δ| − |x|): aΔ for x <= 0 (mass 1/(1+p),
    p = e^{-a}), −aΔ for x >= Δ (mass p^Δ/(1+p)), a(Δ − 2x) in between. Each loss
    is rounded up to the grid; the x sharing a grid point form a run whose
    mass is a difference of the tails P(X >= k) = p^k/(1+p), so the work is
    O(min(Δ, aΔ/interval)). A loss computed within float rounding (~1e-16
    relative) of a grid point may land on either side of it, as in
    dp_accounting. The PLD is the same for adding and removing a unit.
    """
    a = 1.0 / t
    log1p_p = math.log1p(math.exp(-a))
    masses: dict[int, float] = {
        math.ceil(a * sensitivity / interval): math.exp(-log1p_p),
    }
    masses[math.ceil(-a * sensitivity / interval)] = masses.get(
        math.ceil(-a * sensitivity / interval), 0.0
    ) + math.exp(-a * sensitivity - log1p_p)
    if sensitivity > 1:
        if 2 * a >= interval:
            # A grid step holds at most one x: bucket each x on its own.
            starts = np.arange(1, sensitivity, dtype=np.float64)
            buckets = np.ceil(a * (sensitivity - 2 * starts) / interval).astype(np.int64)
        else:
            # Runs of x per grid point: bucket j holds (Δ − j·h/a)/2 <= x < (Δ − (j−1)·h/a)/2.
            top = math.ceil(a * (sensitivity - 2) / interval)
            bottom = math.ceil(a * (2 - sensitivity) / interval)
            buckets = np.arange(top, bottom - 1, -1, dtype=np.int64)
            starts = np.maximum(1.0, np.ceil((sensitivity - buckets * interval / a) / 2))
            # Equal starts mean empty buckets: x = start belongs to the lowest of them.
            keep = np.append(starts[:-1] < starts[1:], True)
            buckets, starts = buckets[keep], starts[keep]
        ends = np.append(starts[1:], float(sensitivity))  # each run is [start, end)
        run_mass = np.exp(-a * starts - log1p_p) * -np.expm1(-a * (ends - starts))
        for bucket, mass in zip(buckets.tolist(), run_mass.tolist(), strict=True):
            masses[bucket] = masses.get(bucket, 0.0) + mass
    return masses

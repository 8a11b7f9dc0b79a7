"""Tests for dprun.mechanisms.selection: DP constraints, thresholds, and the runtime decision.

Statistical assertions use exact binomial tails; each test draws a fresh seed from
os.urandom and names it in its messages. The one-sided "kept at most as often as
claimed" checks run at 1e-7 each, every other binomial side at 1e-8, so the whole
file fails by chance with probability below 1e-6.
"""

from __future__ import annotations

import math
import os
from statistics import NormalDist

import numpy as np
import pytest
from scipy import stats

from dprun.mechanisms import selection
from dprun.mechanisms.calibration import analytic_gaussian_sigma, exact_gaussian_budget, gaussian_delta
from dprun.mechanisms.noise import NoisePlan, calibrate
from dprun.mechanisms.sampling import GAUSSIAN_SAMPLER_EPSILON, RandomSource
from dprun.mechanisms.selection import (
    NoisyThreshold,
    SelectionMechanism,
    TruncatedGeometric,
    gaussian_threshold,
    keep_probability,
    laplace_threshold,
    released_count_threshold,
    select_partitions,
    threshold_for,
    units_to_keep,
    with_noise,
)

ALPHA_UPPER = 1e-7  # "kept too often" in the single-unit tests
ALPHA = 1e-8  # every other binomial side

GEOMETRIC = [
    TruncatedGeometric(1.0, 1e-5, 1),
    TruncatedGeometric(0.1, 1e-8, 1),
    TruncatedGeometric(2.0, 0.3, 1),
    TruncatedGeometric(1.0, 1e-10, 5),
    TruncatedGeometric(0.1, 1e-6, 100),  # ε' = 1e-3: ~4e4 steps
    TruncatedGeometric(1.0, 1e-6, 10_000),  # ε' = 1e-4: ~3e5 steps
]
# (ε, δ, L0, k)
LAPLACE_CASES = [(1.0, 1e-5, 1, 1), (0.5, 1e-8, 7, 1), (1.0, 1e-6, 3, 4), (0.1, 1e-6, 100, 2), (2.0, 0.3, 1, 1)]
GAUSSIAN_CASES = [
    (1.0, 1e-5, 1, 1),
    (1.0, 1e-5, 10, 1),
    (0.3, 1e-7, 50, 2),
    (0.01, 1e-8, 1000, 1),  # σ ≈ 1.3e4
    (2.0, 0.3, 1, 3),  # a large δ: the threshold sits about 1σ out
]


def case_id(case: tuple[float, float, int, int]) -> str:
    return "eps={}-delta={}-l0={}-k={}".format(*case)


def describe(m: SelectionMechanism) -> str:
    if isinstance(m, TruncatedGeometric):
        return str(m)
    n = m.noise
    return (f"NoisyThreshold({n.kind}, grid=2^{n.grid_exponent}, l0={n.l0}, std={n.std:.6g}, "
            f"tau={m.threshold!r}, k={m.pre_threshold}, c={m.contribution})")


def fresh_source() -> tuple[int, RandomSource]:
    seed = int.from_bytes(os.urandom(8), "big")
    return seed, RandomSource.from_seed(seed)


def recursive_table(epsilon: float, delta: float) -> np.ndarray:
    """The paper's recursion, step by step, until it reaches 1."""
    pi = [0.0]
    while pi[-1] < 1.0:
        prev = pi[-1]
        pi.append(min(math.exp(epsilon) * prev + delta, 1 - math.exp(-epsilon) * (1 - prev - delta), 1.0))
    return np.array(pi)


def laplace_tail(t: float, j: float) -> float:
    """P(X >= j) for the discrete Laplace P(x) ∝ e^{-|x|/t} on the integers, in closed form.

    j >= 1: Σ_{x>=j} (1−p)/(1+p) p^x = p^j/(1+p), p = e^{-1/t}; j <= 0 by symmetry.
    """
    j = math.ceil(j)
    p = math.exp(-1.0 / t)
    if j >= 1:
        return math.exp(-j / t) / (1.0 + p)
    return 1.0 - math.exp((j - 1) / t) / (1.0 + p)


def summed_tail(kind: str, parameter: float, j: float) -> float:
    """P(X >= j) for integer noise by direct summation of the unnormalised pmf."""
    width = int((60 if kind == "laplace" else 45) * parameter) + 60
    x = np.arange(-width, width + 1, dtype=np.float64)
    if kind == "laplace":
        weights = np.exp(-np.abs(x) / parameter)
    else:
        weights = np.exp(-0.5 * (x / parameter) ** 2)
    return float(math.fsum(weights[x >= j]) / math.fsum(weights))


def continuous_gaussian_tail(std: float, x: float) -> float:
    """P(Y >= x) for Y ~ N(0, std²)."""
    return float(stats.norm.sf(x / std))


def lattice_bound(m: NoisyThreshold) -> float:
    """L0 · P(Y >= τ − c·k − h): the rigorous upper bound on L0 · P(c·k + lattice noise >= τ)."""
    h = math.ldexp(1.0, m.noise.grid_exponent)
    return m.noise.l0 * continuous_gaussian_tail(m.noise.std, m.threshold - m.contribution * m.pre_threshold - h)


def selection_delta(m: SelectionMechanism) -> float:
    """The per-partition bound on the keep probability of a partition one unit made eligible."""
    if isinstance(m, TruncatedGeometric):
        return m.delta / m.max_partitions
    if m.noise.kind == "gaussian":  # gaussian_threshold: the threshold gets δ/2
        return m.noise.delta / m.noise.l0
    raise AssertionError("use the δ the Laplace threshold was built with")


# --- truncated geometric ---------------------------------------------------------


@pytest.mark.parametrize("m", GEOMETRIC, ids=str)
def test_truncated_geometric_satisfies_the_dp_constraints(m: TruncatedGeometric) -> None:
    eps, delta = m.epsilon / m.max_partitions, m.delta / m.max_partitions
    end = units_to_keep(m, 1.0)
    pi = keep_probability(m, np.arange(0, end + 3))
    assert pi[0] == 0.0
    # π is computed for δ' less what its float rounding can add (PROBABILITY_ERROR) ...
    assert pi[1] == pytest.approx(delta - (1 + math.exp(eps)) * selection.PROBABILITY_ERROR, rel=1e-12)
    assert np.all(pi[end:] == 1.0) and pi[end - 1] < 1.0
    assert np.all(np.diff(pi) >= 0)
    # ... so both directions of (ε', δ')-DP between n − 1 and n units, for "kept" and
    # "dropped", hold for the floats themselves, with the stated δ' and no tolerance.
    assert np.all(pi[1:] <= math.exp(eps) * pi[:-1] + delta)
    assert np.all(1 - pi[:-1] <= math.exp(eps) * (1 - pi[1:]) + delta)


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(1.0, 1e-5), (0.1, 1e-8), (0.01, 1e-3), (2.0, 0.3), (5.0, 1e-10), (0.5, 0.5)]
)
def test_truncated_geometric_matches_the_recursion(epsilon: float, delta: float) -> None:
    m = TruncatedGeometric(epsilon, delta, 1)
    expected = recursive_table(*selection._exact_partition_budget(m))
    got = keep_probability(m, np.arange(expected.size + 5))
    np.testing.assert_allclose(got[: expected.size], expected, rtol=1e-12, atol=1e-15)
    assert np.all(got[expected.size :] == 1.0)


def test_truncated_geometric_pins() -> None:
    m = TruncatedGeometric(1.0, 1e-5, 1)
    # δ = 1e-5 less (1 + e)·2^-46 for rounding; π(11) = δ (e^11 − 1)/(e − 1) ≈ 0.348 (first
    # branch); π(12) = 1 − e^{-1}(1 − π(11) − δ) ≈ 0.760 (second branch).
    delta = 1e-5 - (1 + math.e) * 2.0**-46
    pi = keep_probability(m, np.array([11, 12]))
    assert pi[0] == pytest.approx(delta * math.expm1(11) / math.expm1(1), rel=1e-12)
    assert pi[1] == pytest.approx(1 - math.exp(-1) * (1 - pi[0] - delta), rel=1e-12)
    assert units_to_keep(m, 0.5) == 12
    # L0 = 10 divides the budget: ε' = 0.1, δ' = 1e-6.
    assert keep_probability(TruncatedGeometric(1.0, 1e-5, 10), np.array([1]))[0] == pytest.approx(1e-6)


@pytest.mark.parametrize(
    ("shifted", "unshifted"),
    [
        (TruncatedGeometric(1.0, 1e-5, 3, pre_threshold=5), TruncatedGeometric(1.0, 1e-5, 3)),
        (laplace_threshold(1.0, 1e-5, 3, 5), laplace_threshold(1.0, 1e-5, 3)),
        (gaussian_threshold(1.0, 1e-5, 3, 5), gaussian_threshold(1.0, 1e-5, 3)),
    ],
    ids=["geometric", "laplace", "gaussian"],
)
def test_pre_threshold_shifts_the_curve(shifted: SelectionMechanism, unshifted: SelectionMechanism) -> None:
    n = np.arange(0, 400)
    p = keep_probability(shifted, n)
    assert np.all(p[:5] == 0.0)
    # Exact for the integer-valued mechanisms; the Gaussian τ = c·k + σz + h rounds differently.
    np.testing.assert_allclose(p[5:], keep_probability(unshifted, n[5:] - 4), rtol=1e-9, atol=0)
    assert units_to_keep(shifted, 0.5) == units_to_keep(unshifted, 0.5) + 4
    if isinstance(shifted, NoisyThreshold):
        assert isinstance(unshifted, NoisyThreshold)
        assert shifted.noise == unshifted.noise
        assert shifted.threshold == pytest.approx(unshifted.threshold + 4, rel=1e-14)


# --- the Laplace threshold -------------------------------------------------------


@pytest.mark.parametrize("case", LAPLACE_CASES, ids=case_id)
def test_laplace_threshold_bounds_a_single_unit_and_is_tight(case: tuple[float, float, int, int]) -> None:
    epsilon, delta, l0, k = case
    m = laplace_threshold(epsilon, delta, l0, k)
    noise = m.noise
    # ε-DP discrete Laplace on the integer grid for L1 sensitivity L0: t = L0/ε.
    assert (noise.kind, noise.grid_exponent, noise.linf, noise.l0) == ("laplace", 0, 1, l0)
    assert noise.parameter == pytest.approx(l0 / epsilon, rel=1e-15)
    assert noise.sensitivity / noise.parameter <= epsilon * (1 + 1e-15)
    assert (m.pre_threshold, m.contribution) == (k, 1)
    assert m.threshold == int(m.threshold)
    t, offset = noise.parameter, m.threshold - k
    assert l0 * laplace_tail(t, offset) <= delta
    assert l0 * laplace_tail(t, offset - 1) > delta  # τ − 1 would not do
    # The closed form against a direct sum of the pmf.
    if t <= 1000:
        assert summed_tail("laplace", t, offset) == pytest.approx(laplace_tail(t, offset), rel=1e-9)
        assert summed_tail("laplace", t, offset - 1) == pytest.approx(laplace_tail(t, offset - 1), rel=1e-9)


def test_laplace_threshold_pins() -> None:
    # P(X >= 12) = e^{-12}/(1 + e^{-1}) = 4.5e-6 <= 1e-5 < P(X >= 11): τ = 1 + 12.
    m = laplace_threshold(1.0, 1e-5, 1)
    assert m.noise.parameter == 1.0 and m.threshold == 13
    assert laplace_threshold(1.0, 1e-5, 1, 3).threshold == 15
    assert laplace_threshold(0.5, 1e-6, 6).noise.parameter == 12.0


@pytest.mark.parametrize(("epsilon", "delta", "l0"), [(1.0, 1e-5, 1), (0.5, 1e-8, 4), (2.0, 1e-6, 20)])
def test_laplace_threshold_is_close_to_seed_001_theorem_12(epsilon: float, delta: float, l0: int) -> None:
    # Theorem 12 with continuous Laplace noise of scale L0/ε: τ = 1 + (L0/ε) ln(L0/(2δ)).
    # The geometric tail p^k/(1+p) is a little heavier than e^{-k/t}/2, so τ is a little higher.
    continuous = 1 + l0 / epsilon * math.log(l0 / (2 * delta))
    tau = laplace_threshold(epsilon, delta, l0).threshold
    assert continuous <= tau <= continuous + l0 / epsilon * math.log(2) + 1


# --- the Gaussian threshold ------------------------------------------------------


@pytest.mark.parametrize("case", GAUSSIAN_CASES, ids=case_id)
def test_gaussian_threshold_bounds_a_single_unit_and_is_not_wasteful(case: tuple[float, float, int, int]) -> None:
    epsilon, delta, l0, k = case
    m = gaussian_threshold(epsilon, delta, l0, k)
    noise = m.noise
    assert (noise.kind, noise.l0, noise.epsilon, noise.delta) == ("gaussian", l0, epsilon, delta / 2)
    assert (m.pre_threshold, m.contribution) == (k, 1)
    # L0 · P(c·k + Y >= τ − h) <= δ/2 bounds the lattice noise's tail (threshold_for's docstring).
    assert lattice_bound(m) <= delta / 2
    # ... with (almost) equality, so a threshold σ/100 lower breaks the bound by more than 1 %.
    assert lattice_bound(m) >= delta / 2 * (1 - 1e-6)
    h = math.ldexp(1.0, noise.grid_exponent)
    lower = l0 * continuous_gaussian_tail(noise.std, m.threshold - noise.std / 100 - k - h)
    assert lower > delta / 2 * 1.01
    # The lattice is fine: h is negligible next to σ.
    assert h <= noise.std * 2.0**-38


@pytest.mark.parametrize("case", GAUSSIAN_CASES, ids=case_id)
def test_gaussian_threshold_noise_keeps_its_epsilon_delta_claim(case: tuple[float, float, int, int]) -> None:
    epsilon, delta, l0, k = case
    noise = gaussian_threshold(epsilon, delta, l0, k).noise
    # L2 sensitivity √L0 · 1 in real units (a unit adds 1 to each of at most L0 counts).
    assert gaussian_delta(noise.std, math.sqrt(l0), epsilon) <= delta / 2
    # ... and it is the analytic Gaussian σ for (ε, δ/2 − the lattice slack), no larger.
    assert noise.std >= analytic_gaussian_sigma(math.sqrt(l0), epsilon, delta / 2)
    exact_epsilon, target = exact_gaussian_budget(epsilon, delta / 2, l0)
    assert noise.std == pytest.approx(analytic_gaussian_sigma(math.sqrt(l0), exact_epsilon, target), rel=1e-9)
    # In grid units: σ for L2 = √L0 · linf with linf = 1/h.
    assert noise.linf == 2 ** -noise.grid_exponent
    assert noise.sensitivity == pytest.approx(math.sqrt(l0) * noise.linf, rel=1e-15)


def test_gaussian_threshold_pins() -> None:
    g = gaussian_threshold(1.0, 1e-5, 1)
    # σ from the analytic Gaussian mechanism for (1, 5e-6) (2^-36 of δ goes to the lattice slack).
    assert g.noise.std == pytest.approx(3.8841410229313267, rel=1e-6)
    assert g.noise.std >= analytic_gaussian_sigma(1.0, 1.0, 5e-6)
    # τ = 1 + σ·Φ^{-1}(1 − 5e-6) + h ≈ 18.157.
    assert g.threshold == pytest.approx(1 + g.noise.std * stats.norm.isf(5e-6), rel=1e-9)
    assert g.threshold == pytest.approx(18.1569, abs=1e-3)
    g10 = gaussian_threshold(1.0, 1e-5, 10)
    assert g10.noise.std == pytest.approx(analytic_gaussian_sigma(math.sqrt(10), 1.0, 5e-6), rel=1e-6)
    assert g10.threshold == pytest.approx(1 + g10.noise.std * stats.norm.isf(5e-7), rel=1e-9)


@pytest.mark.parametrize(
    ("sigma", "delta", "l0", "c", "k"),
    [(0.5, 1e-3, 1, 1, 1), (0.8, 1e-6, 3, 2, 2), (3.0, 1e-6, 1, 1, 1), (40.0, 1e-9, 25, 2, 3), (2.0, 0.4, 1, 1, 1)],
)
def test_gaussian_threshold_is_sound_on_a_coarse_lattice(sigma: float, delta: float, l0: int, c: int, k: int) -> None:
    # On the integers (h = 1, σ of a few units) the shift by h matters: check the exact
    # lattice tail, summed, against δ.
    noise = NoisePlan("gaussian", 0, 1, l0, sigma, 1.0, 1e-6)
    m = released_count_threshold(noise, delta, c, k)
    assert l0 * summed_tail("gaussian", sigma, m.threshold - c * k) <= delta
    assert lattice_bound(m) <= delta


# --- thresholds on released counts, and with other noise ------------------------


@pytest.mark.parametrize(
    "noise",
    [
        calibrate("laplace", 0, 1, 1, 1.0, 0.0),
        calibrate("laplace", 0, 3, 10, 0.5, 0.0),
        calibrate("gaussian", 0, 1, 1, 1.0, 1e-6),
        calibrate("gaussian", 0, 2, 25, 0.3, 1e-8),
    ],
    ids=["laplace-l0=1", "laplace-linf=3-l0=10", "gaussian-l0=1", "gaussian-linf=2-l0=25"],
)
@pytest.mark.parametrize(("c", "k"), [(1, 1), (3, 1), (1, 4), (3, 4)])
def test_released_count_threshold_accounts_for_c_times_k(noise: NoisePlan, c: int, k: int) -> None:
    delta = 1e-7
    m = released_count_threshold(noise, delta, c, k)
    assert (m.noise, m.pre_threshold, m.contribution) == (noise, k, c)
    assert m.threshold == threshold_for(noise, delta, c, k)
    # A partition one unit made eligible holds a count of at most c·k.
    if noise.kind == "laplace":
        offset = m.threshold - c * k
        assert offset == int(offset)
        assert noise.l0 * laplace_tail(noise.parameter, offset) <= delta
        assert noise.l0 * laplace_tail(noise.parameter, offset - 1) > delta
        assert m.threshold == released_count_threshold(noise, delta, 1, 1).threshold + c * k - 1
    else:
        assert lattice_bound(m) <= delta
        assert lattice_bound(m) >= delta * (1 - 1e-6)
        base = released_count_threshold(noise, delta, 1, 1).threshold
        assert m.threshold == pytest.approx(base + c * k - 1, rel=1e-14)


def test_released_count_threshold_agrees_with_the_separate_mechanisms() -> None:
    laplace = laplace_threshold(0.7, 1e-6, 5, 3)
    assert released_count_threshold(laplace.noise, 1e-6, 1, 3) == laplace
    gauss = gaussian_threshold(0.7, 1e-6, 5, 3)
    assert released_count_threshold(gauss.noise, 5e-7, 1, 3) == gauss


def test_released_count_keep_probability() -> None:
    keep = NoisyThreshold(calibrate("laplace", 0, 1, 1, 1.0, 0.0), 13.0, pre_threshold=2)
    p = keep_probability(keep, np.array([0, 1, 2, 13, 40]))
    assert p[0] == p[1] == 0.0
    assert p[2] == pytest.approx(summed_tail("laplace", 1.0, 11), rel=1e-12)
    assert p[3] == pytest.approx(summed_tail("laplace", 1.0, 0), rel=1e-12)
    assert p[4] == pytest.approx(1.0)
    assert units_to_keep(keep, 0.5) == 13


@pytest.mark.parametrize(
    ("m", "delta"),
    [
        (laplace_threshold(1.0, 1e-5, 3, 2), 1e-5),
        (released_count_threshold(calibrate("laplace", 0, 2, 4, 1.0, 0.0), 1e-6, 2, 3), 1e-6),
        (gaussian_threshold(1.0, 1e-5, 3, 2), 5e-6),
        (released_count_threshold(calibrate("gaussian", 0, 1, 10, 0.5, 1e-6), 1e-7, 3, 2), 1e-7),
    ],
    ids=["laplace", "laplace-released", "gaussian", "gaussian-released"],
)
def test_with_noise_moves_the_threshold_and_keeps_delta(m: NoisyThreshold, delta: float) -> None:
    assert with_noise(m, m.noise, delta) == m
    c, k = m.contribution, m.pre_threshold
    previous = -math.inf
    for factor in [0.5, 1.0, 2.0, 7.5]:
        noise = m.noise.scaled(factor)
        moved = with_noise(m, noise, delta)
        assert (moved.noise, moved.pre_threshold, moved.contribution) == (noise, k, c)
        assert moved.threshold > previous, factor  # more noise, higher threshold
        previous = moved.threshold
        if noise.kind == "laplace":
            offset = (moved.threshold - c * k) / 2.0**noise.grid_exponent
            assert noise.l0 * laplace_tail(noise.parameter, offset) <= delta
            assert noise.l0 * laplace_tail(noise.parameter, offset - 1) > delta
        else:
            assert lattice_bound(moved) <= delta


# --- curves ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "m",
    GEOMETRIC[:4]
    + [laplace_threshold(*case) for case in LAPLACE_CASES]
    + [gaussian_threshold(*case) for case in GAUSSIAN_CASES]
    + [released_count_threshold(calibrate("gaussian", 0, 1, 4, 1.0, 1e-6), 1e-6, 3, 2)],
    ids=describe,
)
def test_keep_probability_is_monotone_and_units_to_keep_consistent(m: SelectionMechanism) -> None:
    top = units_to_keep(m, 0.999)
    p = keep_probability(m, np.arange(0, top + 10))
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(p[: m.pre_threshold] == 0.0)
    assert np.all(np.diff(p) >= 0)
    for probability in [1e-3, 0.5, 0.95, 0.999, 1.0]:
        if probability == 1.0 and isinstance(m, NoisyThreshold) and m.noise.std > 1e3:
            continue  # P = 1 in float64 only some 40σ out
        n = units_to_keep(m, probability)
        both = keep_probability(m, np.array([n - 1, n]))
        assert both[1] >= probability > both[0], (probability, n)
        assert n >= m.pre_threshold


def test_invalid_parameters_are_rejected() -> None:
    laplace = calibrate("laplace", 0, 1, 1, 1.0, 0.0)
    for make in [
        lambda: TruncatedGeometric(0.0, 1e-5, 1),
        lambda: TruncatedGeometric(1.0, 0.0, 1),
        lambda: TruncatedGeometric(1.0, 1e-5, 1, pre_threshold=0),
        lambda: laplace_threshold(1.0, 1.0, 1),
        lambda: laplace_threshold(math.inf, 1e-5, 1),
        lambda: laplace_threshold(1.0, 1e-5, 1, 0),
        lambda: gaussian_threshold(1.0, 1e-5, 0),
        lambda: gaussian_threshold(1.0, 1e-12, 1),  # δ/2 below the smallest Gaussian δ
        lambda: released_count_threshold(laplace, 1e-5, 0),
        lambda: released_count_threshold(laplace, 0.0, 1),
        lambda: released_count_threshold(laplace, 1e-5, 1, 0),
        lambda: units_to_keep(TruncatedGeometric(1.0, 1e-5, 1), 0.0),
        lambda: units_to_keep(laplace_threshold(1.0, 1e-5, 1), 1.5),
    ]:
        with pytest.raises(ValueError):
            make()


# --- the runtime decision --------------------------------------------------------


def assert_binomial(kept: int, trials: int, p: float, context: str, alpha_upper: float = ALPHA) -> None:
    """Exact binomial check: not kept more often (at `alpha_upper`) or more rarely (at ALPHA) than p."""
    assert stats.binom.sf(kept - 1, trials, p) > alpha_upper, f"kept too often: {kept}/{trials} vs p={p} ({context})"
    assert stats.binom.cdf(kept, trials, p) > ALPHA, f"kept too rarely: {kept}/{trials} vs p={p} ({context})"


SINGLE_UNIT = [
    (TruncatedGeometric(1.0, 1e-2, 1), 1e-2),
    (TruncatedGeometric(1.0, 1e-2, 4), 1e-2 / 4),
    (laplace_threshold(1.0, 1e-2, 1), 1e-2),
    (laplace_threshold(1.0, 1e-2, 4), 1e-2 / 4),
    (gaussian_threshold(1.0, 1e-2, 1), 1e-2 / 2),
    (gaussian_threshold(1.0, 1e-2, 4), 1e-2 / 2 / 4),
]


@pytest.mark.parametrize(("m", "bound"), SINGLE_UNIT, ids=[describe(m) for m, _ in SINGLE_UNIT])
def test_single_unit_partitions_are_kept_at_most_as_often_as_claimed(m: SelectionMechanism, bound: float) -> None:
    seed, source = fresh_source()
    trials = 1_000_000
    kept = int(select_partitions(m, np.ones(trials, dtype=np.int64), source).sum())
    claimed = float(keep_probability(m, np.array([1]))[0])
    # The per-partition δ' (δ/L0, or δ/(2·L0) for the Gaussian threshold) bounds the single-unit keep rate.
    assert claimed <= bound * (1 + 1e-9)
    assert claimed >= bound * 0.4  # the budget is used, not wasted
    assert_binomial(kept, trials, claimed, f"seed={seed}, {describe(m)}", alpha_upper=ALPHA_UPPER)


@pytest.mark.parametrize(
    "m",
    [TruncatedGeometric(1.0, 1e-5, 2, pre_threshold=3), laplace_threshold(1.0, 1e-5, 2, 3),
     gaussian_threshold(1.0, 1e-5, 2, 3),
     released_count_threshold(calibrate("gaussian", 0, 1, 2, 1.0, 1e-6), 1e-6, 2, 3)],
    ids=describe,
)
def test_runtime_decision_follows_the_curve(m: SelectionMechanism) -> None:
    seed, source = fresh_source()
    middle = units_to_keep(m, 0.5)
    units = np.repeat(np.array([0, 1, 2, middle, 10**6]), 50_000)
    keep = select_partitions(m, units, source)
    assert not keep[units < 3].any(), f"seed={seed}: a partition below the pre-threshold was kept"
    assert keep[units == 10**6].all(), f"seed={seed}: a huge partition was dropped"
    claimed = float(keep_probability(m, np.array([middle]))[0])
    assert_binomial(int(keep[units == middle].sum()), 50_000, claimed, f"seed={seed}, {describe(m)}, n={middle}")


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_partitions_below_the_pre_threshold_are_never_kept(kind: str) -> None:
    # A threshold of 0 would keep every partition; the pre-threshold alone drops n < k.
    seed, source = fresh_source()
    noise = calibrate(kind, 0, 1, 1, 10.0, 1e-6)  # type: ignore[arg-type]
    m = NoisyThreshold(noise, 0.0, pre_threshold=50)
    units = np.repeat(np.array([0, 1, 49, 50, 51]), 20_000)
    keep = select_partitions(m, units, source)
    assert not keep[units < 50].any(), f"seed={seed}: a partition below the pre-threshold was kept"
    assert keep[units >= 50].all(), f"seed={seed}: a partition far above the threshold was dropped"


def test_select_partitions_handles_empty_input_and_rejects_negative_units() -> None:
    _, source = fresh_source()
    for m in [TruncatedGeometric(1.0, 1e-5, 1), laplace_threshold(1.0, 1e-5, 1), gaussian_threshold(1.0, 1e-5, 1)]:
        assert select_partitions(m, np.array([], dtype=np.int64), source).shape == (0,)
        with pytest.raises(ValueError):
            select_partitions(m, np.array([1, -1]), source)


def test_threshold_tails_leave_room_for_the_sampled_gaussian() -> None:
    """The sampled Gaussian's tail is at most e**(GAUSSIAN_SAMPLER_EPSILON/2) times the exact one."""
    assert selection._TAIL_SAFETY > 100 * math.expm1(GAUSSIAN_SAMPLER_EPSILON)


# --- weighted Gaussian threshold ------------------------------------------------------------


def test_unit_weights_are_floor_of_two_to_the_b_over_root_n_exactly() -> None:
    n = np.r_[np.arange(1, 20_001), [2**20 - 1, 2**20, 10**6, 3 * 10**6]]
    expected = [math.isqrt((1 << 40) // int(k)) for k in n]
    assert selection.unit_weights(n).tolist() == expected
    # A unit's weights have L2 norm at most one count: n · w(n)² ≤ 2^40.
    assert (n * selection.unit_weights(n).astype(object) ** 2 <= 1 << 40).all()


def test_the_weighted_threshold_covers_every_number_of_partitions() -> None:
    """τ = max over n ≤ L0 of k − 1 + w(n) + σ·z(δ/(2n)) + h, the maximum found by brute force."""
    m = selection.weighted_gaussian_threshold(0.5, 1e-5, 30, pre_threshold=3)
    sigma, step = m.noise.std, math.ldexp(1.0, m.noise.grid_exponent)
    assert m.noise.l0 == 1 and m.noise.kind == "gaussian"
    brute = max(2 + math.isqrt((1 << 40) // n) / 2**20 + sigma * -NormalDist().inv_cdf(5e-6 / n * (1 - 1e-9))
                for n in range(1, 31))
    assert m.threshold == pytest.approx(brute + step, rel=1e-12)
    # Tail targets met: n · P(N(0, σ) ≥ τ − (k − 1) − w(n) − h) ≤ δ/2 for every n.
    for n in range(1, 31):
        w = math.isqrt((1 << 40) // n) / 2**20
        assert n * NormalDist(0, sigma).cdf(-(m.threshold - 2 - w - step)) <= 5e-6
    # Noise so large that its grid is coarser than the weights' unit: refused, not rounded.
    with pytest.raises(ValueError, match="too small for weighted_gaussian_threshold"):
        selection.weighted_gaussian_threshold(1e-6, 4e-9, 30)
    # Far more partitions than computed one by one: the bound above them keeps τ safe.
    big = selection.weighted_gaussian_threshold(0.5, 1e-5, 10**6)
    z = -NormalDist().inv_cdf(5e-6 / 10**6)
    assert big.threshold >= big.noise.std * z + math.isqrt((1 << 40) // 10**6) / 2**20


def test_weighted_selection_needs_its_weights_and_keeps_by_them() -> None:
    m = selection.weighted_gaussian_threshold(1.0, 1e-6, 16)
    source = RandomSource.from_seed(3)
    with pytest.raises(AssertionError):
        selection.select_partitions(m, np.array([5]), source)
    one = int(selection.unit_weights(np.array([1]))[0])
    sure = math.ceil(m.threshold + 12 * m.noise.std)
    # The same 2 units: kept when their weights are far above τ, never when far below (12σ apart).
    kept = selection.select_partitions(m, np.array([2, 2]), source, np.array([sure * one, 0]))
    assert kept.tolist() == [True, False]
    # The plan's keep curve is the worst case, every unit in L0 = 16 partitions (a quarter each).
    n = selection.units_to_keep(m, 0.5)
    assert (n - 1) / 4 < m.threshold <= n / 4 + 1e-9

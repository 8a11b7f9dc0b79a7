"""Tests for `bounds: auto` in dprun.mechanisms.bound_choice: the value cells, the per-unit weights,
their noise and the choice of value bounds."""

from __future__ import annotations

import math

import dprun_testing
import numpy as np
import pytest
from scipy import stats

from dprun.mechanisms import bound_choice
from dprun.mechanisms.bound_choice import (
    SIZE_CANDIDATES,
    VALUE_CELLS,
    VALUE_LOWER,
    VALUE_UPPER,
    VALUE_WEIGHT_BITS,
    ZERO_CELL,
    BoundChoicePlan,
    ContributionProfile,
    ValueChoice,
    choose_value_bounds,
    empty_cell_floor,
    noisy_profile,
    unit_value_weights,
    value_cells,
)
from dprun.mechanisms.sampling import RandomSource

ONE = 2**VALUE_WEIGHT_BITS  # one unit's whole weight


def reference_cell(value: float) -> int:
    """The cell by its definition: the smallest k with |v| ≤ 2^k, found by walking the powers of two."""
    magnitude = abs(value)
    if magnitude <= 2.0 ** (bound_choice.VALUE_MIN_EXPONENT - 1):
        return ZERO_CELL
    k = bound_choice.VALUE_MIN_EXPONENT
    while k <= bound_choice.VALUE_MAX_EXPONENT and magnitude > 2.0**k:
        k += 1
    position = k - bound_choice.VALUE_MIN_EXPONENT + 1
    return ZERO_CELL + (position if value > 0 else -position)


def test_value_cells_are_exact_at_and_around_powers_of_two() -> None:
    powers = [2.0**k for k in range(-22, 43)]
    values = [0.0, -0.0, 1e-300, *powers, *(math.nextafter(p, math.inf) for p in powers),
              *(math.nextafter(p, 0.0) for p in powers), 3.0, 1e15, 7.5e-7]
    values += [-v for v in values]
    assert value_cells(np.array(values)).tolist() == [reference_cell(v) for v in values]
    rng = np.random.default_rng(3)
    random = rng.lognormal(0, 12, 20_000) * rng.choice([-1, 1], 20_000)
    cells = value_cells(random)
    assert cells.tolist() == [reference_cell(v) for v in random]
    # Every value lies within its cell's edges (below the zero bin's and above the top magnitude's aside).
    inside = (np.abs(random) > 2.0**-21) & (np.abs(random) <= 2.0**40)
    assert ((VALUE_LOWER[cells] <= random) & (random <= VALUE_UPPER[cells]))[inside].all()
    assert value_cells(np.array([1.0, 0.75, 2.0**40 + 2**20])).tolist() == [cell(0), cell(0), VALUE_CELLS - 1]


def test_each_unit_weighs_one_count_however_many_rows_it_has() -> None:
    """Unit A: 3 rows, 2 in one cell and 1 in another; unit B: 10,000 rows in one cell; labels use 64 bits."""
    unit = np.array([2**62 + 5] * 3 + [-(2**61)] * 10_000, dtype=np.int64)
    cell = np.array([70, 70, 90] + [70] * 10_000)
    weights = unit_value_weights(unit, cell)
    assert weights[70] == 2 * ONE // 3 + ONE and weights[90] == ONE // 3
    assert weights.sum() <= 2 * ONE and np.count_nonzero(weights) == 2
    rng = np.random.default_rng(4)
    units, cells = rng.integers(0, 300, 20_000), rng.integers(0, VALUE_CELLS, 20_000)
    expected = np.zeros(VALUE_CELLS, dtype=np.int64)
    for u in np.unique(units):
        mine = cells[units == u]
        for c in np.unique(mine):
            expected[c] += (int((mine == c).sum()) << VALUE_WEIGHT_BITS) // mine.size
    assert unit_value_weights(units, cells).tolist() == expected.tolist()
    # One unit more moves the histogram by at most one count (the sensitivity the noise is calibrated to).
    more = unit_value_weights(np.append(units, [999] * 7), np.append(cells, [1, 2, 3, 4, 5, 6, 7]))
    assert 0 < (more - expected).sum() <= ONE


def plan(*choices: tuple[str, str, str | None], epsilon: float = 1.0) -> BoundChoicePlan:
    return BoundChoicePlan(epsilon, 4, 4, 10, row_metrics=1, unit_metrics=0,
                           values=tuple(ValueChoice(*c) for c in choices))


def with_values(p: BoundChoicePlan, *histograms: np.ndarray) -> ContributionProfile:
    return ContributionProfile(np.zeros(p.shape, dtype=np.int64), np.zeros(len(SIZE_CANDIDATES) + 1, dtype=np.int64),
                               np.array(histograms, dtype=np.int64).reshape(len(histograms), VALUE_CELLS))


def units_at(**cells: int) -> np.ndarray:
    """A histogram with `units` whole units in each given cell (named c<index>)."""
    histogram = np.zeros(VALUE_CELLS, dtype=np.int64)
    for name, units in cells.items():
        histogram[int(name[1:])] = units * ONE
    return histogram


def linear_noise(factor: float) -> bound_choice.ValueNoise:
    """A sum's noise growing like its sensitivity, max(|lower|, |upper|) · factor."""
    return lambda metric, lower, upper: factor * np.maximum(np.abs(lower), np.abs(upper))


def cell(k: int, sign: int = 1) -> int:
    """The cell of the magnitudes (2^(k-1), 2^k] of that sign."""
    return ZERO_CELL + sign * (k - bound_choice.VALUE_MIN_EXPONENT + 1)


POSITIVE_16_32 = cell(5)
POSITIVE_256_512 = cell(9)


def test_the_sum_bound_weighs_clipped_magnitude_against_noise() -> None:
    """9,000 units at about 24 and 1,000 at about 384: the upper bound 512 keeps all, 32 clips
    1,000 · (384 − 32) of 9,000 · 24 + 1,000 · 384 of magnitude, at a sixteenth of the noise."""
    p = plan(("s", "v", "sum"))
    histogram = units_at(**{f"c{POSITIVE_16_32}": 9000, f"c{POSITIVE_256_512}": 1000})
    mass = 9000 * 24 + 1000 * 384
    typical_rows = 1000.0
    typical_value = typical_rows * mass / 10_000
    for factor in (0.1, 100.0):
        [chosen] = choose_value_bounds(with_values(p, histogram), p, typical_rows, linear_noise(factor))
        errors = {upper: (9000 * max(24 - upper, 0) + 1000 * max(384 - upper, 0)) / mass + factor * upper / typical_value
                  for upper in (2.0**k for k in range(-20, 41))}
        best = min(errors, key=lambda upper: (errors[upper], upper))
        assert (chosen.lower, chosen.upper) == (0.0, best)
        assert chosen.clipped_share == pytest.approx(errors[best] - factor * best / typical_value)
    assert best == 32.0  # much noise: the tail is clipped
    [little] = choose_value_bounds(with_values(p, histogram), p, typical_rows, linear_noise(0.1))
    assert (little.lower, little.upper, little.clipped_share) == (0.0, 512.0, 0.0)


def test_signed_values_get_a_negative_lower_bound_and_means_may_start_above_zero() -> None:
    p = plan(("s", "v", "sum"), ("m", "v", "centered_sum"))
    negative_4_8 = cell(3, -1)
    histogram = units_at(**{f"c{POSITIVE_16_32}": 5000, f"c{negative_4_8}": 5000})
    total, mean = choose_value_bounds(with_values(p, histogram), p, 1e6, linear_noise(1e-3))
    assert (total.lower, total.upper) == (-8.0, 32.0)
    # A mean's noise grows with the width (its centred sum): values all in (16, 32] need no zero.
    only_positive = units_at(**{f"c{POSITIVE_16_32}": 5000})
    _, mean = choose_value_bounds(with_values(p, only_positive), p, 1e6,
                                  lambda metric, lower, upper: 1e-3 * (upper - lower) / 2)
    assert (mean.lower, mean.upper) == (16.0, 32.0)


def test_quantile_bounds_cover_the_cells_that_stand_out_of_the_noise() -> None:
    p = plan(("q", "v", None), epsilon=0.5)
    floor = empty_cell_floor(p)
    histogram = units_at(**{f"c{POSITIVE_16_32}": 3000, f"c{POSITIVE_256_512}": 3000, f"c{cell(-18, -1)}": 3000})
    histogram[cell(30)] = int((floor - 1) * ONE)  # below the floor: taken as noise
    [chosen] = choose_value_bounds(with_values(p, histogram), p, 100.0, linear_noise(1.0))
    assert (chosen.lower, chosen.upper) == (-2.0**-18, 512.0)
    [empty] = choose_value_bounds(with_values(p, np.zeros(VALUE_CELLS, dtype=np.int64)), p, 100.0, linear_noise(1.0))
    assert (empty.lower, empty.upper) == (0.0, 1.0)


def test_value_cells_get_discrete_laplace_noise_for_one_more_unit_of_sensitivity_each() -> None:
    """Two value columns: every cell's scale is (3 + 2)/ε counts, so 2^16 times that in weights."""
    seed = dprun_testing.fresh_seed()
    p = plan(("a", "x", "sum"), ("b", "y", None), ("c", "x", "centered_sum"), epsilon=0.8)
    assert p.value_columns == ("x", "y") and p.scale == pytest.approx(5 / 0.8)
    exact = with_values(p, units_at(c70=10), units_at(c80=20))
    source = RandomSource.from_seed(seed)
    draws = [noisy_profile(exact, p, source) for _ in range(400)]
    value_noise = np.concatenate([(d.values - exact.values).ravel() for d in draws]) / (p.scale * ONE)
    cell_noise = np.concatenate([(d.cells - exact.cells).ravel() for d in draws]) / p.scale
    # The weights' noise is discrete Laplace on a grid 2^-16 · 6.25 apart: Laplace(1) to within far less
    # than the KS test sees. KS p < 1e-7 fails (samples of 100,000 and 36,000).
    assert stats.kstest(value_noise, stats.laplace.cdf).pvalue > 1e-7, f"seed {seed}"
    t = p.scale
    q = math.exp(-1 / t)
    variance = 2 * q / (1 - q) ** 2
    # The contribution cells' noise has the variance of discrete Laplace(t): 36,000 draws, 8σ of the estimate.
    assert abs(float(np.var(cell_noise * t)) / variance - 1) < 8 * math.sqrt(5 / cell_noise.size), f"seed {seed}"

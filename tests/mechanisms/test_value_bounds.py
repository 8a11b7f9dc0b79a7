"""Tests for `bounds: auto` in dprun.mechanisms.bound_choice: the value cells, the per-unit weights,
and the choice of value bounds by two DP quantiles."""

from __future__ import annotations

import math
from dataclasses import replace

import dprun_testing
import numpy as np
import pytest
from scipy import stats

from dprun.mechanisms import bound_choice
from dprun.mechanisms.bound_choice import (
    VALUE_CELLS,
    VALUE_LOWER,
    VALUE_UPPER,
    UNIT_WEIGHT_BITS,
    ZERO_CELL,
    BoundChoicePlan,
    ContributionProfile,
    ValueChoice,
    choose_value_bounds,
    unit_value_weights,
    value_cells,
)
from dprun.mechanisms.sampling import RandomSource
from dprun.mechanisms.score_choice import shortfall

ONE = 2**UNIT_WEIGHT_BITS  # one unit's whole weight


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
            expected[c] += (int((mine == c).sum()) << UNIT_WEIGHT_BITS) // mine.size
    assert unit_value_weights(units, cells).tolist() == expected.tolist()
    # Labels past what packs beside a cell in 63 bits are numbered densely first: the same histogram.
    assert unit_value_weights(units + 2**62, cells).tolist() == expected.tolist()
    # One unit more moves the histogram by at most one count (the sensitivity the noise is calibrated to).
    more = unit_value_weights(np.append(units, [999] * 7), np.append(cells, [1, 2, 3, 4, 5, 6, 7]))
    assert 0 < (more - expected).sum() <= ONE


def cell(k: int, sign: int = 1) -> int:
    """The cell of the magnitudes (2^(k-1), 2^k] of that sign."""
    return ZERO_CELL + sign * (k - bound_choice.VALUE_MIN_EXPONENT + 1)


def plan(*choices: tuple[str, str, str | None], epsilon: float = 1.0) -> BoundChoicePlan:
    return BoundChoicePlan(epsilon, 4, 4, 10, row_metrics=1, unit_metrics=0,
                           values=tuple(ValueChoice(*c) for c in choices))


def with_values(p: BoundChoicePlan, *histograms: np.ndarray) -> ContributionProfile:
    empty = np.zeros(1, dtype=np.int64)
    return ContributionProfile(np.zeros(p.shape, dtype=np.int64), empty, empty, empty, empty,
                               np.array(histograms, dtype=np.int64).reshape(len(histograms), VALUE_CELLS))


def units_at(**cells: int) -> np.ndarray:
    """A histogram with `units` whole units in each given cell (named c<index>)."""
    histogram = np.zeros(VALUE_CELLS, dtype=np.int64)
    for name, units in cells.items():
        histogram[int(name[1:])] = units * ONE
    return histogram


def lognormal_units(units: int, seed: int) -> np.ndarray:
    """`units` units of 5 rows each, values log-normal around 50 (one in 20 units negative)."""
    rng = np.random.default_rng(seed)
    values = rng.lognormal(np.log(50), 1.0, units * 5) * np.where(rng.random(units * 5) < 0.05, -1, 1)
    return unit_value_weights(np.repeat(np.arange(units), 5), value_cells(values))


def quantile_cell(histogram: np.ndarray, level: float) -> int:
    """The cell whose span of cumulative weight holds `level` of the whole (what the quantiles aim at)."""
    return int(np.searchsorted(np.cumsum(histogram), level * histogram.sum()))


def test_with_many_units_the_bounds_are_the_extreme_quantiles_they_resolve() -> None:
    """20,000 units at ε = 1 per auto step (0.25 per quantile): the levels are 2 · shortfall / Û, and
    each bound lands within one cell of the edge at its level (the rank error is a few units of 20,000).
    A sum's bounds hold 0; a mean's and a quantile's do not need to."""
    seed = dprun_testing.fresh_seed()
    histogram = lognormal_units(20_000, seed % 2**32)
    p = plan(("s", "v", "sum"), ("m", "v", "centered_sum"), ("q", "v", None))
    source = RandomSource.from_seed(seed)
    chosen = {c.metric: c for c in choose_value_bounds(with_values(p, histogram), p, 20_000.0, source)}
    tail = 2 * shortfall(p.quantile_epsilon, VALUE_CELLS) / 20_000
    assert chosen["m"].tail == pytest.approx(max(tail, bound_choice.VALUE_TAIL)) and chosen["m"].seen_enough
    low, high = quantile_cell(histogram, chosen["m"].tail), quantile_cell(histogram, 1 - chosen["m"].tail)
    for value in chosen.values():
        assert value.column_range[0] in VALUE_LOWER[low - 1:low + 2], f"seed {seed}: {value}"
        assert value.column_range[1] in VALUE_UPPER[high - 1:high + 2], f"seed {seed}: {value}"
    assert (chosen["m"].lower, chosen["m"].upper) == chosen["m"].column_range == chosen["q"].column_range
    assert chosen["s"].lower == min(chosen["m"].lower, 0.0) and chosen["s"].upper == max(chosen["m"].upper, 0.0)
    assert chosen["m"].lower < 0 < chosen["m"].upper  # one in 20 values is negative: beyond the tail level


def test_with_few_units_the_bounds_say_they_saw_too_little() -> None:
    """300 units at ε = 0.1: the quantiles' rank error is beyond a quarter of the units, so the levels
    stop at the quartiles and the choice says it saw too little, with the budget factor that would do."""
    seed = dprun_testing.fresh_seed()
    p = plan(("m", "v", "centered_sum"), epsilon=0.1)
    [chosen] = choose_value_bounds(with_values(p, lognormal_units(300, seed % 2**32)), p, 300.0,
                                   RandomSource.from_seed(seed))
    resolution = 2 * shortfall(p.quantile_epsilon, VALUE_CELLS) / 300
    assert chosen.tail == bound_choice.VALUE_TAIL_LIMIT and not chosen.seen_enough
    assert chosen.budget_factor == pytest.approx(resolution / bound_choice.VALUE_TAIL_LIMIT)


def test_a_point_mass_gets_the_edges_of_its_cell() -> None:
    """Every value in (16, 32]: both quantiles are its cell (every other cell scores a whole tail lower)."""
    seed = dprun_testing.fresh_seed()
    p = plan(("s", "v", "sum"), ("m", "v", "centered_sum"), epsilon=20.0)
    histogram = units_at(**{f"c{cell(5)}": 3000})
    chosen = {c.metric: c for c in choose_value_bounds(with_values(p, histogram), p, 3000.0, RandomSource.from_seed(seed))}
    assert (chosen["m"].lower, chosen["m"].upper) == (16.0, 32.0), f"seed {seed}"
    assert (chosen["s"].lower, chosen["s"].upper) == (0.0, 32.0), f"seed {seed}"


def test_the_quantile_score_moves_by_at_most_one_units_weight() -> None:
    """Adding any unit (weights summing to at most one unit's) moves every cell's score by at most ONE."""
    rng = np.random.default_rng(11)
    base = rng.integers(0, 50, VALUE_CELLS) * ONE
    for _ in range(200):
        extra = np.zeros(VALUE_CELLS, dtype=np.int64)
        cells = rng.choice(VALUE_CELLS, rng.integers(1, 6), replace=False)
        extra[cells] = rng.multinomial(ONE, np.ones(cells.size) / cells.size)
        for level in (0.001, 0.25, 0.5, 0.999):
            def scores(h: np.ndarray) -> np.ndarray:
                cumulative = np.cumsum(h)
                target = math.floor(level * int(cumulative[-1]))
                return -np.maximum(np.maximum(cumulative - h - target, target - cumulative), 0)
            assert np.abs(scores(base + extra) - scores(base)).max() <= ONE


def test_a_column_of_quantiles_alone_is_bounded_near_its_levels() -> None:
    """A median alone: its 37.5th and 62.5th percentiles (clamping beyond moves no rank); with a mean on
    the same column, the extreme levels the quantiles resolve."""
    seed = dprun_testing.fresh_seed()
    histogram = lognormal_units(20_000, seed % 2**32)
    median = BoundChoicePlan(1.0, 4, 4, 10, row_metrics=1, unit_metrics=0,
                             values=(ValueChoice("med", "v", None, (0.5,)),))
    [chosen] = choose_value_bounds(with_values(median, histogram), median, 20_000.0, RandomSource.from_seed(seed))
    assert chosen.levels == (0.375, 0.625)
    low, high = quantile_cell(histogram, 0.375), quantile_cell(histogram, 0.625)
    assert chosen.lower in VALUE_LOWER[low - 1:low + 2] and chosen.upper in VALUE_UPPER[high - 1:high + 2], f"seed {seed}"
    both = replace(median, values=(*median.values, ValueChoice("m", "v", "centered_sum")))
    chosen_both = choose_value_bounds(with_values(both, histogram), both, 20_000.0, RandomSource.from_seed(seed))
    assert {c.levels for c in chosen_both} == {(chosen_both[0].tail, 1 - chosen_both[0].tail)}

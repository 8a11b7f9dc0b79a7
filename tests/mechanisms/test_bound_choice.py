"""Tests for dprun.mechanisms.bound_choice: the contribution histogram, its noise, and the choice."""

from __future__ import annotations

import math
from dataclasses import replace

import dprun_testing
import numpy as np
import pytest
from scipy import stats

from dprun.mechanisms import bound_choice
from dprun.mechanisms.bound_choice import (
    SIZE_CANDIDATES,
    BoundChoicePlan,
    ContributionProfile,
    bin_index,
    choose_bounds,
    empty_cell_floor,
    histogram,
    noisy_profile,
    size_histogram,
)
from dprun.mechanisms.sampling import RandomSource


def plan(epsilon: float = 1.0, *, l0: int | None = None, rows: int | None = None, partitions: int | None = 10,
         units_only: bool = False) -> BoundChoicePlan:
    return BoundChoicePlan(epsilon, l0, rows, partitions, row_metrics=0 if units_only else 1,
                           unit_metrics=1 if units_only else 0)


def laplace_like(factor: float) -> bound_choice.RelativeNoise:
    """A count's noise std growing like Laplace's, L0 · L∞ · factor, relative to an average partition's rows."""
    return lambda l0, rows, per_partition, units: l0 * rows * factor / per_partition


def test_bins_are_powers_of_two_with_one_bin_above_the_largest_candidate() -> None:
    candidates = (1, 2, 4, 8)
    values = np.array([1, 2, 3, 4, 5, 8, 9, 1000])
    assert bin_index(values, candidates).tolist() == [0, 1, 2, 2, 3, 3, 4, 4]
    big = np.array([2**40, 2**40 + 1, 2**52 - 1])
    assert bin_index(big, tuple(2**i for i in range(60))).tolist() == [40, 41, 52]


def test_the_histogram_counts_each_unit_once_in_its_cell() -> None:
    p = plan()
    cells = histogram(np.array([1, 3, 3, 200]), np.array([1, 10, 16, 1]), p)
    assert cells.shape == (9, 10)
    assert cells.sum() == 4
    assert cells[0, 0] == 1 and cells[2, 4] == 2 and cells[8, 0] == 1
    weighted = histogram(np.array([3, 200]), np.array([10, 1]), p, np.array([5, 7]))
    assert weighted[2, 4] == 5 and weighted[8, 0] == 7 and weighted.sum() == 12


def exact_cells(p: BoundChoicePlan, units: int, partitions: int, rows: int) -> np.ndarray:
    return histogram(np.full(units, partitions), np.full(units, rows), p)


def profile(cells: np.ndarray, picks: list[int] | None = None) -> ContributionProfile:
    """Cells with partitions picked by `picks` units each (default: 10 partitions sharing the units)."""
    if picks is None:
        picks = [max(int(cells.sum()) // 10, 1)] * 10
    return ContributionProfile(cells, size_histogram(np.array(picks)))


def test_with_little_noise_the_choice_keeps_every_contribution() -> None:
    p = plan()
    cells = exact_cells(p, 3000, 3, 10)
    chosen = choose_bounds(profile(cells), p, laplace_like(1e-3))
    assert (chosen.l0, chosen.rows) == (4, 16)
    assert chosen.dropped_share == 0.0
    assert chosen.units == 3000 and chosen.partitions == 10


def test_with_much_noise_the_choice_takes_the_smallest_bounds() -> None:
    p = plan()
    cells = exact_cells(p, 3000, 3, 10)
    chosen = choose_bounds(profile(cells), p, laplace_like(1e4))
    assert (chosen.l0, chosen.rows) == (1, 1)
    # A unit stands for its bins' midpoints: 3 partitions for 3.5 (bin (2, 4]), 10 rows for 12.5 (bin (8, 16]).
    assert chosen.dropped_share == pytest.approx(1 - 1 / (3.5 * 12.5))


def test_the_choice_weighs_the_share_of_rows_dropped_against_the_noise_in_a_typical_partition() -> None:
    """Half the units have 1 row per pair, half 100: L∞ = 128 keeps all, at 128× the noise of 1.

    For a count alone, the score is the rows dropped over all rows plus the noise over a typical
    partition's rows: 10 public partitions, too few for their sizes to stand out of the noise, so
    their mean size, 2,000 pairs / 10."""
    p = plan(l0=1, partitions=10)
    cells = histogram(np.ones(2000, dtype=np.int64), np.repeat([1, 100], 1000), p)
    middle = bound_choice._midpoints(p.rows_candidates)[7]  # the bin (64, 128]
    total = 1000 * 1 + 1000 * middle
    typical_rows = 200 * total / 2000
    for factor, expected in ((1.0, 128), (1000.0, 1)):
        chosen = choose_bounds(profile(cells), p, laplace_like(factor))
        errors = {rows: 1000 * max(middle - rows, 0) / total + rows * factor / typical_rows
                  for rows in p.rows_candidates}
        assert chosen.rows == min(errors, key=lambda rows: (errors[rows], rows)) == expected
        assert chosen.l0 == 1


def test_a_unit_count_ignores_rows_and_a_fixed_bound_stays() -> None:
    p = plan(units_only=True)
    chosen = choose_bounds(profile(exact_cells(p, 3000, 5, 40)), p, lambda l0, rows, n, units: l0 * 1e-3 / units)
    assert (chosen.l0, chosen.rows) == (8, 1)
    fixed = plan(rows=16)
    chosen = choose_bounds(profile(exact_cells(fixed, 3000, 5, 40)), fixed, laplace_like(1e-3))
    assert (chosen.l0, chosen.rows) == (8, 16)


def test_the_noise_is_weighed_at_the_partitions_that_matter() -> None:
    """3,000 units in 3 partitions each: one size of partition, or many of 3 or 4 units; those below
    `min_units` (a private selection drops them) do not count."""
    p = plan(partitions=None)
    cells = exact_cells(p, 3000, 3, 10)
    big = choose_bounds(profile(cells, [300] * 100), p, laplace_like(10.0))
    tiny = choose_bounds(profile(cells, [1] * 9000), p, laplace_like(10.0))
    assert big.partitions == 100 and tiny.partitions == 9000
    assert big.typical_units == pytest.approx(bound_choice._midpoints(SIZE_CANDIDATES)[9] * 3.5)
    assert tiny.typical_units == pytest.approx(3.5)
    assert (big.l0, big.rows) == (4, 16) and (tiny.l0, tiny.rows) == (1, 1)
    selected = replace(p, min_units=1000.0)
    dropped = choose_bounds(profile(cells, [1] * 9000), selected, laplace_like(10.0))
    assert dropped.typical_units == 1000.0 and (dropped.l0, dropped.rows) == (4, 16)


def test_a_cell_below_the_noise_floor_counts_as_empty() -> None:
    """Noise alone must not make a unit with hundreds of rows per pair appear."""
    p = plan(epsilon=0.1)
    floor = empty_cell_floor(p)
    assert floor == pytest.approx(1 + 30 * math.log((90 + 28) / 1e-6))
    cells = exact_cells(p, 5000, 1, 1)
    cells[0, -1] = int(floor) - 1
    chosen = choose_bounds(profile(cells), p, laplace_like(1e-6))
    assert chosen.rows == 1
    cells[0, -1] = int(floor) + 1
    assert choose_bounds(profile(cells), p, laplace_like(1e-6)).rows == 256


def empty_profile(p: BoundChoicePlan) -> ContributionProfile:
    return ContributionProfile(np.zeros(p.shape, dtype=np.int64), np.zeros(len(SIZE_CANDIDATES) + 1, dtype=np.int64))


def test_the_floor_rarely_lets_noise_through() -> None:
    """P(any of the cells' noise reaches the floor) ≤ 10^-6 by the union bound. Measured on 2,000
    draws, against a floor set for 1 in 20 (the same bound at another rate) so that crossings are seen."""
    seed = dprun_testing.fresh_seed()
    p = plan(epsilon=0.5)
    empty = empty_profile(p)
    source = RandomSource.from_seed(seed)
    draws = 2000
    floor = 1.0 + p.scale * math.log(p.cells / 0.05)
    through = 0
    for _ in range(draws):
        noisy = noisy_profile(empty, p, source)
        through += bool((noisy.cells >= floor).any() or (noisy.sizes >= floor).any())
    # Binomial(2000, ≤ 0.05) exceeds 160 with probability below 1e-7.
    assert through <= 160, f"seed {seed}: {through} of {draws} draws crossed the floor"
    assert empty_cell_floor(p) == pytest.approx(1.0 + p.scale * math.log(p.cells / 1e-6))


def test_the_noise_is_discrete_laplace_of_scale_three_over_epsilon() -> None:
    seed = dprun_testing.fresh_seed()
    p = plan(epsilon=0.8)
    exact = ContributionProfile(np.arange(p.shape[0] * p.shape[1], dtype=np.int64).reshape(p.shape) * 7,
                                np.arange(len(SIZE_CANDIDATES) + 1, dtype=np.int64) * 5)
    source = RandomSource.from_seed(seed)
    draws = [noisy_profile(exact, p, source) for _ in range(2000)]
    cell_noise = np.concatenate([(noisy.cells - exact.cells).ravel() for noisy in draws])
    size_noise = np.concatenate([noisy.sizes - exact.sizes for noisy in draws])
    t = 3 / 0.8
    q = math.exp(-1 / t)
    values = np.arange(-80, 81)
    pmf = (1 - q) / (1 + q) * q ** np.abs(values)
    for sample in (cell_noise, size_noise):
        observed = np.array([(sample == v).sum() for v in values])
        expected = pmf * sample.size
        keep = expected >= 20
        # Pearson's chi-square on the bins with enough mass: p < 1e-7 fails.
        statistic = float((((observed - expected) ** 2) / expected)[keep].sum())
        assert stats.chi2.sf(statistic, keep.sum() - 1) > 1e-7, f"seed {seed}: chi2 {statistic:.1f}"


def test_the_profile_states_each_distribution_at_its_bins_upper_ends() -> None:
    """1,000 units with 1 partition of 1 row, 2,000 with 3 partitions of 10 rows; 100 partitions picked
    by 30 units each (they hold about 30 · 7,000 / 3,000 = 70 units)."""
    p = plan(partitions=None)
    cells = histogram(np.repeat([1, 3], [1000, 2000]), np.repeat([1, 10], [1000, 2000]), p)
    summary = bound_choice.profile_summary(profile(cells, [30] * 100), p)
    assert summary["units_estimate"] == 3000 and summary["partitions_estimate"] == 100
    assert summary["partitions_per_unit"] == {"p50": 4, "p90": 4, "p99": 4}
    # By pairs: 1,000 of 1 row, 7,000 (2,000 units × 3.5) of 10 rows.
    assert summary["rows_per_unit_and_partition"] == {"p50": 16, "p90": 16, "p99": 16}
    pairs_per_unit = (1000 + 2000 * 3.5) / 3000
    assert summary["units_per_partition"] == {level: round(32 * pairs_per_unit, 1) for level in ("p50", "p90", "p99")}
    empty = bound_choice.profile_summary(empty_profile(p), p)
    assert empty["partitions_estimate"] is None and empty["partitions_per_unit"]["p50"] is None
    above = bound_choice.profile_summary(profile(exact_cells(p, 3000, 500, 1)), p)
    assert above["partitions_per_unit"]["p50"] == "> 128"

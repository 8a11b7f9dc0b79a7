"""Tests for dprun.mechanisms.bound_choice: the kept shares, the shape histograms, and the choice."""

from __future__ import annotations

import math
from dataclasses import replace

import dprun_testing
import numpy as np
import pytest
from scipy import stats

from dprun.mechanisms import bound_choice
from dprun.mechanisms.bound_choice import (
    KEPT_CAPS,
    SIZE_CANDIDATES,
    UNIT_WEIGHT_BITS,
    BoundChoicePlan,
    ContributionProfile,
    bin_index,
    choose_bounds,
    histogram,
    noisy_shape,
    runs_kept_weights,
    size_histogram,
    unit_rows_histogram,
)
from dprun.mechanisms.sampling import RandomSource
from dprun.mechanisms.score_choice import shortfall

ONE = 1 << UNIT_WEIGHT_BITS


def plan(epsilon: float = 1.0, *, l0: int | None = None, rows: int | None = None, partitions: int | None = 10,
         units_only: bool = False, counted: bool = True) -> BoundChoicePlan:
    return BoundChoicePlan(epsilon, l0, rows, partitions, row_metrics=int(counted and not units_only),
                           unit_metrics=int(units_only), rows_matter=not units_only)


def laplace_like(factor: float) -> bound_choice.RelativeNoise:
    """A count's noise std growing like Laplace's, L0 · L∞ · factor, relative to a partition's rows."""
    return lambda l0, rows, per_partition, units, kept: l0 * rows * factor / per_partition


def test_bins_are_powers_of_two_with_one_bin_above_the_largest_candidate() -> None:
    candidates = (1, 2, 4, 8)
    values = np.array([1, 2, 3, 4, 5, 8, 9, 1000])
    assert bin_index(values, candidates).tolist() == [0, 1, 2, 2, 3, 3, 4, 4]
    big = np.array([2**40, 2**40 + 1, 2**52 - 1])
    assert bin_index(big, tuple(2**i for i in range(60))).tolist() == [40, 41, 52]


def test_the_histograms_count_each_unit_once() -> None:
    p = plan()
    cells = histogram(np.array([1, 3, 3, 200]), np.array([1, 10, 16, 1]), p)
    assert cells.shape == (9, 12) and cells.sum() == 4
    assert cells[0, 0] == 1 and cells[2, 4] == 2 and cells[8, 0] == 1
    weighted = histogram(np.array([3, 200]), np.array([10, 1]), p, np.array([5, 7]))
    assert weighted[2, 4] == 5 and weighted[8, 0] == 7 and weighted.sum() == 12
    rows = unit_rows_histogram(np.array([1, 3, 2**30]), np.array([2, 1, 4]))
    assert rows[0] == 2 and rows[2] == 1 and rows[-1] == 4 and rows.sum() == 7


def brute_kept(pairs: list[list[int]], p: BoundChoicePlan) -> tuple[np.ndarray, np.ndarray]:
    """The kept shares by their definition, unit by unit, in exact integers."""
    kept_rows = np.zeros((len(KEPT_CAPS), len(p.l0_options), len(p.rows_options)), dtype=np.int64)
    kept_pairs = np.zeros(len(p.l0_options), dtype=np.int64)
    for rows in pairs:
        n, total = len(rows), sum(rows)
        heaviest = sorted(rows, reverse=True)
        for i, l0 in enumerate(p.l0_options):
            kept_pairs[i] += (min(n, l0) * ONE) // n
            for j, linf in enumerate(p.rows_options):
                share = (sum(min(r, linf) for r in heaviest[:l0]) * ONE) // total
                for c, cap in enumerate(KEPT_CAPS):
                    kept_rows[c, i, j] += share * min(total, cap) // cap
    return kept_rows, kept_pairs


def test_the_kept_shares_are_the_units_shares_summed_in_exact_integers() -> None:
    """Per unit at most one unit's weight per candidate (the choice's sensitivity), equal to its definition
    (a unit keeps its L0 pairs with the most rows), growing with L0 and L∞, and whole where the bounds
    keep everything."""
    rng = np.random.default_rng(5)
    pairs = [list(rng.integers(1, 400, rng.integers(1, 200))) for _ in range(300)] + [[1], [10**9], [3] * 500]
    p = plan()
    starts = np.cumsum([0] + [len(rows) for rows in pairs[:-1]])
    lengths = np.array([len(rows) for rows in pairs])
    kept_rows, kept_pairs = runs_kept_weights(np.concatenate(pairs), starts, lengths, p)
    expected_rows, expected_pairs = brute_kept(pairs, p)
    assert kept_rows.tolist() == expected_rows.tolist() and kept_pairs.tolist() == expected_pairs.tolist()
    assert (np.diff(kept_rows, axis=1) >= 0).all() and (np.diff(kept_rows, axis=2) >= 0).all()
    assert (np.diff(kept_rows, axis=0) <= 0).all()  # a larger cap weighs light units less
    assert kept_rows.max() <= len(pairs) * ONE and kept_pairs.max() <= len(pairs) * ONE
    for rows in pairs:  # one unit alone: at most one unit's weight in every candidate
        one_rows, one_pairs = runs_kept_weights(np.array(rows), np.array([0]), np.array([len(rows)]), p)
        assert one_rows.max() <= ONE and one_pairs.max() <= ONE
    # Two pairs of 6 and 2 rows: L0 = 1 keeps the 6 (3/4 of the rows), L0 = 2 all 8 at L∞ = 8.
    whole, _ = runs_kept_weights(np.array([2, 6]), np.array([0]), np.array([2]), p)
    assert whole[0, 1, 3] == ONE and whole[0, 0, 3] == 3 * ONE // 4 and whole[0, 0, 2] == ONE // 2
    assert whole[KEPT_CAPS.index(16), 1, 3] == ONE // 2  # 8 rows of a cap of 16: half a unit's weight
    empty = runs_kept_weights(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), p)
    assert empty[0].sum() == 0 and empty[1].sum() == 0


def profile(p: BoundChoicePlan, pairs_per_unit: np.ndarray, rows_per_pair: np.ndarray,
            picks: list[int] | None = None) -> ContributionProfile:
    """The exact profile of units with `pairs_per_unit[u]` pairs of `rows_per_pair[u]` rows each; the
    partitions picked by `picks` units each (default: 10 partitions sharing the units)."""
    units = len(pairs_per_unit)
    if picks is None:
        picks = [max(units // 10, 1)] * 10
    rows = np.repeat(rows_per_pair, pairs_per_unit)
    starts = np.concatenate([[0], np.cumsum(pairs_per_unit)[:-1]])
    kept_rows, kept_pairs = runs_kept_weights(rows, starts, np.asarray(pairs_per_unit), p)
    return ContributionProfile(histogram(pairs_per_unit, rows_per_pair, p),
                               unit_rows_histogram(pairs_per_unit * rows_per_pair),
                               size_histogram(np.array(picks)), kept_rows, kept_pairs)


def assert_chosen(p: BoundChoicePlan, exact: ContributionProfile, noise: bound_choice.RelativeNoise, draws: int,
                  expected: tuple[int, int]) -> None:
    """Every one of `draws` choices (fresh noise each) is `expected`."""
    seed = dprun_testing.fresh_seed()
    source = RandomSource.from_seed(seed)
    found = set()
    for _ in range(draws):
        chosen = choose_bounds(exact, noisy_shape(exact, p, source), p, noise, source)
        found.add((chosen.l0, chosen.rows))
    assert found == {expected}, f"seed {seed}: chose {sorted(found)}"


def test_with_little_noise_the_choice_keeps_every_contribution() -> None:
    """3,000 units, 3 pairs of 10 rows each: (4, 16) keeps everything with the least noise; the next best,
    (8, 16) or (4, 32), scores 20 units lower, which permute-and-flip at ε = 6.7 passes over but with
    probability below e^-60 per draw."""
    p = plan(epsilon=10.0)
    exact = profile(p, np.full(3000, 3), np.full(3000, 10))
    assert_chosen(p, exact, laplace_like(1.0), 20, (4, 16))
    noisy = noisy_shape(exact, p, RandomSource.from_seed(1))
    chosen = choose_bounds(exact, noisy, p, laplace_like(1.0), RandomSource.from_seed(1))
    assert chosen.dropped_share == 0.0 and chosen.partitions == 10 and abs(chosen.units - 3000) < 30
    # The choice sees so well that it weighs rows up to the largest cap: 30 rows (the bin (16, 32], taken at
    # its middle 24.5) of 256, about 290 units' worth.
    cap, weight = bound_choice._row_cap(noisy, chosen.units, shortfall(p.contribution_epsilon, 88, monotone=True))
    assert cap == 256 and weight == pytest.approx(3000 * 24.5 / 256, rel=0.05)
    low = 1 - bound_choice.UNITS_LOWER_STDS * bound_choice.units_std(noisy) / bound_choice.units_estimate(noisy)
    assert chosen.seen_enough
    assert chosen.shortfall == pytest.approx(shortfall(p.contribution_epsilon, 88, monotone=True) / (weight * low))


def test_with_much_noise_the_choice_takes_the_smallest_bounds() -> None:
    p = plan(epsilon=10.0)
    exact = profile(p, np.full(3000, 3), np.full(3000, 10))
    assert_chosen(p, exact, laplace_like(1e4), 20, (1, 1))


def test_the_choice_weighs_each_units_kept_share_against_the_noise() -> None:
    """Half the units have one pair of 1 row, half one of 100: L∞ = 128 keeps every unit whole, L∞ = 64
    keeps the heavy half's 64%. Each unit weighs the same: with little noise 128 wins, with much 1."""
    p = plan(epsilon=20.0, l0=1)
    exact = profile(p, np.ones(2000, dtype=np.int64), np.repeat([1, 100], 1000))
    assert_chosen(p, exact, laplace_like(0.5), 10, (1, 128))
    assert_chosen(p, exact, laplace_like(1000.0), 10, (1, 1))


def test_a_unit_count_ignores_rows_and_a_fixed_bound_stays() -> None:
    units_only = plan(epsilon=10.0, units_only=True)
    exact = profile(units_only, np.full(3000, 5), np.full(3000, 40))
    assert_chosen(units_only, exact, lambda l0, rows, n, units, kept: l0 / units, 10, (8, 1))
    fixed = plan(epsilon=10.0, rows=16)
    assert_chosen(fixed, profile(fixed, np.full(3000, 5), np.full(3000, 40)), laplace_like(1.0), 10, (8, 16))


def test_means_and_quantiles_alone_choose_by_the_noise_and_score_no_data() -> None:
    """No metric loses what the bounds drop: no ε for the choice, which is the least noise at what the
    typical partition keeps (from the shape histograms), whatever the permute-and-flip draw would be."""
    p = plan(epsilon=1000.0, counted=False)  # the shape histograms all but exact
    assert not p.scores_data and p.contribution_epsilon == 0.0 and p.histogram_epsilon == pytest.approx(1000.0)
    exact = profile(p, np.full(3000, 3), np.full(3000, 10))
    # The relative noise of a mean: the sum's noise over the rows kept, which L∞ below 10 shrinks.
    noise = lambda l0, rows, partition_rows, units, kept: l0 * rows / (partition_rows * kept)  # noqa: E731
    assert_chosen(p, exact, noise, 5, (1, 1))
    # Where the noise does not grow with the bounds, the smallest that keep every row.
    flat = lambda l0, rows, partition_rows, units, kept: 1 / (partition_rows * kept)  # noqa: E731
    assert_chosen(p, exact, flat, 5, (4, 16))


def test_the_default_share_is_five_percent_per_part_of_the_step_and_at_most_a_quarter() -> None:
    values = tuple(bound_choice.ValueChoice(f"m{i}", f"c{i}", "sum") for i in range(4))
    assert plan(counted=False).default_share == pytest.approx(0.05)
    assert plan().default_share == pytest.approx(0.15)
    assert replace(plan(), values=values[:1]).default_share == pytest.approx(0.2)
    assert replace(plan(), values=values).default_share == bound_choice.DEFAULT_SHARE_LIMIT == 0.25


def test_a_mean_takes_the_most_rows_among_the_bounds_near_the_least_noise() -> None:
    """A mean's sampling error falls with the rows kept, which its noise does not say: among the bounds
    whose noise is within NOISE_SLACK of the least, the one that keeps the most rows. 2 pairs of 2 rows:
    the noise over the rows kept is the same at (1, 1), (1, 2), (2, 1) and (2, 2), which keeps them all;
    larger bounds keep no more with twice the noise."""
    p = replace(plan(epsilon=1000.0, counted=False), samples_rows=True)
    exact = profile(p, np.full(3000, 2), np.full(3000, 2))
    noise = lambda l0, rows, partition_rows, units, kept: l0 * rows / (partition_rows * kept)  # noqa: E731
    assert_chosen(p, exact, noise, 5, (2, 2))
    assert_chosen(replace(p, samples_rows=False), exact, noise, 5, (1, 1))


def test_the_rows_kept_follow_the_pairs_with_the_most_rows() -> None:
    """The cross-partition bounding keeps a unit's pairs with the most rows: with one pair of 100 rows and
    three of 1, L0 = 1 keeps the largest of four pairs, which the estimate (the pairs drawn independently
    from the picked pairs' rows) finds heavy in 1 − (3/4)^4 = 68% of units: it drops about 30% of the
    rows, not the three quarters a pair taken at random would."""
    p = plan(epsilon=1000.0)
    units = 4000
    pairs = np.full(units, 4)
    rows = np.tile([100, 1, 1, 1], units)
    kept_rows, kept_pairs = runs_kept_weights(rows, np.arange(units) * 4, pairs, p)
    picked = np.where(np.arange(units) % 4 == 0, 100, 1)  # a pair picked uniformly from each unit's four
    exact = ContributionProfile(histogram(pairs, picked, p), unit_rows_histogram(np.full(units, 103)),
                                size_histogram(np.full(10, units // 10)), kept_rows, kept_pairs)
    noisy = noisy_shape(exact, p, RandomSource.from_seed(4))
    # The bins' middles: 4 pairs in (2, 4], read as 3.5 (half 3, half 4); 100 rows in (64, 128], 96.5.
    largest = [(1 - 0.75**n) * 96.5 + 0.75**n for n in (3, 4)]
    expected = 1 - (sum(largest) / 2) / (3.5 * (0.25 * 96.5 + 0.75))
    assert bound_choice._dropped(noisy, p, 1, 1024).rows == pytest.approx(expected, abs=0.01)
    assert bound_choice._dropped(noisy, p, 4, 1024).rows == 0.0
    assert bound_choice._dropped(noisy, p, 1, 1).rows > 0.9


def test_the_noise_is_weighed_at_the_partitions_that_matter() -> None:
    """3,000 units in 3 partitions each: one size of partition, or many of 3 or 4 units; those below
    `min_units` (a private selection drops them) do not count."""
    p = plan(epsilon=10.0, partitions=None)
    pairs, rows = np.full(3000, 3), np.full(3000, 10)
    big = choose_bounds(exact := profile(p, pairs, rows, [300] * 100), noisy_shape(exact, p, RandomSource.from_seed(2)),
                        p, laplace_like(10.0), RandomSource.from_seed(2))
    assert abs(big.partitions - 100) <= 5  # the size cells that stand out of the noise
    assert big.typical_units == pytest.approx(bound_choice._midpoints(SIZE_CANDIDATES)[9] * 3.0, rel=0.1)
    tiny = profile(p, pairs, rows, [1] * 9000)
    assert_chosen(p, profile(p, pairs, rows, [300] * 100), laplace_like(10.0), 5, (4, 16))
    assert_chosen(p, tiny, laplace_like(10.0), 5, (1, 1))
    selected = replace(p, min_units=1000.0)
    assert_chosen(selected, tiny, laplace_like(10.0), 5, (4, 16))


def test_the_choice_is_at_most_its_shortfall_below_the_best_in_95_percent_of_draws() -> None:
    """400 units, one pair each, of 1 to 256 rows; L0 fixed. Over 400 draws, the chosen candidate's
    score falls more than `shortfall` below the best in at most 5% of them: Binomial(400, 0.05) > 45 has
    probability below 1e-7."""
    seed = dprun_testing.fresh_seed()
    rng = np.random.default_rng(seed % 2**32)
    p = plan(epsilon=0.3, l0=1)
    exact = profile(p, np.ones(400, dtype=np.int64), rng.integers(1, 257, 400))
    noise = laplace_like(0.001)
    source = RandomSource.from_seed(seed)
    noisy = noisy_shape(exact, p, source)
    shape = bound_choice._shape(noisy, p)
    cap, weight = bound_choice._row_cap(noisy, shape.units, shortfall(p.contribution_epsilon, len(p.rows_options), monotone=True))
    scores = {}
    for j, rows in enumerate(p.rows_options):
        lost = bound_choice._dropped(noisy, p, 1, rows)
        scores[rows] = exact.kept_rows[KEPT_CAPS.index(cap), 0, j] / ONE - weight * noise(
            1, rows, shape.typical_rows, shape.typical_units, 1 - lost.rows)
    below = 0
    for _ in range(400):
        chosen = choose_bounds(exact, noisy, p, noise, source)
        below += max(scores.values()) - scores[chosen.rows] > shortfall(p.contribution_epsilon, len(p.rows_options), monotone=True)
    assert below <= 45, f"seed {seed}: {below} of 400 draws beyond the shortfall"


def test_few_units_say_the_choice_saw_too_little_with_the_share_that_would_do() -> None:
    """The shortfall is stated at the units' lower bound, two standard deviations below the estimate, so
    that an upward draw of the estimate cannot hide it."""
    p = replace(plan(epsilon=0.3), share=0.1)
    exact = profile(p, np.full(500, 3), np.full(500, 10))
    noisy = noisy_shape(exact, p, RandomSource.from_seed(3))
    chosen = choose_bounds(exact, noisy, p, laplace_like(1.0), RandomSource.from_seed(3))
    assert not chosen.seen_enough
    units = bound_choice.units_estimate(noisy)
    low = units - 2 * bound_choice.units_std(noisy)
    assert 200 < low < units - 150
    assert chosen.shortfall == pytest.approx(shortfall(p.contribution_epsilon, 88, monotone=True) / low)
    assert chosen.budget_factor == pytest.approx(chosen.shortfall / bound_choice.ADVISED_SHORTFALL)


def test_the_shape_noise_is_discrete_laplace_of_scale_three_or_five_over_epsilon() -> None:
    """Public partitions: three histograms, sensitivity 3; private: with the size histogram, 5."""
    seed = dprun_testing.fresh_seed()
    source = RandomSource.from_seed(seed)
    for p, sensitivity in ((plan(epsilon=2.4), 3), (plan(epsilon=4.0, partitions=None), 5)):
        exact = profile(p, np.arange(1, 301) % 7 + 1, np.arange(1, 301) % 50 + 1)
        draws = [noisy_shape(exact, p, source) for _ in range(600)]
        noise = np.concatenate([np.concatenate([d.partitions - exact.cells.sum(axis=1), d.rows - exact.cells.sum(axis=0),
                                                d.unit_rows - exact.unit_rows,
                                                np.zeros(0) if d.sizes is None else d.sizes - exact.sizes])
                                for d in draws])
        assert (draws[0].sizes is None) == (p.partitions is not None)
        t = sensitivity / p.histogram_epsilon
        assert p.scale == pytest.approx(t)
        q = math.exp(-1 / t)
        values = np.arange(-60, 61)
        pmf = (1 - q) / (1 + q) * q ** np.abs(values)
        observed = np.array([(noise == v).sum() for v in values])
        expected = pmf * noise.size
        keep = expected >= 20
        statistic = float((((observed - expected) ** 2) / expected)[keep].sum())
        assert stats.chi2.sf(statistic, keep.sum() - 1) > 1e-7, f"seed {seed}: chi2 {statistic:.1f} at t = {t}"


def test_a_lone_noisy_cell_far_above_the_data_does_not_move_the_typical_partition() -> None:
    """A phantom of 60 units at 2^20 rows per unit (6.7 noise scales: a draw of probability 10^-3) is read
    away: the unit rows' typical value stays that of the data's bins. A cell that stands above what the
    noise of all the cells reaches in 1,000 draws is data, and counts."""
    p = plan()
    exact = profile(p, np.full(1500, 6), np.full(1500, 25))
    noisy = noisy_shape(exact, p, RandomSource.from_seed(4))
    clean = bound_choice._shape(noisy, p)
    noisy.unit_rows[21] += 60
    moved = bound_choice._shape(noisy, p)
    assert moved.rows_per_pair == pytest.approx(clean.rows_per_pair)
    noisy.unit_rows[21] += 600
    assert bound_choice._shape(noisy, p).rows_per_pair > 2 * clean.rows_per_pair
    assert 100 <= clean.rows_per_pair * clean.per_unit <= 300  # 150 rows per unit, in the bin (128, 256]


def test_the_profile_states_percentiles_with_their_band_or_says_it_cannot_tell() -> None:
    """3,000 units: 1,000 with 1 pair of 1 row, 2,000 with 3 pairs of 10 rows. At ε = 100 every percentile
    is told, at its bin's upper end; at ε = 0.05 the 99th's band is wider than ±0.5 points. (At ε = 100 a
    size cell's noise reaches 3, or a phantom the floor, with probability below 10^-7.)"""
    pairs, rows = np.repeat([1, 3], [1000, 2000]), np.repeat([1, 10], [1000, 2000])
    sharp = plan(epsilon=100.0, partitions=None)
    exact = profile(sharp, pairs, rows, [30] * 100)
    source = RandomSource.from_seed(dprun_testing.fresh_seed())
    noisy = noisy_shape(exact, sharp, source)
    chosen = choose_bounds(exact, noisy, sharp, laplace_like(0.01), source)
    summary = bound_choice.profile_summary(noisy, chosen, sharp, 100.0)
    assert abs(int(summary["partitions_estimate"]) - 100) <= 3 and abs(int(summary["units_estimate"]) - 3000) < 10  # type: ignore[call-overload]
    told = summary["partitions_per_unit"]
    assert {level: told[level]["at_most"] for level in ("p50", "p90", "p99")} == {"p50": 4, "p90": 4, "p99": 4}  # type: ignore[index]
    assert summary["rows_per_unit"]["p50"]["at_most"] == 32  # type: ignore[index]
    assert all(0 < told[level]["band"] < 0.5 for level in told)  # type: ignore[index, operator]
    blurred = plan(epsilon=0.05, partitions=None)
    noisy = noisy_shape(exact, blurred, source)
    summary = bound_choice.profile_summary(noisy, choose_bounds(exact, noisy, blurred, laplace_like(0.01), source),
                                           blurred, 0.05)
    p99 = summary["rows_per_unit_and_partition"]["p99"]  # type: ignore[index]
    assert p99["cannot_tell"] and p99["epsilon_needed"] > 0.05


def test_a_profile_of_few_heavy_units_states_no_percentile_beyond_its_band() -> None:
    """4,000 units with log-normal rows (median 54, at most 575) over 1 to 4 partitions: at ε = 0.1 and
    1, every percentile the profile states is right within its band (about 95%: at most 10% of them
    miss, where Binomial(n, 0.06) exceeds 10% with probability below 1e-6 for these n), and those it
    cannot tell include the 99th percentiles at ε = 0.1."""
    seed = dprun_testing.fresh_seed()
    rng = np.random.default_rng(seed % 2**32)
    partitions = rng.integers(1, 5, 4000)
    rows = np.clip(np.round(rng.lognormal(np.log(54), 1.0, 4000)), 1, 575).astype(np.int64)
    per_pair = np.maximum(rows // partitions, 1)
    truth = {"partitions_per_unit": partitions, "rows_per_unit": per_pair * partitions,
             "rows_per_unit_and_partition": per_pair}
    source = RandomSource.from_seed(seed)
    for epsilon in (0.1, 1.0):
        p = plan(epsilon=epsilon)
        exact = profile(p, partitions, per_pair)
        stated = missed = 0
        untold = set()
        for _ in range(60):
            noisy = noisy_shape(exact, p, source)
            summary = bound_choice.profile_summary(noisy, choose_bounds(exact, noisy, p, laplace_like(1.0), source),
                                                   p, epsilon)
            for name, values in truth.items():
                for level_name, found in summary[name].items():  # type: ignore[attr-defined]
                    if found.get("cannot_tell"):
                        untold.add((name, level_name))
                        continue
                    level, band = int(level_name[1:]) / 100, found["band"] / 100
                    edge = float(found["at_most"])
                    stated += 1
                    missed += not (np.mean(values <= edge) >= level - band and np.mean(values <= edge / 2) <= level + band)
        assert stated > 100 and missed <= 0.1 * stated, f"seed {seed}, ε = {epsilon}: {missed} of {stated} missed"
        if epsilon == 0.1:
            assert {(name, "p99") for name in truth} <= untold, f"seed {seed}: {untold}"


def test_l0_candidates_stop_at_the_first_that_covers_every_known_partition() -> None:
    assert bound_choice.useful_l0(None) == bound_choice.L0_CANDIDATES
    assert bound_choice.useful_l0(1) == (1,)
    assert bound_choice.useful_l0(8) == (1, 2, 4, 8)
    assert bound_choice.useful_l0(10) == (1, 2, 4, 8, 16)
    assert bound_choice.useful_l0(1000) == bound_choice.L0_CANDIDATES

"""Tests for dprun.mechanisms.quantile_candidates: slots, exact scores, the permute-and-flip law, an audit.

Statistical tests use the `seeded` fixture (fresh seed, printed and in every message). Each χ²
test rejects at a p-value of 1e-8 and the audit's estimates hold with probability 1 − 1e-9
each, so a correct implementation fails this file by chance far below once in a million runs.
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import permutations

import numpy as np
import polars as pl
import pytest
from scipy import stats

from conftest import Seeded
from dprun.mechanisms.quantile_candidates import (
    EPSILON_BITS,
    CandidateGrid,
    answer_candidates,
    isotonic,
    permute_and_flip,
    plan_candidates,
    rank_error_scale,
    round_grid_count,
)
from dprun.mechanisms.quantile_tree import WEIGHT_BITS
from dprun.mechanisms.sampling import RandomSource

UNIT = 1 << WEIGHT_BITS
P_REJECT = 1e-8
GAMMA_DENOMINATOR = 1 << 43


def exact_permute_and_flip(gammas: list[Fraction]) -> np.ndarray:
    """P(candidate j is chosen), by enumerating every visiting order (small inputs only)."""
    p = [math.exp(-float(g)) for g in gammas]
    out = np.zeros(len(p))
    orders = list(permutations(range(len(p))))
    for order in orders:
        survive = 1.0 / len(orders)
        for j in order:
            out[j] += survive * p[j]
            survive *= 1 - p[j]
    return out


def chi_square_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * counts.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "a candidate of probability 0 was chosen"
    return float(stats.chisquare(counts[keep], expected[keep]).pvalue)


def test_slots_mark_candidates_and_gaps_and_clamp() -> None:
    grid = CandidateGrid(-2.0, 2.0, 5)
    frame = pl.DataFrame({"x": [-2.0, -1.5, -1.0, 0.0, 0.25, 2.0, 9.0, -9.0, None, float("nan")]})
    slots = frame.select(grid.slot_expr("x"))["x"].to_list()
    assert slots == [0, 1, 2, 4, 5, 8, 8, 0, None, None]
    assert grid.values().tolist() == [-2.0, -1.0, 0.0, 1.0, 2.0]


def test_integer_grid_puts_every_whole_value_on_a_candidate() -> None:
    grid = CandidateGrid(-60.0, 240.0, 301)
    values = pl.DataFrame({"x": np.arange(-60, 241, dtype=np.int64)})
    slots = values.select(grid.slot_expr("x"))["x"].to_numpy()
    np.testing.assert_array_equal(slots, 2 * np.arange(301))


@pytest.mark.parametrize(("bounds", "count", "first"), [
    ((0.0, 60.0), 601, [0.0, 0.1, 0.2, 0.3]), ((-3.7, 9.1), 641, [-3.7, -3.68, -3.66, -3.64]),
    ((0.0, 1e6), 1001, [0.0, 1000.0, 2000.0, 3000.0]), ((0.0, 1 / 3), None, None)])
def test_default_grids_sit_on_round_steps_and_print_as_decimals(bounds: tuple[float, float], count: int | None,
                                                                first: list[float] | None) -> None:
    assert round_grid_count(*bounds, 1024) == count
    if count is not None:
        values = CandidateGrid(*bounds, count).values()
        assert values[:4].tolist() == first and values[-1] == bounds[1]
        assert [repr(float(v)) for v in values[:4]] == [repr(v) for v in first]


@pytest.mark.parametrize("kwargs", [{"lower": 1.0, "upper": 1.0, "count": 3}, {"lower": 0.0, "upper": 1.0, "count": 1},
                                    {"lower": 0.0, "upper": math.inf, "count": 3}])
def test_bad_grids_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CandidateGrid(**kwargs)  # type: ignore[arg-type]


def test_the_plan_spends_at_most_its_share_on_a_dyadic_grid() -> None:
    plan = plan_candidates(0.25, 3, [0.1, 0.5, 0.9])
    assert plan.epsilon <= 0.25 and 0.25 - plan.epsilon < 9 * 2.0**-EPSILON_BITS
    assert plan.epsilon_each == tuple(steps / 2**EPSILON_BITS for steps in plan.epsilon_steps)
    # Split evenly: each level gets a ninth, rounded down to the 2**-30 grid.
    assert plan.epsilon_each == (math.floor(0.25 / 9 * 2**EPSILON_BITS) / 2**EPSILON_BITS,) * 3
    with pytest.raises(ValueError, match="too small"):
        plan_candidates(1e-12, 1, [0.5])


@pytest.mark.parametrize("gammas", [
    [Fraction(0), Fraction(1, 4), Fraction(2), Fraction(5, 2), Fraction(7)],
    [Fraction(0), Fraction(0), Fraction(1, 16), Fraction(1, 16)],
    [Fraction(0), Fraction(40), Fraction(3, 4), Fraction(1), Fraction(9, 8), Fraction(3, 2)],
])
def test_permute_and_flip_follows_its_exact_law(gammas: list[Fraction], seeded: Seeded) -> None:
    rows = 200_000
    scaled = [g * GAMMA_DENOMINATOR for g in gammas]
    assert all(s.denominator == 1 for s in scaled)
    whole = np.array([int(s) // GAMMA_DENOMINATOR for s in scaled], dtype=np.int64)
    fraction = np.array([int(s) % GAMMA_DENOMINATOR for s in scaled], dtype=np.int64)
    chosen = permute_and_flip(np.tile(whole, (rows, 1)), np.tile(fraction, (rows, 1)), seeded.source)
    counts = np.bincount(chosen, minlength=len(gammas))
    p = chi_square_p(counts, exact_permute_and_flip(gammas))
    assert p > P_REJECT, seeded.why(f"chosen counts {counts.tolist()} do not follow permute-and-flip (p = {p:.2e})")


def test_permute_and_flip_needs_a_best_candidate() -> None:
    with pytest.raises(ValueError, match="γ = 0"):
        permute_and_flip(np.ones((1, 3), dtype=np.int64), np.zeros((1, 3), dtype=np.int64), RandomSource.from_seed(0))


def weights_of(values: list[float], weights: list[int], grid: CandidateGrid, copies: int = 1) -> pl.DataFrame:
    """Slot weights of `copies` partitions that all hold these values."""
    frame = pl.DataFrame({"x": values, "weight": weights}).select(grid.slot_expr("x").alias("leaf"),
                                                                  pl.col("weight").cast(pl.Int64))
    return pl.DataFrame({
        "partition": np.repeat(np.arange(copies, dtype=np.int64), frame.height),
        "leaf": np.tile(frame["leaf"].to_numpy(), copies),
        "weight": np.tile(frame["weight"].to_numpy(), copies),
    })


def exact_answer_law(values: list[float], weights: list[int], grid: CandidateGrid, level: float, max_rows: int,
                     epsilon_steps: int) -> np.ndarray:
    """The law of one answer from the module's docstring, in exact rationals."""
    a, b = Fraction(level).as_integer_ratio()
    step = max(a, b - a) * max_rows * UNIT // 4096
    scores = []
    for c in grid.values():
        below = sum(w for v, w in zip(values, weights) if v < c)
        above = sum(w for v, w in zip(values, weights) if v > c)
        scores.append(abs((b - a) * below - a * above) // step)
    best = min(scores)
    return exact_permute_and_flip([Fraction(epsilon_steps * (s - best), GAMMA_DENOMINATOR) for s in scores])


@pytest.mark.parametrize("level", [0.5, 0.1, 0.9])
def test_answers_follow_the_exact_law_of_their_scores(level: float, seeded: Seeded) -> None:
    grid = CandidateGrid(0.0, 4.0, 5)
    values, weights = [0.5, 1.0, 1.0, 2.5, 3.0, 3.7], [UNIT, UNIT, UNIT // 2, UNIT, 2 * UNIT, UNIT // 3]
    plan = plan_candidates(0.8, 1, [level])
    copies = 40_000  # one call answers many identical partitions: independent draws of one law
    table = weights_of(values, weights, grid, copies)
    answers = answer_candidates(table, copies, grid, [level], 1, plan, seeded.source)[:, 0]
    counts = np.array([(answers == c).sum() for c in grid.values()])
    law = exact_answer_law(values, weights, grid, level, 1, plan.epsilon_steps[0])
    p = chi_square_p(counts, law)
    assert p > P_REJECT, seeded.why(f"answers {counts.tolist()} do not follow {law.round(4).tolist()} (p = {p:.2e})")


def test_an_empty_partition_gets_a_uniform_candidate(seeded: Seeded) -> None:
    grid = CandidateGrid(0.0, 1.0, 6)
    empty = pl.DataFrame(schema={"partition": pl.Int64, "leaf": pl.Int64, "weight": pl.Int64})
    answers = answer_candidates(empty, 60_000, grid, [0.5], 1, plan_candidates(1.0, 1, [0.5]), seeded.source)[:, 0]
    counts = np.array([(answers == c).sum() for c in grid.values()])
    p = chi_square_p(counts, np.full(6, 1 / 6))
    assert p > P_REJECT, seeded.why(f"empty partitions chose {counts.tolist()} (p = {p:.2e})")


def test_a_large_partition_is_answered_exactly_on_its_grid(seeded: Seeded) -> None:
    grid = CandidateGrid(-60.0, 240.0, 301)
    values = np.round(seeded.rng.lognormal(2.5, 1.1, 200_000) - 15)
    table = weights_of(np.clip(values, -60, 240).tolist(), [UNIT] * values.size, grid)
    answers = answer_candidates(table, 1, grid, [0.1, 0.5, 0.9], 1, plan_candidates(1.0, 1, [0.1, 0.5, 0.9]), seeded.source)[0]
    truth = np.quantile(np.clip(values, -60, 240), [0.1, 0.5, 0.9], method="lower")
    assert np.all(np.abs(answers - truth) <= 1), seeded.why(f"answers {answers} far from {truth}")


def test_levels_come_back_in_order_and_ordered_on_the_grid(seeded: Seeded) -> None:
    grid = CandidateGrid(0.0, 10.0, 11)
    table = weights_of([float(v) for v in range(11)], [UNIT] * 11, grid)
    answers = answer_candidates(table, 1, grid, [0.9, 0.1], 1, plan_candidates(0.01, 1, [0.1, 0.9]), seeded.source)
    # Whatever the noise, the 0.9 answer (first column) is at least the 0.1 answer, and both are candidates.
    assert answers[0, 0] >= answers[0, 1]
    assert set(answers[0].tolist()) <= set(grid.values().tolist())


def test_inputs_are_checked() -> None:
    grid = CandidateGrid(0.0, 1.0, 3)
    plan = plan_candidates(1.0, 1, [0.5])
    bad = pl.DataFrame({"partition": [0], "leaf": [5], "weight": [1]})
    with pytest.raises(ValueError, match="leaf"):
        answer_candidates(bad, 1, grid, [0.5], 1, plan, RandomSource.from_seed(0))
    with pytest.raises(ValueError, match="levels"):
        answer_candidates(bad, 1, grid, [0.5, 0.7], 1, plan, RandomSource.from_seed(0))


def test_rank_error_scale_is_the_worst_levels_laplace_scale() -> None:
    plan = plan_candidates(0.25, 3, [0.1, 0.5, 0.9])
    scale = rank_error_scale(plan, [0.1, 0.5, 0.9], 50)
    # The worst level is 0.1 or 0.9: 2·0.9·m over a ninth of ε.
    assert scale == pytest.approx(2 * 0.9 * 50 / (0.25 / 9), rel=1e-6)


def brute_isotonic(row: list[float]) -> list[float]:
    """Pool adjacent violators, the textbook way."""
    blocks: list[list[float]] = []
    for value in row:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            value2, weight2 = blocks.pop()
            value1, weight1 = blocks.pop()
            blocks.append([(value1 * weight1 + value2 * weight2) / (weight1 + weight2), weight1 + weight2])
    return [value for value, weight in blocks for _ in range(int(weight))]


def test_isotonic_regression_matches_pool_adjacent_violators(seeded: Seeded) -> None:
    rows = seeded.rng.normal(size=(300, 6)).round(1)
    got = isotonic(rows)
    expected = np.array([brute_isotonic(row.tolist()) for row in rows])
    np.testing.assert_allclose(got, expected, atol=1e-12, err_msg=seeded.why("isotonic regression differs"))
    assert np.all(np.diff(got, axis=1) >= -1e-12)
    ordered = np.sort(rows, axis=1)
    np.testing.assert_allclose(isotonic(ordered), ordered, atol=1e-12)

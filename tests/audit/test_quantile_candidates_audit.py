"""Audit of the candidate quantile mechanism: one unit more moves each answer's law by at most e^ε.

D holds a few values in one partition, D' the same plus one unit at the top value. Many
identical partitions answered in one call are independent draws of one answer's law, and
`dp_audit`'s Clopper–Pearson bounds on each candidate's probability give a lower bound on ε
that exceeds the truth with probability below 1e-9. A variant whose unit weighs more than
the scores were calibrated for (scores not bounded) must be caught.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from conftest import Seeded
from dp_audit import cp_lower, cp_upper
from dprun.mechanisms.quantile_candidates import CandidateGrid, answer_candidates, plan_candidates
from dprun.mechanisms.quantile_tree import WEIGHT_BITS

UNIT = 1 << WEIGHT_BITS
COPIES = 200_000
ALPHA = 1e-9


def answer_counts(values: list[float], weights: list[int], claimed_rows: int, grid: CandidateGrid,
                  seeded: Seeded) -> np.ndarray:
    slots = pl.DataFrame({"x": values}).select(grid.slot_expr("x"))["x"].to_numpy()
    table = pl.DataFrame({
        "partition": np.repeat(np.arange(COPIES, dtype=np.int64), len(values)),
        "leaf": np.tile(slots, COPIES),
        "weight": np.tile(np.asarray(weights, dtype=np.int64), COPIES),
    })
    answers = answer_candidates(table, COPIES, grid, [0.5], claimed_rows, plan_candidates(1.0, 1, [0.5]),
                                seeded.source)[:, 0]
    return np.array([(answers == c).sum() for c in grid.values()])


def epsilon_lower_bound(claimed_rows: int, added_weight: int, seeded: Seeded) -> float:
    grid = CandidateGrid(0.0, 4.0, 5)
    values, weights = [1.0, 2.0, 2.0, 3.0], [UNIT] * 4
    first = answer_counts(values, weights, claimed_rows, grid, seeded)
    second = answer_counts([*values, 4.0], [*weights, added_weight * UNIT], claimed_rows, grid, seeded)
    alpha = ALPHA / (4 * grid.count)
    best = 0.0
    for p, q in ((first, second), (second, first)):
        for k in range(grid.count):
            lower = cp_lower(int(p[k]), COPIES, alpha)
            if lower > 0:
                best = max(best, math.log(lower / cp_upper(int(q[k]), COPIES, alpha)))
    return best


def test_one_unit_moves_the_answer_by_at_most_e_to_the_epsilon(seeded: Seeded) -> None:
    claimed = plan_candidates(1.0, 1, [0.5]).epsilon_each[0]
    estimate = epsilon_lower_bound(claimed_rows=2, added_weight=2, seeded=seeded)
    assert estimate <= claimed, seeded.why(f"ε lower bound {estimate:.3f} exceeds the claimed {claimed:.3f}")


def test_scores_that_are_not_bounded_are_caught(seeded: Seeded) -> None:
    # The unit weighs 6 counts, but the scores are calibrated for 1: the claim no longer holds.
    claimed = plan_candidates(1.0, 1, [0.5]).epsilon_each[0]
    estimate = epsilon_lower_bound(claimed_rows=1, added_weight=6, seeded=seeded)
    assert estimate > claimed, seeded.why(f"the broken variant went unnoticed: ε lower bound {estimate:.3f}")

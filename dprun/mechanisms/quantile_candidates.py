"""DP quantiles by permute-and-flip over a grid of candidate values, one partition at a time.

The second quantile mechanism next to the tree (`dprun.mechanisms.quantile_tree`). Per
partition and level, it scores every candidate by how far its rank is from the target and
picks one with a mechanism in the exponential-mechanism family:

* Smith. "Privacy-preserving statistical estimation with optimal convergence rates."
  STOC 2011: the exponential mechanism with a rank score for the median.
* McKenna, Sheldon. "Permute-and-Flip: A new mechanism for differentially private
  selection." NeurIPS 2020: visit the candidates in a uniformly random order and stop at
  the first coin that comes up heads, with P(heads) = exp(ε·(u − u*)/(2Δ)). ε-DP like the
  exponential mechanism, and never worse in expected score.
* OpenDP's `make_quantile_score_candidates`: the same score, with α as a fraction.

Candidates. `CandidateGrid`: `count` evenly spaced values from lower to upper (both
included). A value (clamped to the bounds) falls in a slot: 2j when it equals candidate
j, 2j + 1 when it lies strictly between candidates j and j + 1. The engines sum the
values' weights per (partition, slot), exactly as for the tree's leaves.

Contributions. The same weights as the tree: a unit's n values in a partition weigh
floor(min(n, m)·2**W / n) each, so one unit's total weight in a partition is at most
m·2**W (`quantile_tree.unit_weight_expr`).

Score. For level α = a/b (the float's exact fraction), L(c) the weight of values below c
and G(c) the weight above, S(c) = |(b − a)·L(c) − a·G(c)| (b times OpenDP's score). One unit
adds w_L to L and w_G to G with w_L + w_G <= m·2**W, so S moves by at most
Δ_S = max(a, b − a)·m·2**W. The mechanism uses the rounded score S~ = floor(S·SCORE_STEPS/Δ_S),
whose sensitivity is SCORE_STEPS exactly (a difference of floors of numbers at most
SCORE_STEPS apart is an integer below SCORE_STEPS + 1). All of this is exact in Int128.

Coins. With ε_i = e_i/2**EPSILON_BITS (the planned ε of level i per partition, rounded
down to that grid, which only spends less; `plan_candidates` splits a partition's ε evenly
over the levels), candidate c is accepted with probability
exp(−γ), γ = ε_i·(S~(c) − min S~)/(2·SCORE_STEPS), an exact dyadic rational. The coin is
`sampling.bernoulli_exp_minus`: exact, no floating-point exponential. The best candidate
has γ = 0 and is always accepted, so the walk ends within `count` steps. The order is a
Fisher–Yates shuffle drawn step by step with exact uniform integers.

Privacy. Permute-and-flip is ε_i-DP per partition for level i. One unit changes at most
L0 partitions, and the levels of one partition are answered separately, so the whole
metric is L0·Σ ε_i-DP by basic composition (`CandidatePlan.epsilon`). An empty
partition has every score 0 and gets a uniformly random candidate. The levels of one
partition are made monotone by isotonic regression (`isotonic`, post-processing) and put
back on the nearest candidate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import polars as pl

from dprun.mechanisms.quantile_tree import WEIGHT_BITS, check_leaf_weights
from dprun.mechanisms.sampling import RandomSource, bernoulli_exp_minus, uniform_below

EPSILON_BITS = 30
"""ε per (partition, level) is rounded down to a multiple of 2**-EPSILON_BITS."""

SCORE_STEPS = 4096
"""Sensitivity of the rounded score: Δ_S is split into this many steps."""

MAX_EPSILON_EACH = 2.0**10
"""Largest ε per (partition, level): keeps ε_each·score inside Int128."""

# (partition, level) pairs × candidates handled at once; bounds the walk's memory (~20 bytes each).
_CHUNK_CELLS = 1 << 22
GAMMA_BITS = EPSILON_BITS + 1 + SCORE_STEPS.bit_length() - 1
WHOLE_CAP = 1 << 62  # γ beyond this is never accepted in practice; capped to fit int64


@dataclass(frozen=True)
class CandidateGrid:
    """`count` evenly spaced candidates from lower to upper, both included."""

    lower: float
    upper: float
    count: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lower) and math.isfinite(self.upper) and self.lower < self.upper):
            raise ValueError(f"candidate bounds must be finite with lower < upper, got [{self.lower}, {self.upper}]")
        if isinstance(self.count, bool) or not isinstance(self.count, int) or not 2 <= self.count <= 2**16:
            raise ValueError(f"the number of candidates must be an int in [2, 65536], got {self.count!r}")

    @property
    def step(self) -> float:
        return (self.upper - self.lower) / (self.count - 1)

    @property
    def slots(self) -> int:
        return 2 * self.count - 1

    def values(self) -> np.ndarray:
        """The candidates; the last one is `upper` exactly. Where the bounds and the step are short
        decimals (a step of 0.05 from 0), each candidate is the float nearest its decimal value, so
        that answers print as 16.45, not 16.450000000000003."""
        values = self.lower + np.arange(self.count, dtype=np.float64) * self.step
        decimals = max(_decimals(self.lower), _decimals(self.step))
        if decimals <= _MAX_DECIMALS:
            values = np.round(values, decimals)
        values[-1] = self.upper
        return np.minimum(values, self.upper)

    def slot_expr(self, column: str) -> pl.Expr:
        """The slot of each value of `column` (Int64): 2j on candidate j, 2j + 1 between j and j + 1; null for null/NaN."""
        value = pl.col(column).cast(pl.Float64).fill_nan(None).clip(self.lower, self.upper)
        position = (value - self.lower) / self.step
        below = position.floor()
        slot = pl.when(position == below).then(2 * below).otherwise(2 * below + 1)
        return slot.cast(pl.Int64).clip(0, self.slots - 1).alias(column)


_MAX_DECIMALS = 9


def _decimals(number: float) -> int:
    """The fewest decimal places that write `number` to within 1e-9 of itself (past _MAX_DECIMALS: more)."""
    for places in range(_MAX_DECIMALS + 1):
        scaled = abs(number) * 10**places
        if abs(scaled - round(scaled)) <= 1e-9 * max(1.0, scaled):
            return places
    return _MAX_DECIMALS + 1


def round_grid_count(lower: float, upper: float, most: int) -> int | None:
    """The most candidates, at most `most`, on a round step (1, 2 or 5 times a power of ten) that both
    bounds are multiples of; None if there is none (then an even grid of `most` is used)."""
    span = upper - lower
    smallest = span / (most - 1)
    exponent = math.floor(math.log10(smallest))
    for power in (exponent, exponent + 1):
        for mantissa in (1, 2, 5):
            step = mantissa * 10.0**power
            intervals = span / step
            if step >= smallest * (1 - 1e-12) and abs(intervals - round(intervals)) <= 1e-9 * intervals \
                    and all(abs(b / step - round(b / step)) <= 1e-9 * max(1.0, abs(b / step)) for b in (lower, upper)):
                return round(intervals) + 1
    return None


@dataclass(frozen=True)
class CandidatePlan:
    """Permute-and-flip per (partition, level): level i spends ε_i = epsilon_steps[i]·2**-EPSILON_BITS
    in each partition, for the levels in ascending order. `l0` partitions per unit compose
    to `epsilon` (pure DP)."""

    epsilon_steps: tuple[int, ...]
    l0: int
    kind: str = "permute_and_flip"
    delta: float = 0.0

    @property
    def levels(self) -> int:
        return len(self.epsilon_steps)

    @property
    def epsilon_each(self) -> tuple[float, ...]:
        return tuple(math.ldexp(steps, -EPSILON_BITS) for steps in self.epsilon_steps)

    @property
    def epsilon(self) -> float:
        return math.fsum(self.epsilon_each) * self.l0


def plan_candidates(epsilon: float, l0: int, levels: list[float]) -> CandidatePlan:
    """The plan that spends at most `epsilon` on the `levels` in each of up to `l0` partitions per unit.

    A partition's share ε/L0 is split evenly over its levels, as OpenDP splits a query's
    budget over its quantiles: each level then gets the exponential mechanism's budget, and
    permute-and-flip is never less accurate than it in expectation. (A split in proportion
    to the scores' sensitivities, max(α, 1 − α), would equalise the levels' rank error
    scales, but it takes budget from the median, whose answers were measurably worse.)
    """
    each = epsilon / l0 / len(levels)
    if not 0 < each <= MAX_EPSILON_EACH:
        raise ValueError(f"the ε per partition and level, {each:.3g}, is outside (0, {MAX_EPSILON_EACH:g}]")
    steps = math.floor(math.ldexp(each, EPSILON_BITS))
    if steps < 1:
        raise ValueError("the budget share of this quantile is too small for the candidate mechanism")
    return CandidatePlan((steps,) * len(levels), l0)


def score_sensitivity(level: float, max_rows: int) -> Fraction:
    """Δ_S / b in counts: max(α, 1 − α)·m, how far one unit can move the score of level α."""
    alpha = Fraction(level)
    return max(alpha, 1 - alpha) * max_rows


def rank_error_scale(plan: CandidatePlan, levels: list[float], max_rows: int) -> float:
    """The worst level's 2Δ/ε_i in counts: with many candidates near the target, the chosen rank
    is off by about a Laplace variable of this scale (the exponential mechanism's density; permute-
    and-flip is never worse in expectation). Not included: the grid's spacing and sparse data."""
    return max(2 * float(score_sensitivity(level, max_rows)) / each
               for level, each in zip(sorted(levels), plan.epsilon_each, strict=True))


def answer_candidates(
    slot_weights: pl.DataFrame,
    partitions: int,
    grid: CandidateGrid,
    levels: list[float],
    max_rows: int,
    plan: CandidatePlan,
    source: RandomSource,
) -> np.ndarray:
    """The DP quantiles of one column: float64 array of shape (partitions, len(levels)).

    `slot_weights`: columns "partition" (0..partitions−1), "leaf" (the slot, see
    `CandidateGrid.slot_expr`) and "weight" (non-negative integers in units of 2**-WEIGHT_BITS);
    repeated rows add up. Call once per metric: every call spends `plan.epsilon` again.
    """
    qs = [float(q) for q in levels]
    if any(not 0.0 <= q <= 1.0 for q in qs):
        raise ValueError(f"quantile levels must lie in [0, 1], got {levels}")
    if len(qs) != plan.levels:
        raise ValueError(f"the plan is for {plan.levels} levels, got {len(qs)}")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be an int >= 1, got {max_rows!r}")
    out = np.empty((partitions, len(qs)), dtype=np.float64)
    if partitions == 0 or not qs:
        return out
    weights = _summed(slot_weights, partitions, grid)
    values = grid.values()
    chunk = max(1, _CHUNK_CELLS // (grid.count * len(qs)))
    for start in range(0, partitions, chunk):
        stop = min(start + chunk, partitions)
        whole, fraction = _gammas(weights, start, stop, grid, qs, max_rows, plan)
        chosen = permute_and_flip(whole, fraction, source)
        out[start:stop] = values[chosen].reshape(stop - start, len(qs))
    order = np.argsort(qs, kind="stable")
    out[:, order] = _snap(isotonic(out[:, order]), grid, values)
    return out


def isotonic(rows: np.ndarray) -> np.ndarray:
    """Each row's closest non-decreasing sequence in the least-squares sense (isotonic regression).

    The min-max formula x̂_i = max_{j<=i} min_{l>=i} mean(y_j..y_l), vectorised over rows in
    O(k²) array steps for k columns. A projection onto a convex set that holds the truth
    never moves an estimate further from it in Euclidean distance, so this is never worse
    than the independent answers in total squared error (Hay et al. 2010 apply it to
    ordered DP answers). Already ordered rows are unchanged.
    """
    count, k = rows.shape
    prefix = np.concatenate([np.zeros((count, 1)), np.cumsum(rows, axis=1)], axis=1)
    best = np.full((count, k), -np.inf)
    for j in range(k):
        # min over l >= i of mean(y_j..y_l), for every i >= j: a running minimum from the right.
        means = (prefix[:, j + 1:] - prefix[:, j:j + 1]) / np.arange(1, k - j + 1)
        suffix_min = np.minimum.accumulate(means[:, ::-1], axis=1)[:, ::-1]
        best[:, j:] = np.maximum(best[:, j:], suffix_min)
    return best


def _snap(answers: np.ndarray, grid: CandidateGrid, values: np.ndarray) -> np.ndarray:
    """The nearest candidate to each answer (monotone, so an ordered row stays ordered)."""
    index = np.clip(np.rint((answers - grid.lower) / grid.step), 0, grid.count - 1).astype(np.int64)
    return values[index]


def _summed(slot_weights: pl.DataFrame, partitions: int, grid: CandidateGrid) -> pl.DataFrame:
    """The checked input, one Int128 row per (partition, slot), sorted."""
    check_leaf_weights(slot_weights, partitions, grid.slots)
    return (slot_weights.group_by("partition", "leaf")
            .agg(pl.col("weight").cast(pl.Int128).sum()).sort("partition", "leaf"))


def _gammas(
    weights: pl.DataFrame, start: int, stop: int, grid: CandidateGrid, qs: list[float], max_rows: int,
    plan: CandidatePlan,
) -> tuple[np.ndarray, np.ndarray]:
    """γ of every (partition, level, candidate) for partitions start..stop−1, as whole and fractional parts.

    Rows are (partition, level) in that order; γ = whole + fraction·2**-GAMMA_BITS.
    """
    count = stop - start
    cells = pl.DataFrame({
        "partition": np.repeat(np.arange(start, stop, dtype=np.int64), grid.slots),
        "leaf": np.tile(np.arange(grid.slots, dtype=np.int64), count),
    })
    dense = (cells.join(weights.filter(pl.col("partition").is_between(start, stop - 1)),
                        on=["partition", "leaf"], how="left", maintain_order="left")
             .with_columns(pl.col("weight").fill_null(0).cast(pl.Int128)))
    at = pl.col("weight")
    below = at.cum_sum().over("partition") - at
    total = at.sum().over("partition")
    ranks = dense.with_columns(below=below, above=total - below - at).filter(pl.col("leaf") % 2 == 0)
    wholes, fractions = [], []
    steps_of = dict(zip(sorted(qs), plan.epsilon_steps, strict=True))
    for q in qs:
        a, b = Fraction(q).as_integer_ratio()
        # Δ_S / SCORE_STEPS, an integer since WEIGHT_BITS >= log2(SCORE_STEPS).
        score_step = max(a, b - a) * max_rows << (WEIGHT_BITS - SCORE_STEPS.bit_length() + 1)
        score = ((pl.lit(b - a, pl.Int128) * pl.col("below") - pl.lit(a, pl.Int128) * pl.col("above")).abs()
                 // pl.lit(score_step, pl.Int128))
        gap = score - score.min().over("partition")
        scaled = gap * pl.lit(steps_of[q], pl.Int128)
        parts = ranks.select(
            whole=pl.min_horizontal(scaled // pl.lit(1 << GAMMA_BITS, pl.Int128), pl.lit(WHOLE_CAP, pl.Int128)),
            fraction=scaled % pl.lit(1 << GAMMA_BITS, pl.Int128),
        )
        wholes.append(parts["whole"].cast(pl.Int64).to_numpy().reshape(count, grid.count))
        fractions.append(parts["fraction"].cast(pl.Int64).to_numpy().reshape(count, grid.count))
    # (partition, level) rows: stack levels as the inner axis.
    whole = np.stack(wholes, axis=1).reshape(count * len(qs), grid.count)
    fraction = np.stack(fractions, axis=1).reshape(count * len(qs), grid.count)
    return whole, fraction


def permute_and_flip(whole: np.ndarray, fraction: np.ndarray, source: RandomSource) -> np.ndarray:
    """For each row, the index permute-and-flip picks: candidates in a uniformly random order, each
    accepted with probability exp(−γ), γ = whole + fraction·2**-GAMMA_BITS; the first accepted wins.

    Every row needs a candidate with γ = 0 (the best one), which ends its walk for sure.
    """
    rows, count = whole.shape
    if rows and not ((whole == 0) & (fraction == 0)).any(axis=1).all():
        raise ValueError("every row needs a candidate with γ = 0")
    order = np.tile(np.arange(count, dtype=np.int64), (rows, 1))
    chosen = np.full(rows, -1, dtype=np.int64)
    pending = np.arange(rows)
    for step in range(count):
        if not pending.size:
            break
        if step < count - 1:
            # Fisher–Yates, one position at a time: the next candidate is uniform among those not yet visited.
            pick = step + uniform_below(source, count - step, pending.size).astype(np.int64)
            here = order[pending, step].copy()
            order[pending, step] = order[pending, pick]
            order[pending, pick] = here
        candidate = order[pending, step]
        accepted = bernoulli_exp_minus(source, whole[pending, candidate], fraction[pending, candidate],
                                       1 << GAMMA_BITS)
        chosen[pending[accepted]] = candidate[accepted]
        pending = pending[~accepted]
    return chosen

"""Contribution and value bounds chosen from the data (`auto`), with differential privacy.

The auto step's ε is split in parts (`BoundChoicePlan`): one for the shape histograms, two for
the choice of (L0, L∞) where one of them is `auto`, and one per column with `bounds: auto`.
Three mechanisms, composed (pure DP, basic composition), then post-processing:

1. **Shape histograms** (`noisy_shape`), for the typical partition's size and the profile.
   Every privacy unit counts once in the *partitions* histogram (its number of partitions n),
   once in the *pair rows* histogram (the rows r of one of its (unit, partition) pairs, picked
   by a keyed hash of the pair, so uniformly at random) and once in the *unit rows* histogram
   (its rows in all); where the partitions are private, the *size* histogram counts the
   partitions by the number of units that picked them. Bins are powers of two: bin j holds
   (2^(j-1), 2^j], bin 0 the value 1, the last bin everything above the largest candidate.
   One unit moves one cell of each of the first three by 1 and moves one partition to the next
   size bin (two cells by 1): L1 sensitivity 3, or 5 with sizes; discrete Laplace noise of
   scale 3/ε_h or 5/ε_h on every cell (Canonne, Kamath, Steinke 2020).
   They are read robustly, by their noisy quartiles (`_typical`), so that no noisy empty
   cell at the top of a grid, where one cell stands for many rows, moves an estimate.

2. **The choice of (L0, L∞)** (`choose_bounds`): permute-and-flip (`score_choice`) over the
   candidate pairs, scored by what the query would keep minus its noise. Each unit keeps,
   at (L0, L∞), the share min(L0, n)/n of its pairs and of its rows the share
   Σ_{its L0 pairs with most rows} min(r_p, L∞) / R, R = Σ_p r_p (the cross-partition
   bounding keeps a unit's partitions with the most rows), both in [0, 1];
   its rows' share is weighed by min(R, C)/C, its rows up to a cap C (KEPT_CAPS), so that a
   count's error, which weighs rows, is followed as far as the units' weight allows. Per
   candidate and cap, the engines sum these shares over the units, exactly, in integer
   weights of at most 2^UNIT_WEIGHT_BITS per unit, rounded down (`kept_weights`). The score of
   a candidate is row_metrics · (rows kept) + unit_metrics · (pairs kept) − S · (noise std
   over value, summed over the metrics, at the typical partition from step 1), S the units'
   weight: the metrics' relative error, in units' worth, with the sign turned. The cap C and
   S are functions of step 1's output; one unit moves the first part by at most
   (row_metrics + unit_metrics) · 2^UNIT_WEIGHT_BITS and the second not at all: that is the
   sensitivity. Adding a unit raises every score by its own shares, removing it lowers every
   one: the scores are monotone, and permute-and-flip runs at ε_c/Δ, not ε_c/(2Δ)
   (`score_choice`). No unit weighs more than one, so a few heavy units cannot hide the many, and
   the choice sees 10^3 units as well as 10^7. With probability 95% the choice's error is
   within shortfall(ε_c, K) / S of the best candidate's (`score_choice.shortfall`), S taken at
   the units' lower bound (UNITS_LOWER_STDS); where that is above SEEN_ENOUGH the choice says so.

3. **Value bounds** (`choose_value_bounds`), per column with `bounds: auto`: two DP quantiles
   of its values by permute-and-flip over the cells of a signed power-of-two grid, each unit's
   rows weighed to one unit in all (`unit_value_weights`): the score of a cell at level q, minus
   the distance from ⌊q·W⌋ to the cell's span [W(< cell), W(≤ cell)], moves by at most one unit's
   weight. The bounds are the lower cell's lower edge and the upper cell's upper edge. The levels ℓ and 1 − ℓ are the
   most extreme the quantiles can resolve at their ε and Û: ℓ = 2 · shortfall / Û, at least
   VALUE_TAIL and at most 1/4; where every metric on the column is a quantile, a quarter of the
   way from its levels to the ends (a median's bounds are its 37.5th and 62.5th percentiles:
   clamping moves no rank, and narrower bounds make finer quantiles). A sum's
   bounds also hold 0 (clamping a value towards 0 only shrinks it); a mean's and a quantile's
   are the two quantiles.

Why permute-and-flip over scores rather than a choice post-processed from noisy histograms (the
mechanism this replaces): a histogram cell must be read as empty below a floor that grows with
the number of cells, and with 10^3–10^4 units every cell fell below it. The grids and candidates
are fixed before any data is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from dprun.mechanisms import score_choice
from dprun.mechanisms.sampling import MAX_SCALE, RandomSource, discrete_laplace

# Candidates for max_partitions_contributed and max_contributions_per_partition: powers of two.
L0_CANDIDATES: tuple[int, ...] = tuple(2**i for i in range(8))  # 1 … 128
ROWS_CANDIDATES: tuple[int, ...] = tuple(2**i for i in range(11))  # 1 … 1024
# The default fraction of a query's ε spent choosing its `auto` bounds: this much per part of the step
# (HISTOGRAM_PART, CONTRIBUTION_PART, VALUE_PART), so 5% for the shape histograms, 10% more for a choice of
# (L0, L∞) that scores the data, 5% per column with auto value bounds; at most DEFAULT_SHARE_LIMIT. A choice
# that reads the shape alone (means, quantiles) needs little of it and pays little; one that scores the data
# needs its resolution (on the few-heavy-units shapes of benchmarks/bench_auto_expected.py a count's or a sum's
# expected error went from 1.19-1.32x the best fixed bounds' at 10% in all to 1.19-1.25x at 15%, a mean's
# from 1.20 to 1.15-1.22x at 5%).
PART_SHARE = 0.05
DEFAULT_SHARE_LIMIT = 0.25
# Partition sizes, in units that picked a pair in them: 1 … 2^26, and above.
SIZE_CANDIDATES: tuple[int, ...] = tuple(2**i for i in range(27))
# Rows per unit: 1 … 2^24, and above.
UNIT_ROWS_CANDIDATES: tuple[int, ...] = tuple(2**i for i in range(25))
# One unit moves one cell of the partitions, the pair rows and the unit rows histograms by one each, and,
# where the partitions are private, two size cells.
HISTOGRAM_SENSITIVITY = 3
SIZE_SENSITIVITY = 2
# The auto step's ε in parts: the shape histograms, the choice of (L0, L∞), each auto value column.
HISTOGRAM_PART, CONTRIBUTION_PART, VALUE_PART = 1, 2, 1
# The shape histograms' cells below this many noise scales count as empty (P(noise >= 2t) < 7%): the
# distributions are read by their quartiles and middles, which a few such cells move little.
VISIBLE_STDS = 2.0
# All size cells together reach the floor by noise alone with at most this probability.
SIZE_FALSE_ALARM = 1e-3
# The choice saw enough where its error is within this much of the best one's (95% confidence) ...
SEEN_ENOUGH = 0.1
# ... and the advice asks for the share that brings that down to this.
ADVISED_SHORTFALL = 0.05
# The shortfall is stated at this many standard deviations below the estimated units (a lower bound at
# about 98%), so that an upward draw of the estimate cannot hide a choice that saw too little.
UNITS_LOWER_STDS = 2.0
# The smallest share of a column's values auto value bounds leave out at each end.
VALUE_TAIL = 0.001
# The largest: beyond it the quantiles say too little of the values to bound them.
VALUE_TAIL_LIMIT = 0.25
# A column whose metrics are all quantiles is bounded at levels this share of the way from their lowest
# (highest) level to 0 (1): a median's bounds are its 37.5th and 62.5th percentiles.
QUANTILE_MARGIN = 0.75
# Value bins, per sign: magnitudes in (2^(k-1), 2^k] for k = VALUE_MIN_EXPONENT … VALUE_MAX_EXPONENT,
# one bin above 2^VALUE_MAX_EXPONENT, and one "zero" bin for |v| ≤ 2^(VALUE_MIN_EXPONENT - 1) shared by
# both signs. Cell ZERO_CELL ± p holds the values of sign ± at position p (1 … VALUE_EXPONENTS, then above).
VALUE_MIN_EXPONENT = -20
VALUE_MAX_EXPONENT = 40
VALUE_EXPONENTS = VALUE_MAX_EXPONENT - VALUE_MIN_EXPONENT + 1
ZERO_CELL = VALUE_EXPONENTS + 1
VALUE_CELLS = 2 * ZERO_CELL + 1
# A unit's whole weight, in the value histogram and in the kept shares: 2^UNIT_WEIGHT_BITS (parts rounded down).
UNIT_WEIGHT_BITS = 16
# The kept shares of rows are summed with each unit weighed by its rows up to a cap C, min(R, C)/C: C = 1
# weighs every unit alike; larger caps come closer to weighing rows, as a count's error does, at the cost
# of fewer units' worth of weight for the choice to see. The choice takes the largest cap whose weight
# (from the shape histograms) keeps its shortfall within KEPT_CAP_RESOLUTION of it: on the few-heavy-units
# shapes of benchmarks/bench_auto_bounds.py a cap short of the heavy units' rows misses what L∞ drops of
# them, and one whose shortfall is more than 15% of its weight wanders among the candidates (20-30%
# measured worse, 5-12% too low a cap on aircraft).
KEPT_CAPS: tuple[int, ...] = (1, 4, 16, 64, 256)
KEPT_CAP_RESOLUTION = 0.15
# Where a metric is a mean of the rows kept, bounds whose noise is within this share of the least are as
# good as it on noise, and the one among them that keeps the most rows is chosen (`_least_noise`).
NOISE_SLACK = 0.15


@dataclass(frozen=True)
class BoundChoicePlan:
    """How a query's `auto` bounds are chosen: the budget, the grids, the fixed bounds.

    `l0` / `rows`: the bound the spec fixes, or None where it says `auto`. `partitions`:
    the number of partitions when it is public (public keys, or 1 without group_by), else
    None (estimated from the data). `row_metrics` / `unit_metrics`: how many of the
    query's metrics lose what the bounds drop, counted in rows (count, sum) or in units
    (privacy_id_count). `share`: the query's ε share this plan's ε is (for advice).
    """

    epsilon: float
    l0: int | None
    rows: int | None
    partitions: int | None
    row_metrics: int
    unit_metrics: int
    min_units: float = 1.0  # the partitions whose error counts hold at least this many units
    values: tuple[ValueChoice, ...] = ()  # the metrics whose value bounds are `auto`
    l0_candidates: tuple[int, ...] = L0_CANDIDATES
    rows_candidates: tuple[int, ...] = ROWS_CANDIDATES
    share: float = PART_SHARE
    rows_matter: bool = True  # some metric depends on the rows per partition (any but privacy_id_count)
    # Some metric is a statistic of the rows kept (mean, variance, stddev): its sampling error falls as
    # more are kept, which its noise does not say.
    samples_rows: bool = False

    @property
    def value_columns(self) -> tuple[str, ...]:
        """The columns profiled for value bounds, one histogram each, in a fixed order."""
        return tuple(dict.fromkeys(choice.column for choice in self.values))

    @property
    def chooses_contribution(self) -> bool:
        return self.l0 is None or self.rows is None

    @property
    def scores_data(self) -> bool:
        """Whether the choice of (L0, L∞) scores the data: some metric loses what the bounds drop (counts,
        sums); otherwise (means, quantiles) it weighs the noise alone, from the shape histograms."""
        return self.chooses_contribution and self.row_metrics + self.unit_metrics > 0

    @property
    def l0_options(self) -> tuple[int, ...]:
        """The L0 the choice is among: the candidates, or the spec's fixed bound."""
        return self.l0_candidates if self.l0 is None else (self.l0,)

    @property
    def rows_options(self) -> tuple[int, ...]:
        """The L∞ the choice is among; 1 alone where nothing the query releases depends on rows per partition
    (privacy unit counts only)."""
        if self.rows is not None:
            return (self.rows,)
        return self.rows_candidates if self.rows_matter else (1,)

    @property
    def parts(self) -> int:
        """The auto step's parts, weighed: the shape histograms, the choice where it scores data, each
        auto value column."""
        return HISTOGRAM_PART + CONTRIBUTION_PART * self.scores_data + VALUE_PART * len(self.value_columns)

    @property
    def default_share(self) -> float:
        """The share of the query's ε the step spends where the spec does not say (`PART_SHARE`)."""
        return min(PART_SHARE * self.parts, DEFAULT_SHARE_LIMIT)

    def _part(self, weight: int) -> float:
        return self.epsilon * weight / self.parts

    @property
    def histogram_epsilon(self) -> float:
        return self._part(HISTOGRAM_PART)

    @property
    def contribution_epsilon(self) -> float:
        """The choice of (L0, L∞)'s ε (0 where it scores no data)."""
        return self._part(CONTRIBUTION_PART) if self.scores_data else 0.0

    @property
    def quantile_epsilon(self) -> float:
        """The ε of each of the two quantiles of a column with `bounds: auto`."""
        return self._part(VALUE_PART) / 2

    @property
    def profiles_sizes(self) -> bool:
        """Whether the partitions are private, so that their sizes are estimated from the data."""
        return self.partitions is None

    @property
    def scale(self) -> float:
        """The discrete Laplace scale t of every shape histogram cell."""
        return (HISTOGRAM_SENSITIVITY + SIZE_SENSITIVITY * self.profiles_sizes) / self.histogram_epsilon

    def sampler_problem(self, advice: str) -> str | None:
        """Why a part's ε is beyond the samplers' range, or None: checked when the plan is made, before
        any row is read, so that a tiny ε never fails after the data's pass."""
        fine = math.isfinite(self.scale) and self.scale <= MAX_SCALE
        fine = fine and (not self.scores_data or score_choice.epsilon_steps(self.contribution_epsilon) >= 1)
        fine = fine and (not self.values or score_choice.epsilon_steps(self.quantile_epsilon) >= 1)
        if fine:
            return None
        return (f"ε = {self.epsilon:.3g} for choosing the auto bounds is too small: its noise would be out "
                f"of the samplers' range; {advice}")

    @property
    def shape(self) -> tuple[int, int]:
        """Cells of the (partitions, rows of the picked pair) histogram: one bin per candidate plus one above."""
        return len(self.l0_candidates) + 1, len(self.rows_candidates) + 1


def useful_l0(partitions: int | None) -> tuple[int, ...]:
    """The L0 candidates worth choosing among: where the number of partitions is known before any row is
    read (public, or 1 without group_by), those below it and the first at or above it (a unit cannot
    contribute to more partitions than there are: larger ones keep the same and add noise, and every
    candidate costs the choice resolution); all of L0_CANDIDATES otherwise."""
    if partitions is None or partitions > L0_CANDIDATES[-1]:
        return L0_CANDIDATES
    return tuple(c for c in L0_CANDIDATES if c < partitions) + (min(c for c in L0_CANDIDATES if c >= partitions),)


@dataclass(frozen=True)
class ValueChoice:
    """A metric whose `bounds` are `auto`: its name, its column, and the noisy sum it is released from
    (`sum`, `centered_sum`; None for quantiles)."""

    metric: str
    column: str
    aggregate: str | None
    levels: tuple[float, ...] = ()  # a quantile metric's levels (empty for the others)


@dataclass(frozen=True)
class ContributionProfile:
    """The exact figures (private) the auto step releases with noise or scores candidates by.

    `cells`: units per (partitions bin, rows-of-the-picked-pair bin), whose two marginals are
    released; `unit_rows`: units per bin of their rows (UNIT_ROWS_CANDIDATES); `sizes`:
    partitions per bin of the number of units that picked them; `values`:
    per value column and value cell, the units' weights (2^UNIT_WEIGHT_BITS per unit);
    `kept_rows[c, i, j]` / `kept_pairs[i]`: the units' kept shares of their rows at
    (l0_options[i], rows_options[j]), each unit weighed by its rows up to KEPT_CAPS[c], and of their
    pairs at l0_options[i] (`kept_weights`)."""

    cells: np.ndarray
    unit_rows: np.ndarray
    sizes: np.ndarray
    kept_rows: np.ndarray
    kept_pairs: np.ndarray
    values: np.ndarray = field(default_factory=lambda: np.zeros((0, VALUE_CELLS), dtype=np.int64))


@dataclass(frozen=True)
class NoisyShape:
    """The released shape histograms (DP): units per partitions bin, per rows-of-the-picked-pair bin and
    per rows bin, partitions per size bin (None for public partitions), and the noise scale."""

    partitions: np.ndarray
    rows: np.ndarray
    unit_rows: np.ndarray
    sizes: np.ndarray | None
    scale: float


@dataclass(frozen=True)
class ChosenBounds:
    """The bounds chosen, and the DP figures they were chosen from (safe to publish)."""

    l0: int
    rows: int
    units: int  # noisy number of units
    partitions: int  # the number of partitions: public, or the noisy count of picked ones
    typical_units: float  # the units of a typical partition that matters, where the noise was weighed
    dropped_share: float  # estimated share of rows (units, for unit counts only) the chosen bounds drop
    typical_rows: float = 0.0  # the rows of that typical partition
    values: tuple[ChosenValues, ...] = ()  # the value bounds chosen, per metric with `bounds: auto`
    # The share of rows L∞ alone drops at the chosen bounds (what Plume's second bounding cannot win back).
    per_partition_dropped: float = 0.0
    # (units of a partition, partitions of that size) per size bin above the noise floor.
    partition_sizes: tuple[tuple[float, float], ...] = ()
    # How much more relative error per metric than the best candidate's the choice may have (95%).
    shortfall: float = 0.0

    @property
    def seen_enough(self) -> bool:
        return self.shortfall <= SEEN_ENOUGH

    @property
    def budget_factor(self) -> float:
        """The factor on the auto step's ε that would bring `shortfall` to ADVISED_SHORTFALL (it scales as 1/ε)."""
        return max(self.shortfall / ADVISED_SHORTFALL, 1.0)


@dataclass(frozen=True)
class ChosenValues:
    """A metric's chosen value bounds, from its column's two quantiles at `levels` (DP)."""

    metric: str
    lower: float
    upper: float
    clipped_share: float  # the estimated share of the column's values outside the bounds, at most
    tail: float = VALUE_TAIL
    column_range: tuple[float, float] = (0.0, 1.0)  # the two quantiles
    # The levels the quantiles could resolve: twice their rank error (95%) over the units.
    resolution: float = 0.0
    levels: tuple[float, float] = (VALUE_TAIL, 1 - VALUE_TAIL)  # the column's two quantiles' levels

    @property
    def seen_enough(self) -> bool:
        return self.resolution <= VALUE_TAIL_LIMIT

    @property
    def budget_factor(self) -> float:
        """The factor on the auto step's ε at which the quantiles could resolve VALUE_TAIL_LIMIT."""
        return max(self.resolution / VALUE_TAIL_LIMIT, 1.0)


def bin_index(values: np.ndarray, candidates: tuple[int, ...]) -> np.ndarray:
    """Bin of each positive integer value: j for (2^(j-1), 2^j], the last bin above the largest candidate."""
    below = np.maximum(np.asarray(values, dtype=np.int64), 1) - 1
    # The bit length of v - 1, exactly (frexp's exponent of an integer below 2^53 is its bit length).
    _, exponent = np.frexp(below.astype(np.float64))
    return np.minimum(exponent.astype(np.int64), len(candidates))


def histogram(partitions_per_unit: np.ndarray, rows_of_picked_pair: np.ndarray, plan: BoundChoicePlan,
              units: np.ndarray | None = None) -> np.ndarray:
    """The exact cell counts of units, given each unit's partitions and its picked pair's rows
    (or, with `units`, how many units have each such pair of values)."""
    cells = np.zeros(plan.shape, dtype=np.int64)
    weights = np.ones(len(partitions_per_unit), dtype=np.int64) if units is None else np.asarray(units, np.int64)
    np.add.at(cells, (bin_index(partitions_per_unit, plan.l0_candidates),
                      bin_index(rows_of_picked_pair, plan.rows_candidates)), weights)
    return cells


def size_histogram(picks_per_partition: np.ndarray, partitions: np.ndarray | None = None) -> np.ndarray:
    """The exact partition counts per bin of the number of units that picked them (or, with
    `partitions`, how many partitions have each such number)."""
    sizes = np.zeros(len(SIZE_CANDIDATES) + 1, dtype=np.int64)
    weights = np.ones(len(picks_per_partition), np.int64) if partitions is None else np.asarray(partitions, np.int64)
    np.add.at(sizes, bin_index(picks_per_partition, SIZE_CANDIDATES), weights)
    return sizes


def runs_kept_weights(pair_rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray, plan: BoundChoicePlan
                      ) -> tuple[np.ndarray, np.ndarray]:
    """`kept_weights` of units whose pairs' rows are runs of `pair_rows` (from `starts`, `lengths` long)."""
    rows = np.asarray(pair_rows, dtype=np.int64)
    if starts.size == 0:
        return kept_weights(lengths, lengths, np.zeros((0, len(plan.l0_options), len(plan.rows_options)), np.int64),
                            plan)
    # Each unit's pairs, most rows first: the cross-partition bounding keeps its first L0.
    order = np.lexsort((-rows, np.repeat(np.arange(starts.size), lengths)))
    ranked = rows[order]
    rank = np.arange(rows.size) - np.repeat(starts, lengths)
    kept = np.stack([np.stack([np.add.reduceat(np.where(rank < l0, np.minimum(ranked, cap), 0), starts)
                               for cap in plan.rows_options], axis=1) for l0 in plan.l0_options], axis=1)
    return kept_weights(lengths, np.add.reduceat(rows, starts), kept, plan)


def kept_weights(partitions: np.ndarray, rows: np.ndarray, kept_rows_capped: np.ndarray, plan: BoundChoicePlan
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The kept shares summed over units, exactly (`ContributionProfile.kept_rows`, `kept_pairs`).

    Per unit: `partitions` n, `rows` R = Σ_p r_p and `kept_rows_capped[:, i, j]`, the rows
    min(r_p, L∞_j) of the L0_i pairs with the most rows (the ones the cross-partition bounding
    keeps). It keeps ⌊2^W·min(n, L0)/n⌋ of its pairs' weight and s = ⌊2^W·kept/R⌋ of its rows',
    W = UNIT_WEIGHT_BITS; weighed by its rows up to each cap C of KEPT_CAPS, ⌊s·min(R, C)/C⌋.
    Each at most 2^W (the sensitivity). Integers throughout, so every engine computes the same sums."""
    n = np.asarray(partitions, dtype=np.int64)
    total = np.asarray(rows, dtype=np.int64)
    capped = np.asarray(kept_rows_capped, dtype=np.int64)
    kept_rows = np.zeros((len(KEPT_CAPS), len(plan.l0_options), len(plan.rows_options)), dtype=np.int64)
    kept_pairs = np.zeros(len(plan.l0_options), dtype=np.int64)
    for i, l0 in enumerate(plan.l0_options):
        kept_pairs[i] = ((np.minimum(n, l0) << UNIT_WEIGHT_BITS) // n).sum()
        shares = (capped[:, i, :] << UNIT_WEIGHT_BITS) // total[:, None]
        for c, cap in enumerate(KEPT_CAPS):
            kept_rows[c, i] = ((shares * np.minimum(total, cap)[:, None]) // cap).sum(axis=0)
    return kept_rows, kept_pairs


def value_cells(values: np.ndarray) -> np.ndarray:
    """The value cell of each finite float64 value, exactly: the smallest k with |v| ≤ 2^k is frexp's
    exponent, less one where |v| is itself a power of two (mantissa one half)."""
    magnitude = np.abs(values)
    mantissa, exponent = np.frexp(magnitude)
    smallest_k = exponent - (mantissa == 0.5)
    position = np.clip(smallest_k - VALUE_MIN_EXPONENT + 1, 0, VALUE_EXPONENTS + 1)
    position = np.where(magnitude == 0, 0, position)
    return ZERO_CELL + np.sign(values).astype(np.int64) * position


def _counted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, sorted, and how often each comes: np.unique(values, return_counts=True)
    by numpy's sort and one comparison, which numpy 2.4's np.unique is not (177 ms for a shard's
    2^21 pairs of a value profile on the benchmark machine)."""
    ordered = np.sort(values)
    starts = np.empty(ordered.size, bool)
    if ordered.size:
        starts[0] = True
        np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    first = np.flatnonzero(starts)
    return ordered[first], np.diff(np.append(first, ordered.size))


def unit_value_weights(unit: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """The exact value histogram: each unit's rows' cells, weighted so that a unit's weights add up
    to at most 2^UNIT_WEIGHT_BITS (its share of rows in a cell, times that, rounded down).

    `unit`: any integer label of each row's unit; `cell`: the row's value cell. Rounding down
    keeps one unit's whole weight within one count's worth: the sensitivity of the quantiles' scores."""
    # (unit, cell) as one int64; labels that may use all 64 bits are numbered densely first
    # (np.unique's inverse: 180 ms for a shard's 2^21 rows; the whole histogram 300 → 118 ms
    # where the shard's unit codes fit beside a cell).
    fits = unit.size == 0 or (int(unit.min()) >= 0 and int(unit.max()) <= (2**63 - 1) // VALUE_CELLS - 1)
    label = unit.astype(np.int64) if fits else np.unique(unit, return_inverse=True)[1].reshape(-1).astype(np.int64)
    pairs, rows = _counted(label * VALUE_CELLS + cell)
    units, cells = np.divmod(pairs, VALUE_CELLS)
    starts = np.flatnonzero(np.diff(units, prepend=-1) != 0)
    per_unit = np.repeat(np.add.reduceat(rows, starts), np.diff(np.append(starts, rows.size)))
    weights = (rows << UNIT_WEIGHT_BITS) // per_unit
    out = np.zeros(VALUE_CELLS, dtype=np.int64)
    np.add.at(out, cells, weights)
    return out


def _value_edges() -> tuple[np.ndarray, np.ndarray]:
    """Per value cell, its lower and upper edges; the bins above the largest magnitude end at twice it."""
    magnitudes = [math.ldexp(1.0, k) for k in range(VALUE_MIN_EXPONENT, VALUE_MAX_EXPONENT + 1)]
    top = magnitudes[-1]
    low = np.array([0.0, *(m / 2 for m in magnitudes), top])
    high = np.array([0.0, *magnitudes, 2 * top])
    return np.concatenate([-high[:0:-1], low]), np.concatenate([-low[:0:-1], high])


VALUE_LOWER, VALUE_UPPER = _value_edges()


def noisy_shape(exact: ContributionProfile, plan: BoundChoicePlan, source: RandomSource) -> NoisyShape:
    """The ε_h-DP release of the shape histograms: discrete Laplace noise of scale t on every cell."""
    t = plan.scale
    partitions, rows = exact.cells.sum(axis=1), exact.cells.sum(axis=0)
    sizes = exact.sizes + discrete_laplace(source, t, exact.sizes.size) if plan.profiles_sizes else None
    return NoisyShape(partitions + discrete_laplace(source, t, partitions.size),
                      rows + discrete_laplace(source, t, rows.size),
                      exact.unit_rows + discrete_laplace(source, t, exact.unit_rows.size), sizes, t)


def unit_rows_histogram(rows_per_unit: np.ndarray, units: np.ndarray | None = None) -> np.ndarray:
    """The exact unit counts per bin of their rows (or, with `units`, how many units have each such number)."""
    counts = np.zeros(len(UNIT_ROWS_CANDIDATES) + 1, dtype=np.int64)
    weights = np.ones(len(rows_per_unit), np.int64) if units is None else np.asarray(units, np.int64)
    np.add.at(counts, bin_index(rows_per_unit, UNIT_ROWS_CANDIDATES), weights)
    return counts


def _first_reaching(noisy: np.ndarray, level: float, total: float) -> int:
    """The first bin whose noisy cumulative count reaches `level` of `total` (the last bin if none does)."""
    return min(int(np.searchsorted(np.cumsum(noisy.astype(np.float64)), level * total)), noisy.size - 1)


def _visible(noisy: np.ndarray, scale: float) -> np.ndarray:
    """A noisy histogram's counts that stand VISIBLE_STDS noise scales above 0 and lie in one stretch of
    bins around the largest, at most one empty bin apart, and those elsewhere that stand above the floor
    all of the histogram's empty cells reach by noise alone with probability SIZE_FALSE_ALARM (floats;
    the others 0). A lone noisy cell far from the data, rare as it is, would otherwise stand for many
    units at the top of a grid; a second mode that stands out of all the noise is data (a unit's home
    partition and its few rows elsewhere)."""
    counts = noisy.astype(np.float64)
    shown = counts >= VISIBLE_STDS * scale
    if not shown.any():
        return np.zeros_like(counts)
    keep = counts >= 1.0 + scale * math.log(counts.size / SIZE_FALSE_ALARM)
    peak = int(np.argmax(np.where(shown, counts, -np.inf)))
    for step in (-1, 1):
        at, gap = peak, 0
        while 0 <= at < counts.size and gap <= 1:
            gap = 0 if shown[at] else gap + 1
            keep[at] = shown[at]
            at += step
    return np.where(keep, counts, 0.0)


def _log2_percentile(counts: np.ndarray, level: float) -> float:
    """log2 of a distribution's percentile on the power-of-two bins, interpolated within its bin."""
    total = max(float(counts.sum()), 1.0)
    index = _first_reaching(counts, level, total)
    if index == 0:
        return 0.0
    below = float(counts[:index].sum())
    within = min(max((level * total - below) / max(counts[index], 1.0), 0.0), 1.0)
    return index - 1 + within


def _typical(noisy: np.ndarray, scale: float, candidates: tuple[int, ...]) -> float:
    """A distribution's mean, robustly from its noisy quartiles: as a log-normal one's, median · e^(σ²/2),
    σ from the interquartile range (1.349 σ), and at most the 90th percentile. Noisy empty cells at the
    top of a grid, where one cell stands for many rows, cannot move it as they move a mean over the cells."""
    counts = _visible(noisy, scale)
    low, median, high, top = (_log2_percentile(counts, level) for level in (0.25, 0.5, 0.75, 0.9))
    sigma = (high - low) * math.log(2) / 1.349
    # At most the 90th percentile: where the quartiles are far apart (two clusters), a log-normal's mean is not.
    return min(2.0**median * math.exp(sigma**2 / 2), 2.0**top, 2.0 * candidates[-1])


def _midpoints(candidates: tuple[int, ...]) -> np.ndarray:
    """A bin's typical value: 1 for bin 0, the middle of (2^(j-1), 2^j] for bin j, and twice
    the largest candidate for the bin above it."""
    middles = [1.0] + [(2.0 ** (j - 1) + 1 + 2.0**j) / 2 for j in range(1, len(candidates))]
    return np.array([*middles, 2.0 * candidates[-1]])


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def units_estimate(noisy: NoisyShape) -> float:
    """The number of units: the three unit histograms count every unit once; their mean (at least 1)."""
    return max((float(noisy.partitions.sum()) + float(noisy.rows.sum()) + float(noisy.unit_rows.sum())) / 3, 1.0)


def units_std(noisy: NoisyShape) -> float:
    """The standard deviation of `units_estimate`, at most: a mean of three histograms' totals, each cell's
    discrete Laplace variance below 2t²."""
    cells = noisy.partitions.size + noisy.rows.size + noisy.unit_rows.size
    return noisy.scale * math.sqrt(2.0 * cells) / 3


@dataclass(frozen=True)
class _Shape:
    """What the noisy shape says of a query's data (post-processing): units, partitions per unit,
    rows per pair, and the partitions that matter."""

    units: float
    per_unit: float
    rows_per_pair: float
    partitions: int
    typical_units: float
    partition_sizes: tuple[tuple[float, float], ...]

    @property
    def typical_rows(self) -> float:
        return self.typical_units * self.rows_per_pair


def _shape(noisy: NoisyShape, plan: BoundChoicePlan) -> _Shape:
    units = units_estimate(noisy)
    per_unit = max(_typical(noisy.partitions, noisy.scale, plan.l0_candidates), 1.0)
    rows_per_pair = max(_typical(noisy.unit_rows, noisy.scale, UNIT_ROWS_CANDIDATES) / per_unit, 1.0)
    sizes = np.zeros(len(SIZE_CANDIDATES) + 1)
    if noisy.sizes is not None:
        floor = 1.0 + noisy.scale * math.log(noisy.sizes.size / SIZE_FALSE_ALARM)
        sizes = np.where(noisy.sizes >= floor, noisy.sizes, 0).astype(np.float64)
    # A partition picked by k units holds about k · (pairs / units) units.
    partition_units = _midpoints(SIZE_CANDIDATES) * per_unit
    mattering = sizes * (partition_units >= plan.min_units)
    counted = plan.partitions if plan.partitions is not None else int(sizes.sum())
    if mattering.sum() > 0:
        typical_units = float(mattering.sum() / (mattering / partition_units).sum())  # the harmonic mean
    elif plan.partitions is not None:
        # Public partitions: their mean size.
        typical_units = max(units * per_unit / plan.partitions, plan.min_units)
    else:
        typical_units = plan.min_units
    found = tuple((float(size), float(count)) for size, count in zip(partition_units, sizes, strict=True) if count > 0)
    return _Shape(units, per_unit, rows_per_pair, counted, typical_units, found)


# relative_noise(l0, rows, rows per partition, units per partition, share of rows kept): the query's
# metrics' noise standard deviations at those bounds, each relative to its value in a partition of that
# size (a mean's or a quantile's over the rows kept), summed.
RelativeNoise = Callable[[int, int, float, float, float], float]


def choose_bounds(exact: ContributionProfile, noisy: NoisyShape, plan: BoundChoicePlan,
                  relative_noise: RelativeNoise, source: RandomSource) -> ChosenBounds:
    """(L0, L∞) by permute-and-flip over the options, each scored by the units' kept shares less the
    noise at the typical partition (module docstring, step 2); where no metric loses what the bounds
    drop (means, quantiles), the least noise or, for a mean, the most rows near it (`_least_noise`),
    a choice from the noisy shape alone; where both are fixed, those. The DP figures that go with it
    are estimated from the noisy shape alone."""
    shape = _shape(noisy, plan)
    options = [(l0, rows) for l0 in plan.l0_options for rows in plan.rows_options]
    kept = [1 - _dropped(noisy, plan, l0, rows).rows for l0, rows in options]
    noises = [relative_noise(l0, rows, shape.typical_rows, shape.typical_units, share)
              for (l0, rows), share in zip(options, kept, strict=True)]
    shortfall = 0.0
    if plan.scores_data:
        # The kept shares only grow as a unit is added: the scores are monotone (`score_choice`).
        resolution = score_choice.shortfall(plan.contribution_epsilon, len(options), monotone=True)
        cap, weight = _row_cap(noisy, shape.units, resolution)
        # The metrics' error in units' worth: row metrics weigh `weight`, unit metrics every unit.
        scale = (plan.row_metrics * weight + plan.unit_metrics * shape.units) / (plan.row_metrics + plan.unit_metrics)
        kept_rows = exact.kept_rows[KEPT_CAPS.index(cap)].reshape(-1)
        scores = [plan.row_metrics * int(kept_rows[index])
                  + plan.unit_metrics * int(exact.kept_pairs[index // len(plan.rows_options)])
                  - round(math.ldexp(scale * noise, UNIT_WEIGHT_BITS)) for index, noise in enumerate(noises)]
        sensitivity = (plan.row_metrics + plan.unit_metrics) << UNIT_WEIGHT_BITS
        chosen = score_choice.choose_one(scores, sensitivity, plan.contribution_epsilon, source, monotone=True)
        # One sensitivity is one unit's worth of error in every metric: per metric, a share of the scale,
        # which grows with the units: stated at their lower bound.
        units_low = max(shape.units - UNITS_LOWER_STDS * units_std(noisy), 1.0)
        shortfall = resolution / (scale * units_low / shape.units)
    else:
        chosen = _least_noise(noises, kept, plan.samples_rows)
    l0, rows = options[chosen]
    lost = _dropped(noisy, plan, l0, rows)
    dropped = lost.pairs if plan.row_metrics == 0 and plan.unit_metrics > 0 else lost.rows
    return ChosenBounds(l0, rows, round(shape.units), shape.partitions, shape.typical_units, dropped,
                        shape.typical_rows, per_partition_dropped=lost.per_partition if plan.row_metrics else 0.0,
                        partition_sizes=shape.partition_sizes, shortfall=shortfall)


def _least_noise(noises: list[float], kept: list[float], samples_rows: bool) -> int:
    """The option with the least noise; where a metric samples the rows kept (`samples_rows`), the one
    that keeps the most rows among those within NOISE_SLACK of the least noise. A mean's noise over the
    rows kept is all but flat in L∞ while the units have that many rows, and its sampling error, which
    needs the column's spread to weigh, falls as 1/√(rows kept): a near tie goes to more rows, at a cost
    of at most NOISE_SLACK where the noise is all of the error."""
    least = int(np.argmin(noises))
    if not samples_rows:
        return least
    near = [least, *(i for i, noise in enumerate(noises) if noise <= noises[least] * (1 + NOISE_SLACK))]
    return max(near, key=lambda i: (kept[i], -noises[i]))


def _row_cap(noisy: NoisyShape, units: float, shortfall: float) -> tuple[int, float]:
    """The largest of KEPT_CAPS whose weight, Σ_units min(R, C)/C from the visible unit rows histogram,
    keeps the choice's `shortfall` (in units) within KEPT_CAP_RESOLUTION of it (else 1), and that
    weight (at least 1)."""
    counts = _visible(noisy.unit_rows, noisy.scale)
    rows = _midpoints(UNIT_ROWS_CANDIDATES)
    seen = max(float(counts.sum()), 1.0)
    needed = shortfall / KEPT_CAP_RESOLUTION
    cap, weight = KEPT_CAPS[0], units
    for candidate in KEPT_CAPS[1:]:
        candidate_weight = float((counts * np.minimum(rows, candidate)).sum()) / candidate / seen * units
        if candidate_weight < needed:
            break
        cap, weight = candidate, candidate_weight
    return cap, max(weight, 1.0)


@dataclass(frozen=True)
class _Dropped:
    """Estimated shares the bounds drop: of the rows, of the units' pairs, and of the rows by L∞ alone."""

    rows: float
    pairs: float
    per_partition: float


def _dropped(noisy: NoisyShape, plan: BoundChoicePlan, l0: int, rows: int) -> _Dropped:
    """What bounds (L0, L∞) drop, from the visible cells of the noisy histograms of partitions per unit
    and of a picked pair's rows (post-processing). A unit with n partitions is taken to have n pairs
    whose rows are independent draws from the picked pairs' distribution; the cross-partition bounding
    keeps its L0 with the most rows, the largest of the n draws (`_kept_rows`)."""
    partitions = _visible(noisy.partitions, noisy.scale)
    n = _midpoints(plan.l0_candidates)
    pairs = _share(float((partitions * (n - np.minimum(n, l0))).sum()), float((partitions * n).sum()))
    pair_rows = _visible(noisy.rows, noisy.scale)
    r = _midpoints(plan.rows_candidates)
    probabilities = pair_rows / max(float(pair_rows.sum()), 1.0)
    total = float((partitions * n).sum() * (probabilities * r).sum())
    kept = 0.0
    for weight, size in zip(partitions, n, strict=True):
        if weight <= 0:
            continue
        # A bin's middle may fall between two integers (3.5 for (2, 4]): that share of the next one.
        low = int(size)
        part = float(size) - low
        expected = (1 - part) * _kept_rows(low, l0, rows, probabilities, r)
        if part:
            expected += part * _kept_rows(low + 1, l0, rows, probabilities, r)
        kept += float(weight) * expected
    per_partition = float((partitions * n).sum() * (probabilities * (r - np.minimum(r, rows))).sum())
    return _Dropped(_share(total - kept, total), pairs, _share(per_partition, total))


def _kept_rows(n: int, l0: int, rows: int, probabilities: np.ndarray, values: np.ndarray) -> float:
    """The expected rows kept of a unit with `n` pairs, their rows independent draws from `values` with
    `probabilities`, where the L0 pairs with the most rows keep at most L∞ each: Σ_{i ≤ min(L0, n)}
    E[min(X_(i), L∞)], X_(i) the i-th largest draw. For a nondecreasing g with g(0) = 0,
    E[g(X_(i))] = Σ_j (g(v_j) − g(v_{j−1})) · P(X_(i) ≥ v_j), and X_(i) ≥ v_j where at least i of
    the n draws are: a binomial tail."""
    # Imported here: the commands that read no data (explain-budget plans `auto` bounds) start without scipy.
    from scipy.stats import binom

    at_least = np.cumsum(probabilities[::-1])[::-1]  # P(X ≥ v_j)
    steps = np.diff(np.minimum(np.concatenate(([0.0], values)), rows))
    ranks = np.arange(min(l0, n))[:, None]
    return float((binom.sf(ranks, n, np.clip(at_least, 0.0, 1.0)[None, :]) * steps[None, :]).sum())


def choose_value_bounds(exact: ContributionProfile, plan: BoundChoicePlan, units: float, source: RandomSource
                        ) -> tuple[ChosenValues, ...]:
    """The value bounds of each metric with `bounds: auto`: per column, its DP quantiles at levels ℓ
    and 1 − ℓ (module docstring, step 3), drawn once and shared by the column's metrics."""
    resolution = 2 * score_choice.shortfall(plan.quantile_epsilon, VALUE_CELLS) / max(units, 1.0)
    tail = min(max(VALUE_TAIL, resolution), VALUE_TAIL_LIMIT)
    ranges = {}
    for index, column in enumerate(plan.value_columns):
        weights = exact.values[index]
        lower_level, upper_level = _column_levels([c for c in plan.values if c.column == column], tail)
        low = _quantile_cell(weights, lower_level, plan.quantile_epsilon, source)
        high = _quantile_cell(weights, upper_level, plan.quantile_epsilon, source)
        low, high = min(low, high), max(low, high)
        lower, upper = float(VALUE_LOWER[low]), float(VALUE_UPPER[high])
        ranges[column] = (lower, upper) if lower < upper else (lower, lower + 1.0)  # the zero cell alone
    chosen = []
    for choice in plan.values:
        lower, upper = ranges[choice.column]
        if choice.aggregate == "sum":  # clamping towards 0 only shrinks a value: the bounds hold 0
            lower, upper = min(lower, 0.0), max(upper, 0.0)
        low_level, high_level = _column_levels([c for c in plan.values if c.column == choice.column], tail)
        chosen.append(ChosenValues(choice.metric, lower, upper, low_level + 1 - high_level, tail,
                                   ranges[choice.column], resolution, (low_level, high_level)))
    return tuple(chosen)


def _column_levels(choices: list[ValueChoice], tail: float) -> tuple[float, float]:
    """The levels of a column's two quantiles: `tail` and 1 − `tail`, or, where every metric on it is a
    quantile, a quarter of the way from its lowest and highest levels to the ends (clamping beyond them
    moves no quantile, and narrower bounds make finer ones), no further out than `tail`."""
    if any(not choice.levels for choice in choices):
        return tail, 1 - tail
    lowest, highest = min(min(c.levels) for c in choices), max(max(c.levels) for c in choices)
    return max(tail, lowest * QUANTILE_MARGIN), min(1 - tail, 1 - (1 - highest) * QUANTILE_MARGIN)


def _quantile_cell(weights: np.ndarray, level: float, epsilon: float, source: RandomSource) -> int:
    """The value cell that holds about the `level` quantile: permute-and-flip with score −(the distance
    from ⌊level·W⌋ to the cell's span of cumulative weight [W(< cell), W(≤ cell)]), 0 for the cell that
    holds it. One unit's weight (2^UNIT_WEIGHT_BITS) moves every score by at most that. (Scoring the
    edges instead would tie every empty edge below the data: a point mass's lower quantile would land
    anywhere below it.)"""
    cumulative = [int(w) for w in np.cumsum(weights, dtype=np.int64)]
    target = math.floor(Fraction(level) * cumulative[-1])
    scores = [-max(start - target, target - end, 0) for start, end in zip([0, *cumulative[:-1]], cumulative, strict=True)]
    return score_choice.choose_one(scores, 1 << UNIT_WEIGHT_BITS, epsilon, source)


# The levels `profile_summary` states the binned distributions at.
PROFILE_LEVELS = (0.5, 0.9, 0.99)
# A percentile is stated where its noise band, in percentile points (95%), is at most this part of its
# distance to the nearer end (0 or 100): the 99th within ±0.5 points, the median within ±25.
PERCENTILE_BAND = 0.5


def profile_summary(noisy: NoisyShape, chosen: ChosenBounds, plan: BoundChoicePlan, epsilon: float
                    ) -> dict[str, object]:
    """What the noisy shape says of the data (post-processing), for `dprun profile` at `epsilon`: the
    estimated units and partitions, and per distribution its 50th, 90th and 99th percentiles, each the
    upper end of its power-of-two bin (`"> C"` above the largest candidate C) with its noise band in
    percentile points, or, where the band is too wide to tell, the ε that would tell."""
    shape = _shape(noisy, plan)
    per_partition = [2**i * shape.per_unit for i in range(len(SIZE_CANDIDATES))]
    t = noisy.scale
    total_std = units_std(noisy)
    return {
        "units_estimate": round(shape.units),
        # Public (known), or counted where their size bins stand out of the noise (None: none does).
        "partitions_estimate": shape.partitions or None,
        "partitions_per_unit": _percentiles(noisy.partitions, t, plan.l0_candidates, shape.units, total_std, epsilon),
        "rows_per_unit": _percentiles(noisy.unit_rows, t, UNIT_ROWS_CANDIDATES, shape.units, total_std, epsilon),
        "rows_per_unit_and_partition": _percentiles(noisy.rows, t, plan.rows_candidates, shape.units, total_std,
                                                    epsilon),
        "units_per_partition": None if noisy.sizes is None else _percentiles(
            noisy.sizes, t, tuple(round(edge, 1) for edge in per_partition), max(float(noisy.sizes.sum()), 1.0),
            t * math.sqrt(2.0 * noisy.sizes.size), epsilon),
        "values": {value.metric: _value_range(value, epsilon) for value in chosen.values},
    }


def _percentiles(noisy: np.ndarray, scale: float, edges: tuple[float, ...], total: float, total_std: float,
                 epsilon: float) -> dict[str, dict[str, object]]:
    """Per level, the upper edge of the first bin whose noisy cumulative count reaches it and its band:
    ±2 stds, in percentile points, of that cumulative count less the level times the noisy `total`
    (std `total_std`); or `cannot_tell` and the ε at which the band would be narrow enough (it scales
    as 1/ε)."""
    cumulative = np.cumsum(noisy.astype(np.float64))
    out: dict[str, dict[str, object]] = {}
    for level in PROFILE_LEVELS:
        name = f"p{round(level * 100)}"
        index = min(int(np.searchsorted(cumulative, level * total)), len(edges))
        variance = 2 * scale**2 * (min(index, noisy.size - 1) + 1) + (level * total_std) ** 2
        band = 100 * 2 * math.sqrt(variance) / total
        limit = 100 * PERCENTILE_BAND * min(level, 1 - level)
        if band > limit:
            out[name] = {"cannot_tell": True, "epsilon_needed": epsilon * band / limit}
        else:
            out[name] = {"at_most": edges[index] if index < len(edges) else f"> {edges[-1]:g}", "band": band}
    return out


def _value_range(value: ChosenValues, epsilon: float) -> dict[str, object]:
    """A column's two DP quantiles, at their levels, with their rank error (95%) in percentile points; or
    `cannot_tell` and the ε that would."""
    if not value.seen_enough:
        return {"cannot_tell": True, "epsilon_needed": epsilon * value.budget_factor}
    low, high = (f"p{100 * level:.3g}" for level in value.levels)
    return {low: value.column_range[0], high: value.column_range[1], "band": 100 * value.resolution / 2}

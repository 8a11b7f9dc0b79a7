"""Contribution and value bounds chosen from the data (`auto`), with differential privacy.

One mechanism, then a choice made from its output alone (post-processing):

1. **Histograms** (`noisy_profile`). Every privacy unit lands in exactly one cell of the
   *contribution* grid: its number of partitions n (the L0 axis) and the rows r of one of its
   (unit, partition) pairs, picked by a keyed hash of the pair, so uniformly at random (the
   L∞ axis). The *size* histogram counts the partitions by the number of units that picked
   them. All axes are binned on powers of two: bin j holds the values in (2^(j-1), 2^j],
   bin 0 the value 1, and the last bin everything above the largest candidate. Adding or
   removing one unit changes one contribution cell by 1 and moves one partition to the next
   size bin (two size cells by 1). Per column with `bounds: auto`, a *value* histogram on a
   signed power-of-two grid (`value_cells`) holds each unit's rows spread over their cells,
   weighed so that a unit's weights add up to at most one count (2^16 in integer weights,
   `unit_value_weights`): one unit moves it by at most one count. The whole vector has L1
   sensitivity 3 + k (k value columns): discrete Laplace noise of scale (3 + k)/ε counts on
   every cell (2^16 times that on the integer weights), the empty ones included, is ε-DP
   ([CKS20]; add/remove neighbours).
2. **The choice** (`choose_bounds`), for each candidate pair (L0, L∞) on the grids
   (powers of two), of the estimated mean relative error of the query's metrics over the
   partitions that matter, summed over the metrics: the share of rows (for counts and
   sums) or of units (for unit counts) the bounds drop, plus each metric's noise standard
   deviation at those bounds over its value, averaged over those partitions (the caller's
   `relative_noise`, given the partitions' harmonic mean size; where no size bin stands
   out of the noise, the known partitions' mean size, pairs / partitions, or for private
   partitions the smallest size that matters). A unit in cell (i, j)
   stands for n_i partitions of r_j rows each (the bins' midpoints), so it loses
   n·r − min(n, L0)·min(r, L∞) rows; picking one pair per unit at random keeps the estimate
   unbiased for the rows of all pairs. A partition picked by k units holds about k·n̄ units,
   n̄ the mean partitions per unit (a unit in more partitions is in more partitions' units
   and picks each with 1/n). The partitions that matter are those with at least
   `min_units` (a private selection's 50% threshold; 1 for public partitions): a private
   selection drops the others whatever the bounds. Means and quantiles are taken as
   unbiased by the bounds: only their noise counts. Cells whose noisy count is below what
   noise alone reaches in one run of 10^6 (all cells together) count as empty: a noisy empty
   cell at the top of the grid would otherwise stand for many dropped rows.

3. **Value bounds** (`choose_value_bounds`), once (L0, L∞) is chosen: for a sum or a mean, the
   pair (lower, upper) among 0 and ± every power of two of the grid with the smallest share of
   the values' magnitude clamping removes (each cell at its middle value) plus the noise std
   of the metric's noisy sum at those bounds over its value in the typical partition; for a
   quantile, the edges of the lowest and highest cells above the floor (its answers lie among
   the values, and a wider range only coarsens them).

Why histograms and a post-processed choice rather than the exponential mechanism over the
candidates: the error score of a candidate changes by up to the largest candidate when one
unit is added (its dropped rows), so its sensitivity is that large, while the histograms'
is 3. The grids are fixed before any data is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dprun.mechanisms.sampling import MAX_SCALE, RandomSource, discrete_laplace

# Candidates for max_partitions_contributed and max_contributions_per_partition: powers of two.
L0_CANDIDATES: tuple[int, ...] = tuple(2**i for i in range(8))  # 1 … 128
ROWS_CANDIDATES: tuple[int, ...] = tuple(2**i for i in range(9))  # 1 … 256
# The default fraction of a query's ε spent choosing its `auto` bounds.
DEFAULT_SHARE = 0.1
# Partition sizes, in units that picked a pair in them: 1 … 2^26, and above.
SIZE_CANDIDATES: tuple[int, ...] = tuple(2**i for i in range(27))
# Adding or removing a unit moves one contribution cell by 1 and one partition between two size bins.
L1_SENSITIVITY = 3
# All empty cells together reach the floor by noise alone with at most this probability: a
# phantom cell of units with more partitions or rows than any real one would move the choice.
EMPTY_CELL_FALSE_ALARM = 1e-6
# Value bins, per sign: magnitudes in (2^(k-1), 2^k] for k = VALUE_MIN_EXPONENT … VALUE_MAX_EXPONENT,
# one bin above 2^VALUE_MAX_EXPONENT, and one "zero" bin for |v| ≤ 2^(VALUE_MIN_EXPONENT - 1) shared by
# both signs. Cell ZERO_CELL ± p holds the values of sign ± at position p (1 … VALUE_EXPONENTS, then above).
VALUE_MIN_EXPONENT = -20
VALUE_MAX_EXPONENT = 40
VALUE_EXPONENTS = VALUE_MAX_EXPONENT - VALUE_MIN_EXPONENT + 1
ZERO_CELL = VALUE_EXPONENTS + 1
VALUE_CELLS = 2 * ZERO_CELL + 1
# A unit's weight, spread over the bins of its values, is 2^VALUE_WEIGHT_BITS in all (each bin's part rounded down).
VALUE_WEIGHT_BITS = 16


@dataclass(frozen=True)
class BoundChoicePlan:
    """How a query's `auto` contribution bounds are chosen: the budget, the grids, the fixed bounds.

    `l0` / `rows`: the bound the spec fixes, or None where it says `auto`. `partitions`:
    the number of partitions when it is public (public keys, or 1 without group_by), else
    None (estimated from the data). `row_metrics` / `unit_metrics`: how many of the
    query's metrics lose what the bounds drop, counted in rows (count, sum) or in units
    (privacy_id_count).
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

    @property
    def value_columns(self) -> tuple[str, ...]:
        """The columns profiled for value bounds, one histogram each, in a fixed order."""
        return tuple(dict.fromkeys(choice.column for choice in self.values))

    @property
    def scale(self) -> float:
        """The discrete Laplace scale t of every contribution and size cell (a value cell's is t · 2^VALUE_WEIGHT_BITS
        in its weight units: one unit's whole weight is worth one count)."""
        return (L1_SENSITIVITY + len(self.value_columns)) / self.epsilon

    def sampler_problem(self, advice: str) -> str | None:
        """Why the histograms' noise is beyond the samplers' range (MAX_SCALE), or None: checked when
        the plan is made, before any row is read, so that a tiny ε never fails after the data's pass.
        (`noisy_profile` draws the value cells' noise, t · 2^VALUE_WEIGHT_BITS, in every case.)"""
        largest = self.scale * 2**VALUE_WEIGHT_BITS
        if math.isfinite(largest) and largest <= MAX_SCALE:
            return None
        return (f"ε = {self.epsilon:.3g} for choosing the auto bounds is too small: the histograms' noise would be out "
                f"of the samplers' range; {advice}")

    @property
    def shape(self) -> tuple[int, int]:
        """Cells of the contribution histogram: one bin per candidate plus one above the largest, per axis."""
        return len(self.l0_candidates) + 1, len(self.rows_candidates) + 1

    @property
    def cells(self) -> int:
        """Every noisy number: the contribution cells, the size cells and the value cells."""
        return self.shape[0] * self.shape[1] + len(SIZE_CANDIDATES) + 1 + len(self.value_columns) * VALUE_CELLS


@dataclass(frozen=True)
class ValueChoice:
    """A metric whose `bounds` are `auto`: its name, its column, and the noisy sum its error is judged
    by (`sum`, `centered_sum`; None for quantiles, whose bounds cover the values instead)."""

    metric: str
    column: str
    aggregate: str | None


@dataclass(frozen=True)
class ContributionProfile:
    """The exact histograms (private): units per (partitions bin, rows bin); partitions per bin of the
    number of units that picked them."""

    cells: np.ndarray  # int64, shape BoundChoicePlan.shape
    sizes: np.ndarray  # int64, len(SIZE_CANDIDATES) + 1
    # int64, (value columns, VALUE_CELLS): per value bin, the units' weights (2^VALUE_WEIGHT_BITS per unit)
    values: np.ndarray = field(default_factory=lambda: np.zeros((0, VALUE_CELLS), dtype=np.int64))


@dataclass(frozen=True)
class ChosenBounds:
    """The bounds chosen, and the DP figures they were chosen from (safe to publish)."""

    l0: int
    rows: int
    units: int  # noisy number of units: the sum of the cells above the empty-cell floor
    partitions: int  # the number of partitions: public, or the noisy count of picked ones
    typical_units: float  # the units of a typical partition that matters, where the noise was weighed
    dropped_share: float  # estimated share of rows (units, for unit counts only) the chosen bounds drop
    typical_rows: float = 0.0  # the rows of that typical partition
    values: tuple[ChosenValues, ...] = ()  # the value bounds chosen, per metric with `bounds: auto`
    # The share of rows L∞ alone drops at the chosen bounds (what Plume's second bounding cannot win back).
    per_partition_dropped: float = 0.0
    # (units of a partition, partitions of that size) per size bin above the noise floor.
    partition_sizes: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class ChosenValues:
    """A metric's chosen value bounds and the estimated share of its values' magnitude they clip (DP)."""

    metric: str
    lower: float
    upper: float
    clipped_share: float


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


def noisy_profile(profile: ContributionProfile, plan: BoundChoicePlan, source: RandomSource
                  ) -> ContributionProfile:
    """The ε-DP release: every cell of both histograms with discrete Laplace noise of scale 3/ε."""
    noise = discrete_laplace(source, plan.scale, plan.shape[0] * plan.shape[1] + len(SIZE_CANDIDATES) + 1)
    split = profile.cells.size
    values = profile.values + discrete_laplace(source, plan.scale * 2**VALUE_WEIGHT_BITS, profile.values.size
                                               ).reshape(profile.values.shape)
    return ContributionProfile(profile.cells + noise[:split].reshape(plan.shape), profile.sizes + noise[split:], values)


def empty_cell_floor(plan: BoundChoicePlan) -> float:
    """The noisy count below which a cell is taken as empty.

    P(noise ≥ k) ≤ e^{-(k-1)/t} for discrete Laplace of scale t; over all cells, k with
    cells · e^{-(k-1)/t} = EMPTY_CELL_FALSE_ALARM.
    """
    return 1.0 + plan.scale * math.log(plan.cells / EMPTY_CELL_FALSE_ALARM)




def value_cells(values: np.ndarray) -> np.ndarray:
    """The value cell of each finite float64 value, exactly: the smallest k with |v| ≤ 2^k is frexp's
    exponent, less one where |v| is itself a power of two (mantissa one half)."""
    magnitude = np.abs(values)
    mantissa, exponent = np.frexp(magnitude)
    smallest_k = exponent - (mantissa == 0.5)
    position = np.clip(smallest_k - VALUE_MIN_EXPONENT + 1, 0, VALUE_EXPONENTS + 1)
    position = np.where(magnitude == 0, 0, position)
    return ZERO_CELL + np.sign(values).astype(np.int64) * position


def unit_value_weights(unit: np.ndarray, cell: np.ndarray) -> np.ndarray:
    """The exact value histogram: each unit's rows' cells, weighted so that a unit's weights add up
    to at most 2^VALUE_WEIGHT_BITS (its share of rows in a cell, times that, rounded down).

    `unit`: any integer label of each row's unit; `cell`: the row's value cell. Rounding down
    keeps one unit's whole weight within one count's worth: the L1 sensitivity of the histogram."""
    # (unit, cell) as one int64, the units numbered densely first (labels may use all 64 bits).
    dense = np.unique(unit, return_inverse=True)[1].reshape(-1).astype(np.int64)
    pairs, rows = np.unique(dense * VALUE_CELLS + cell, return_counts=True)
    units, cells = np.divmod(pairs, VALUE_CELLS)
    starts = np.flatnonzero(np.diff(units, prepend=-1) != 0)
    per_unit = np.repeat(np.add.reduceat(rows, starts), np.diff(np.append(starts, rows.size)))
    weights = (rows << VALUE_WEIGHT_BITS) // per_unit
    out = np.zeros(VALUE_CELLS, dtype=np.int64)
    np.add.at(out, cells, weights)
    return out


def _value_edges() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per value cell, its lower and upper edges and a typical value: the middle of its bin; 0 for
    the zero bin; for the bins above the largest magnitude, twice it."""
    magnitudes = [math.ldexp(1.0, k) for k in range(VALUE_MIN_EXPONENT, VALUE_MAX_EXPONENT + 1)]
    top = magnitudes[-1]
    low = np.array([0.0, *(m / 2 for m in magnitudes), top])
    high = np.array([0.0, *magnitudes, 2 * top])
    middle = np.array([0.0, *(0.75 * m for m in magnitudes), 2 * top])
    lower = np.concatenate([-high[:0:-1], low])
    upper = np.concatenate([-low[:0:-1], high])
    return lower, upper, np.concatenate([-middle[:0:-1], middle])


VALUE_LOWER, VALUE_UPPER, VALUE_MIDDLE = _value_edges()
# Candidate value bounds: 0 and ± every power of two of the grid, in increasing magnitude (ties go to smaller bounds).
BOUND_CANDIDATES: np.ndarray = np.array(
    [0.0, *(s * math.ldexp(1.0, k) for k in range(VALUE_MIN_EXPONENT, VALUE_MAX_EXPONENT + 1) for s in (1, -1))])

# value_noise(metric, lower, upper): the noise std of the metric's noisy sum (ValueChoice.aggregate)
# at value bounds [lower, upper], given as arrays that broadcast.
ValueNoise = Callable[[str, np.ndarray, np.ndarray], np.ndarray]


def choose_value_bounds(noisy: ContributionProfile, plan: BoundChoicePlan, typical_rows: float,
                        value_noise: ValueNoise) -> tuple[ChosenValues, ...]:
    """The value bounds of each metric with `bounds: auto`, from the noisy value histograms alone.

    Sums and means: the candidate pair (lower, upper) with the smallest share of the values'
    magnitude clipped plus the noise std at those bounds over the metric's value in a typical
    partition (`typical_rows` rows of the mean magnitude). Quantiles: the edges of the lowest
    and highest bins that stand out of the noise (their answers lie among the values; a wider
    range only coarsens them). Nothing stands out: [0, 1]."""
    chosen = []
    for choice in plan.values:
        weights = _value_counts(noisy.values[plan.value_columns.index(choice.column)], plan)
        mass = float((weights * np.abs(VALUE_MIDDLE)).sum())
        if weights.sum() <= 0 or (mass <= 0 and choice.aggregate is not None):
            chosen.append(ChosenValues(choice.metric, 0.0, 1.0, 0.0))
        elif choice.aggregate is None:
            chosen.append(_covering(weights, choice.metric))
        else:
            chosen.append(_least_error(weights, mass, choice, typical_rows * mass / float(weights.sum()), value_noise))
    return tuple(chosen)


def _value_counts(weights: np.ndarray, plan: BoundChoicePlan) -> np.ndarray:
    """A noisy value histogram in units' worth (counts), its cells below the empty-cell floor taken as empty."""
    counts = weights / 2**VALUE_WEIGHT_BITS
    return np.where(counts >= empty_cell_floor(plan), counts, 0.0)


def _clipped(weights: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """The weighted magnitude clamping to [lower, upper] removes from the bins' typical values."""
    below = (weights * np.maximum(lower[:, None] - VALUE_MIDDLE, 0.0)).sum(axis=1)
    above = (weights * np.maximum(VALUE_MIDDLE - upper[:, None], 0.0)).sum(axis=1)
    return below[:, None] + above[None, :]


def _least_error(weights: np.ndarray, mass: float, choice: ValueChoice, typical_value: float,
                 value_noise: ValueNoise) -> ChosenValues:
    lower, upper = BOUND_CANDIDATES, BOUND_CANDIDATES
    clipped = _clipped(weights, lower, upper) / mass
    error = clipped + value_noise(choice.metric, lower[:, None], upper[None, :]) / typical_value
    error = np.where(lower[:, None] < upper[None, :], error, np.inf)
    i, j = np.unravel_index(int(np.argmin(error)), error.shape)
    return ChosenValues(choice.metric, float(lower[i]), float(upper[j]), float(clipped[i, j]))


def _covering(weights: np.ndarray, metric: str) -> ChosenValues:
    present = np.flatnonzero(weights > 0)
    lower, upper = float(VALUE_LOWER[present[0]]), float(VALUE_UPPER[present[-1]])
    if upper <= lower:  # only the zero bin
        upper = lower + 1.0
    return ChosenValues(metric, lower, upper, 0.0)


# relative_noise(l0, rows, rows per partition, units per partition): the query's metrics' noise
# standard deviations at those bounds, each relative to its value in a partition of that size, summed.
RelativeNoise = Callable[[int, int, float, float], float]


def choose_bounds(noisy: ContributionProfile, plan: BoundChoicePlan, relative_noise: RelativeNoise) -> ChosenBounds:
    """The candidate (L0, L∞) with the smallest estimated mean relative error of the metrics over the
    partitions that matter: shares of rows and units dropped, plus `relative_noise` at those partitions'
    harmonic mean size. Ties go to the smaller bounds. Post-processing of the noisy histograms only.
    """
    floor = empty_cell_floor(plan)
    counts = np.where(noisy.cells >= floor, noisy.cells, 0).astype(np.float64)
    sizes = np.where(noisy.sizes >= floor, noisy.sizes, 0).astype(np.float64)
    n = _midpoints(plan.l0_candidates)[:, None]
    r = _midpoints(plan.rows_candidates)[None, :]
    units = float(counts.sum())
    pairs = float((counts * n).sum())
    total_rows = float((counts * n * r).sum())
    # A partition picked by k units holds about k · (pairs / units) units, and rows / pairs rows per unit.
    partition_units = _midpoints(SIZE_CANDIDATES) * _share(pairs, units)
    mattering = sizes * (partition_units >= plan.min_units)
    partitions = plan.partitions if plan.partitions is not None else int(sizes.sum())
    if mattering.sum() > 0:
        typical_units = float(mattering.sum() / (mattering / partition_units).sum())  # the harmonic mean
    elif plan.partitions is not None:
        # Too few partitions for their sizes to stand out of the noise: the known partitions' mean size.
        typical_units = max(_share(pairs, plan.partitions), plan.min_units)
    else:
        typical_units = plan.min_units
    typical_rows = typical_units * max(_share(total_rows, pairs), 1.0)
    l0_options = plan.l0_candidates if plan.l0 is None else (plan.l0,)
    rows_options = plan.rows_candidates if plan.rows is None else (plan.rows,)
    if plan.row_metrics == 0 and plan.rows is None:
        rows_options = (1,)  # nothing the query releases depends on rows per partition: the least noise
    best: tuple[float, int, int, float] | None = None
    for l0 in l0_options:
        for rows in rows_options:
            dropped_rows = _share(float((counts * (n * r - np.minimum(n, l0) * np.minimum(r, rows))).sum()), total_rows)
            dropped_units = _share(float((counts * (n - np.minimum(n, l0))).sum()), pairs)
            error = plan.row_metrics * dropped_rows + plan.unit_metrics * dropped_units + relative_noise(
                l0, rows, typical_rows, typical_units)
            if best is None or error < best[0]:
                best = (error, l0, rows, dropped_units if plan.row_metrics == 0 else dropped_rows)
    assert best is not None
    _, l0, rows, dropped = best
    per_partition = _share(float((counts * (n * r - n * np.minimum(r, rows))).sum()), total_rows)
    found = tuple((float(size), float(count)) for size, count in zip(partition_units, sizes, strict=True) if count > 0)
    return ChosenBounds(l0, rows, int(units), partitions, typical_units, dropped, typical_rows,
                        per_partition_dropped=per_partition if plan.row_metrics else 0.0, partition_sizes=found)


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _midpoints(candidates: tuple[int, ...]) -> np.ndarray:
    """A bin's typical value: 1 for bin 0, the middle of (2^(j-1), 2^j] for bin j, and twice
    the largest candidate for the bin above it (its values are unknown; at least that many
    rows are dropped by any candidate)."""
    middles = [1.0] + [(2.0 ** (j - 1) + 1 + 2.0**j) / 2 for j in range(1, len(candidates))]
    return np.array([*middles, 2.0 * candidates[-1]])


# The levels `profile_summary` states the binned distributions at.
PROFILE_LEVELS = (0.5, 0.9, 0.99)
# The levels the value distributions are stated at: both tails matter to value bounds.
VALUE_LEVELS = (0.01, 0.5, 0.99)


def profile_summary(noisy: ContributionProfile, plan: BoundChoicePlan) -> dict[str, object]:
    """What the noisy histograms say of the data's contribution shape (post-processing): estimated
    units and partitions, and per distribution its 50th, 90th and 99th percentiles, each stated as
    the upper end of its power-of-two bin (`"> C"` above the largest candidate C)."""
    floor = empty_cell_floor(plan)
    counts = np.where(noisy.cells >= floor, noisy.cells, 0).astype(np.float64)
    sizes = np.where(noisy.sizes >= floor, noisy.sizes, 0).astype(np.float64)
    n = _midpoints(plan.l0_candidates)
    units = float(counts.sum())
    pairs = float((counts * n[:, None]).sum())
    per_partition = [2**i * _share(pairs, units) for i in range(len(SIZE_CANDIDATES))]
    counted = plan.partitions if plan.partitions is not None else int(sizes.sum())
    return {
        "units_estimate": int(units),
        # Public (known), or counted where their size bins stand out of the noise (None: none does).
        "partitions_estimate": counted or None,
        "partitions_per_unit": _binned_quantiles(counts.sum(axis=1), plan.l0_candidates),
        # Each unit's picked pair stands for its n pairs: weigh its rows bin by n.
        "rows_per_unit_and_partition": _binned_quantiles((counts * n[:, None]).sum(axis=0), plan.rows_candidates),
        "units_per_partition": _binned_quantiles(sizes, tuple(round(edge, 1) for edge in per_partition)),
        # The last cell is above the largest magnitude: its values are stated as "> 2^40".
        "values": {column: _binned_quantiles(_value_counts(weights, plan), tuple(VALUE_UPPER[:-1].tolist()),
                                             VALUE_LEVELS)
                   for column, weights in zip(plan.value_columns, noisy.values)},
    }


def _binned_quantiles(weights: np.ndarray, edges: tuple[float, ...], levels: tuple[float, ...] = PROFILE_LEVELS
                      ) -> dict[str, float | str | None]:
    """Per level, the upper edge of the first bin whose cumulative weight reaches it (`"> C"` in the bin
    above the last edge C); None without weight."""
    total = float(weights.sum())
    cumulative = np.cumsum(weights)
    out: dict[str, float | str | None] = {}
    for level in levels:
        name = f"p{round(level * 100)}"
        if total <= 0:
            out[name] = None
            continue
        index = int(np.searchsorted(cumulative, level * total))
        out[name] = edges[index] if index < len(edges) else f"> {edges[-1]:g}"
    return out

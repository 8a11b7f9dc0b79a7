"""DP quantiles (quantile, median, min, max) from a noisy quantile tree.

[D20 §4.2.3] (Table 4.2) defines ANON_NTILE, ANON_MEDIAN, ANON_MIN and ANON_MAX through one
percentile aggregate whose bounds only limit the search space. [D20 §4.2.3] implements it as
a noisy binary search over all values kept in memory. [DPP21] says percentiles should
come from a library. dprun uses the hierarchical histogram ("quantile tree") approach
instead. It is one streaming pass of integer sums and uses no memory per value:

* Qardaji, Yang, Li. "Understanding hierarchical methods for differentially private
  histograms." PVLDB 6(14), 2013: noisy counts on a B-ary tree over the domain, and why
  a branching factor around 16 is a good choice for range and rank queries.
* Cormode, Kulkarni, Srivastava. "Answering range queries under local differential
  privacy." PVLDB 12(10), 2019: the same tree and its variance analysis.
* Google's differential-privacy library, `QuantileTree` (cc/algorithms/quantile-tree.h and
  common_docs/Differentially_Private_Quantile_Trees.pdf). The defaults are the same:
  B = 16, D = 4, L0·D noisy coordinates with L∞ = m. Its descent rescales the rank to
  the children's noisy total at every level, and this module does the same. Google also
  ignores children below 0.5% of their siblings' total (kAlpha). This module ignores
  children whose noisy count is below NOISE_FLOOR noise standard deviations instead.

Tree. Clamp the values of one column in one partition to [lower, upper] and split that
range into B**D equal-width leaves (`TreeShape`). Level l = 1..D has B**l nodes. Node j
of level l covers leaves [j·B**(D-l), (j+1)·B**(D-l)).

Contributions. A privacy unit with n present values in a partition gives each value the
weight w = floor(min(n, m)·2**W / n) in units of 2**-W (W = WEIGHT_BITS, m = the
per-partition contribution bound). On every level, one unit's total weight in one
partition is n·w ≤ min(n, m)·2**W ≤ m·2**W, exactly, in integers. This plays the role of
sampling m values (it is their expected histogram) and has the same sensitivity, just as
the engine scales partial sums (see `dprun.engines.polars_engine`). A node's count is the
exact integer sum of the weights of its leaves.

Privacy. In principle every node of every level gets independent noise from one
`NoisePlan`. The planner calibrates that plan with one "coordinate" per (partition,
level): L0 = max_partitions·D coordinates, each with L∞ = m·2**W (the unit's L1, hence also
its L2, over the nodes of one level). Laplace then needs L1 = L0·D·m·2**W in total, and
Gaussian needs L2 = √(L0·D)·m·2**W. The answers are post-processing of that noisy tree.
Only the nodes the descent looks at are drawn. The noise of different nodes is
independent, and which nodes are looked at depends only on noisy values already drawn.
Drawing lazily therefore gives exactly the output distribution of drawing the whole
tree. Every drawn value is reused by all levels q of the same call, so several quantiles
of one column read one noisy tree. Call `answer_quantiles` ONCE per (column, bounds) with
all its levels: a second call draws fresh noise and would spend the budget again.

Grid caveat for the planner: `add_noise` rounds every node count to the noise grid. When
that grid is coarser than 2**-W (only if the noise scale exceeds about 2**20 counts, i.e.
an extremely small ε), the rounding of the several nodes one unit touches on a level can
add up to one grid unit per node, not the single unit `grid_sensitivity` allows for.

Answering q (vectorised over partitions × levels, one level of the tree at a time):

0. Every noisy count below NOISE_FLOOR·σ (σ the noise std of one node) is read as 0. An
   empty node's noise alone would otherwise add E[max(0, noise)] = 0.35σ (Laplace) of
   spurious weight, and the empty siblings of a narrow peak inside wide bounds move every
   target by their sum: a 90th percentile drifts towards the upper bound. Above 2σ an
   empty node survives with probability 3% (Laplace; 2.3% Gaussian) and adds 0.08σ
   (0.054σ) on average. Real nodes below 2σ are dropped; they are within the noise.
1. Level 1. Clip the B noisy children of the root at 0 and call their sum T. If T = 0,
   the partition gets the midpoint of [lower, upper]. Otherwise the rank target is
   r = clip(q·T, ε_r, T − ε_r) with ε_r = min(1/2, T/2): half of one privacy unit's
   weight (one count). q = 0 (min) then aims at the middle of the first unit's weight
   and q = 1 (max) at the middle of the last one. Noise of less than half a count in
   an empty node at either end cannot capture the min or max.
2. At each level, take the B children of the current node, clip their noisy counts at
   0 and take the cumulative sum. Pick the first child whose cumulative sum is ≥ r.
   Since r > 0, the chosen child has a positive count. The new position is
   f = (r − preceding cumulative sum) / child count, in (0, 1]. On the next level the
   target is r = f·S, where S is the sum of that level's clipped children. Like
   Google's QuantileTree, the rank is rescaled to the children's noisy total instead
   of carrying the absolute rank down. The noisy totals of two levels disagree, and
   rescaling keeps each target inside its node. That cuts the error variance to a third
   (see `rank_error_std`). If all children of a node are ≤ 0 (S = 0), the node is treated
   as uniform: child floor(f·B), position f·B − child.
3. At a leaf, interpolate linearly: lower + (leaf + f)·leaf width, clamped to the bounds.
4. Post-processing: in each partition, sort the answers over the sorted levels. The
   descent is already monotone in q, because every level reads the same noisy counts.
   The sort is a guarantee against floating-point ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from dprun.mechanisms.noise import NoisePlan, add_noise
from dprun.mechanisms.sampling import RandomSource

WEIGHT_BITS = 20
"""Fixed-point bits of a value's weight: one privacy unit's full weight is 2**WEIGHT_BITS units."""

NOISE_FLOOR = 2.0
"""Noisy node counts below this many noise standard deviations are read as 0 (docstring, step 0)."""

MAX_LEAVES = 2**40
"""Largest branching**depth: leaf indices and per-level node keys stay exact in int64 and float64."""

# Partitions answered together. Deduplication only works within a partition, so chunks
# change nothing but peak memory: about CHUNK·len(levels)·branching floats per level.
_CHUNK_PARTITIONS = 1 << 15
# Rank margin at the ends (q = 0 and q = 1), in counts: half of one privacy unit's weight.
_END_MARGIN = 0.5


@dataclass(frozen=True)
class TreeShape:
    """The tree over [lower, upper]: `depth` levels below the root, `branching` children each."""

    lower: float
    upper: float
    branching: int = 16
    depth: int = 4

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lower) and math.isfinite(self.upper) and self.lower < self.upper):
            raise ValueError(f"quantile bounds must be finite with lower < upper, got [{self.lower}, {self.upper}]")
        if not math.isfinite(self.upper - self.lower):
            raise ValueError(f"quantile bounds [{self.lower}, {self.upper}] are too far apart for float64")
        if isinstance(self.branching, bool) or not isinstance(self.branching, int) or self.branching < 2:
            raise ValueError(f"branching must be an int >= 2, got {self.branching!r}")
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {self.depth!r}")
        if self.branching**self.depth > MAX_LEAVES:
            raise ValueError(f"branching**depth = {self.branching**self.depth} exceeds {MAX_LEAVES} leaves")

    @property
    def leaves(self) -> int:
        return self.branching**self.depth

    @property
    def leaf_width(self) -> float:
        return (self.upper - self.lower) / self.leaves

    @property
    def _scale(self) -> float:
        # One factor shared by leaf_of and leaf_expr, so both round identically.
        return self.leaves / (self.upper - self.lower)

    def leaf_of(self, values: np.ndarray) -> np.ndarray:
        """The int64 leaf index of each value after clamping to [lower, upper]; upper is in the last leaf.

        NaN has no leaf and raises ValueError (`leaf_expr` maps it to null instead).
        """
        values = np.asarray(values, dtype=np.float64)
        if np.isnan(values).any():
            raise ValueError("NaN has no leaf")
        scaled = (np.clip(values, self.lower, self.upper) - self.lower) * self._scale
        return np.clip(np.floor(scaled), 0, self.leaves - 1).astype(np.int64)

    def leaf_expr(self, column: str) -> pl.Expr:
        """`leaf_of` as a Polars expression on `column`; null and NaN give null."""
        value = pl.col(column).cast(pl.Float64).fill_nan(None)
        scaled = (value.clip(self.lower, self.upper) - self.lower) * self._scale
        return scaled.floor().cast(pl.Int64).clip(0, self.leaves - 1)


def unit_weight_expr(present: pl.Expr, max_rows: int) -> pl.Expr:
    """floor(min(n, m)·2**W / n) as Int64: the weight of each of a unit's n values in a partition.

    `present` is n, for use inside the engine's per-(unit, partition) group-by, e.g.
    `shape.leaf_expr(column).count()` (the values that get a leaf). n = 0 gives weight 0.
    Counting more values than get a leaf only lowers the weights, which is still private.
    """
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or not 1 <= max_rows < 2**42:
        raise ValueError(f"max_rows must be an int in [1, 2**42), got {max_rows!r}")
    n = present.cast(pl.Int64)
    kept = pl.min_horizontal(n, pl.lit(max_rows, dtype=pl.Int64)) * pl.lit(1 << WEIGHT_BITS, dtype=pl.Int64)
    return pl.when(n > 0).then(kept // n).otherwise(pl.lit(0, dtype=pl.Int64)).cast(pl.Int64)


def rank_error_std(shape: TreeShape, noise: NoisePlan) -> float:
    """Standard deviation, in counts (privacy units), of one answer's rank error caused by noise.

    Let σ be the noise std of one node, f_{l-1} the target's position in its level-(l−1)
    node, k the number of children left of the chosen child, and f_l the position in the
    chosen child. To first order in σ/count, the rescaled descent gives level l the rank
    error f_{l-1}·(sum of the B child noises) − (sum of the k left noises) − f_l·(noise of
    the chosen child). Its variance is σ²·[k(1 − f_{l-1})² + (f_{l-1} − f_l)² +
    (B − 1 − k)·f_{l-1}²]. Averaged over a uniformly placed target (f_{l-1} = (k + f_l)/B,
    with k and f_l uniform) this is σ²·(B − 1)/6. The levels add independently, so

        std = σ·sqrt(D·(B − 1)/6).

    For B = 16, D = 4 that is σ·√10. Carrying the absolute rank down without rescaling
    sums about D·(B − 1)/2 node noises, which is three times the variance. The worst
    placement per level is f_{l-1} = 1/2, with variance about σ²·B/4.

    Not included: the bias of empty nodes whose noise passes the noise floor
    (`rank_error_rms`); the spread of the data inside one leaf (interpolation assumes
    uniform); and the clamping to [lower, upper].
    """
    return noise.std * math.sqrt(shape.depth * (shape.branching - 1) / 6.0)


def rank_error_rms(shape: TreeShape, noise: NoisePlan) -> float:
    """`rank_error_std` combined with the bias of empty nodes whose noise passes the floor, as a root mean square.

    An empty child whose noise exceeds NOISE_FLOOR·σ keeps it as spurious weight: on average
    E[X; X > 2σ] = 0.080σ for Laplace noise (0.5·e^(−2√2)·(2 + 1/√2)·σ) and σ·φ(2) = 0.054σ for
    Gaussian, which moves the target rank by up to that much per empty sibling on every
    level. Data rarely fills every child of a node; this assumes half of the B − 1 siblings
    are empty: bias D·(B − 1)/2 times that mean. It is the planner's figure for comparing
    tree shapes with each other and with the candidate mechanism.
    """
    t = NOISE_FLOOR
    if noise.kind == "laplace":
        spurious = 0.5 * math.exp(-t * math.sqrt(2)) * (t + 1 / math.sqrt(2)) * noise.std
    else:
        spurious = math.exp(-t * t / 2) / math.sqrt(2 * math.pi) * noise.std
    bias = shape.depth * (shape.branching - 1) / 2 * spurious
    return math.hypot(rank_error_std(shape, noise), bias)


def answer_quantiles(
    leaf_weights: pl.DataFrame,
    partitions: int,
    shape: TreeShape,
    levels: list[float],
    noise: NoisePlan,
    source: RandomSource,
) -> np.ndarray:
    """The DP quantiles of one column: float64 array of shape (partitions, len(levels)).

    `leaf_weights`: columns "partition" (index 0..partitions−1), "leaf" and "weight"
    (summed weights in units of 2**-WEIGHT_BITS, integer). Repeated (partition, leaf) rows
    are added up. Partitions with no row are empty and get noise only. `noise` is the noise
    of one node count (the planner's plan for unit_exponent −WEIGHT_BITS). Every row is
    non-decreasing along the levels in ascending order. See the module docstring.
    """
    qs = np.asarray(levels, dtype=np.float64).reshape(-1)
    if np.isnan(qs).any() or (qs < 0).any() or (qs > 1).any():
        raise ValueError(f"quantile levels must lie in [0, 1], got {list(levels)}")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 0:
        raise ValueError(f"partitions must be an int >= 0, got {partitions!r}")
    if partitions * shape.leaves >= 2**62:
        raise ValueError("partitions·leaves must stay below 2**62")
    out = np.empty((partitions, qs.size), dtype=np.float64)
    if partitions == 0 or qs.size == 0:
        return out
    tables = _level_tables(leaf_weights, partitions, shape)
    for start in range(0, partitions, _CHUNK_PARTITIONS):
        stop = min(start + _CHUNK_PARTITIONS, partitions)
        out[start:stop] = _descend(tables, start, stop, shape, qs, noise, source)
    order = np.argsort(qs, kind="stable")
    out[:, order] = np.sort(out[:, order], axis=1)
    return out


@dataclass(frozen=True)
class _LevelTable:
    """Nonzero exact node counts of one level, keyed partition·B**l + node (sorted int64 keys)."""

    keys: np.ndarray
    counts: pl.Series  # int64 or Int128, aligned with keys, plus one final 0 for absent keys

    def lookup(self, keys: np.ndarray) -> pl.Series:
        index = np.searchsorted(self.keys, keys)
        found = index < self.keys.size
        found[found] = self.keys[index[found]] == keys[found]
        return self.counts.gather(np.where(found, index, self.keys.size))


def _level_tables(leaf_weights: pl.DataFrame, partitions: int, shape: TreeShape) -> list[_LevelTable]:
    """The exact counts of levels 1..D (tables[l − 1] is level l), summed from the leaves in integers.

    Sorting by (partition, leaf) is the main cost; input already in that order skips it.
    Sums are int64 when the total weight is safely below 2**63 and Int128 otherwise.
    """
    check_leaf_weights(leaf_weights, partitions, shape.leaves)
    frame = leaf_weights.select(
        key=pl.col("partition").cast(pl.Int64) * shape.leaves + pl.col("leaf").cast(pl.Int64),
        weight=pl.col("weight"),
    )
    # A float64 sum of non-negative terms is off by a factor of at most 1 + rows·2**-52, so below
    # 2**62 the exact integer sums of every level fit in int64.
    small = not frame.height or frame.select(pl.col("weight").cast(pl.Float64).sum()).item() < 2.0**62
    frame = frame.with_columns(pl.col("weight").cast(pl.Int64 if small else pl.Int128))
    if not frame["key"].is_sorted():
        frame = frame.sort("key")
    keys = frame["key"].to_numpy()
    weights: np.ndarray | pl.Series = frame["weight"].to_numpy() if small else frame["weight"]
    tables: list[_LevelTable] = []
    for level in range(shape.depth, 0, -1):
        if level < shape.depth:
            keys = keys // shape.branching
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if keys.size else np.zeros(0, np.int64)
        keys = keys[starts]
        weights = _segment_sums(weights, starts)
        if isinstance(weights, np.ndarray):
            nonzero = np.flatnonzero(weights != 0)
            counts = pl.Series(weights[nonzero], dtype=pl.Int64)
        else:
            nonzero = np.flatnonzero((weights != 0).to_numpy())
            counts = weights.gather(nonzero)
        zero = pl.Series([0], dtype=counts.dtype)
        tables.append(_LevelTable(keys[nonzero], pl.concat([counts, zero])))
    tables.reverse()
    return tables


def check_leaf_weights(leaf_weights: pl.DataFrame, partitions: int, leaves: int) -> None:
    """Raise ValueError unless `leaf_weights` has integer columns partition in [0, partitions),
    leaf in [0, leaves) and weight >= 0, none null (the input of both quantile mechanisms)."""
    missing = {"partition", "leaf", "weight"} - set(leaf_weights.columns)
    if missing:
        raise ValueError(f"leaf_weights lacks columns {sorted(missing)}")
    for name in ("partition", "leaf", "weight"):
        if not leaf_weights.schema[name].is_integer():
            raise ValueError(f"leaf_weights {name} must be integers, got {leaf_weights.schema[name]}")
    bad = leaf_weights.select(
        partition=(pl.col("partition").is_null() | (pl.col("partition") < 0)
                   | (pl.col("partition") >= partitions)).any(),
        leaf=(pl.col("leaf").is_null() | (pl.col("leaf") < 0) | (pl.col("leaf") >= leaves)).any(),
        weight=(pl.col("weight").is_null() | (pl.col("weight") < 0)).any(),
    ).row(0, named=True)
    for name, message in (("partition", f"in [0, {partitions})"), ("leaf", f"in [0, {leaves})"), ("weight", ">= 0")):
        if bad[name]:
            raise ValueError(f"every leaf_weights {name} must be non-null and {message}")


def _segment_sums(weights: np.ndarray | pl.Series, starts: np.ndarray) -> np.ndarray | pl.Series:
    """Sums of consecutive runs beginning at `starts` (int64 numpy, or an Int128 Polars series)."""
    if isinstance(weights, np.ndarray):
        return np.add.reduceat(weights, starts) if starts.size else weights[:0]
    run = np.zeros(len(weights), dtype=np.int64)
    run[starts[1:]] = 1
    grouped = pl.DataFrame({"run": np.cumsum(run), "weight": weights})
    return grouped.group_by("run", maintain_order=True).agg(pl.col("weight").sum())["weight"]


def _descend(
    tables: list[_LevelTable], start: int, stop: int, shape: TreeShape, qs: np.ndarray,
    noise: NoisePlan, source: RandomSource,
) -> np.ndarray:
    """Answers for partitions start..stop−1: all (partition, level) pairs descend together."""
    b = shape.branching
    count = stop - start
    partition = np.repeat(np.arange(start, stop, dtype=np.int64), qs.size)
    q = np.tile(qs, count)
    node = np.zeros(partition.size, dtype=np.int64)  # the current node within its level
    position = np.zeros(partition.size, dtype=np.float64)  # f: fraction of the current node's count
    empty = np.zeros(partition.size, dtype=bool)
    children = np.arange(b, dtype=np.int64)
    for level in range(1, shape.depth + 1):
        parent = partition * b ** (level - 1) + node
        groups, pair_group = np.unique(parent, return_inverse=True)
        exact = tables[level - 1].lookup((groups[:, None] * b + children).ravel())
        noisy = add_noise(exact, -WEIGHT_BITS, noise, source).reshape(groups.size, b)
        positive = np.where(noisy >= NOISE_FLOOR * noise.std, noisy, 0.0)
        clipped = positive[pair_group]
        cumulative = np.cumsum(positive, axis=1)[pair_group]
        total = cumulative[:, -1]
        if level == 1:
            empty = total <= 0
            margin = np.minimum(_END_MARGIN, total / 2)
            target = np.clip(q * total, margin, total - margin)
        else:
            target = position * total
        # First child whose cumulative count reaches the target (target > 0 skips zero children).
        child = np.minimum((cumulative < target[:, None]).sum(axis=1), b - 1)
        rows = np.arange(partition.size)
        before = np.where(child > 0, cumulative[rows, np.maximum(child - 1, 0)], 0.0)
        weight = clipped[rows, child]
        with np.errstate(divide="ignore", invalid="ignore"):
            inside = np.clip((target - before) / weight, 0.0, 1.0)
        # No positive child (only where every child is <= 0): spread the node uniformly.
        uniform = (total <= 0) | (weight <= 0)
        spread = position * b
        uniform_child = np.minimum(np.floor(spread), b - 1).astype(np.int64)
        child = np.where(uniform, uniform_child, child)
        position = np.where(uniform, np.clip(spread - uniform_child, 0.0, 1.0), inside)
        node = node * b + child
    values = shape.lower + (node + position) * shape.leaf_width
    values = np.clip(values, shape.lower, shape.upper)
    values[empty] = (shape.lower + shape.upper) / 2
    return values.reshape(count, qs.size)

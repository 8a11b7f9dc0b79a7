"""Metrics → the noisy per-partition quantities they are computed from, with their sensitivities.

A metric is released as post-processing of one or more noisy sums over the
partition ([DPP21], "Computing MEAN, VARIANCE"; [D20 §4.2.3], Table 4.2):

| metric            | noisy quantities                                      |
|-------------------|-------------------------------------------------------|
| count             | rows                                                  |
| privacy_id_count  | privacy units                                         |
| sum               | sum of clamped values                                 |
| mean              | rows with a value, sum of values centred on the mid   |
| variance, stddev  | the mean's two, plus sum of squared centred values    |
| quantile, median, min, max | weighted counts per tree node (`quantile_tree`) or per candidate slot (`quantile_candidates`) |

Metrics of one query that need the same quantity share one noisy copy of it.

Sums are accumulated in fixed point: every clamped value is rounded to an
integer number of units of 2^exponent and clipped to the integer range its
bounds allow, then summed exactly in integers. Floating-point sums can exceed
their stated sensitivity through rounding and re-ordering (Casacuberta et al.
2022, "Widespread underestimation of sensitivity in differentially private
libraries"); integer sums cannot, so the sensitivity below holds exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar

import numpy as np

from dprun.mechanisms.noise import NoiseKind, NoisePlan, calibrate
from dprun.mechanisms.quantile_tree import WEIGHT_BITS

Aggregate = Literal["privacy_units", "rows", "sum", "centered_sum", "centered_sumsq", "quantile_tree",
                    "quantile_candidates"]
QuantileMethod = Literal["tree", "candidates"]

F = TypeVar("F", float, np.ndarray)
# Units per value: the largest |value| is about 2^VALUE_BITS units, so the rounding
# error of one value is below 2^-VALUE_BITS of its range.
VALUE_BITS = 30


@dataclass(frozen=True)
class Quantity:
    """One per-partition integer sum that gets its own noise.

    `unit_exponent`: values are counted in units of 2**unit_exponent (0 for counts).
    `center`: subtracted from each clamped value before rounding (centred sums).
    `max_units`: the largest |units| one row can add after rounding and clipping.
    `linf_units`: the most one privacy unit can change this sum in one partition,
    after per-partition bounding to `max_rows` rows: the L∞ sensitivity.
    """

    id: str
    aggregate: Aggregate
    column: str | None
    lower: float | None
    upper: float | None
    center: float
    unit_exponent: int
    max_units: int
    linf_units: int
    branching: int = 0
    depth: int = 0
    whole: bool = False  # quantile_tree: one leaf per whole number (answers are rounded to it)
    candidates: int = 0  # quantile_candidates: points in the grid
    levels: tuple[float, ...] = ()  # quantile_candidates: the levels, each answered separately

    @property
    def unit(self) -> float:
        return math.ldexp(1.0, self.unit_exponent)

    @property
    def description(self) -> str:
        """The quantity in a reader's words (its `id` is the plan's key for it)."""
        column = self.column or ""
        return {
            "privacy_units": "privacy units counted",
            "rows": f"values of {column} counted" if column else "rows counted",
            "sum": f"sum of {column}", "centered_sum": f"sum of {column}",
            "centered_sumsq": f"sum of squares of {column}",
            "quantile_tree": f"quantile tree of {column}", "quantile_candidates": f"quantile candidates of {column}",
        }[self.aggregate]

    @property
    def coordinates(self) -> int:
        """Noisy values one unit can change per partition, each by up to `linf_units`: a tree's levels, else 1.

        (A candidate quantity's levels are composed by its own plan, `CandidatePlan`.)"""
        return self.depth if self.aggregate == "quantile_tree" else 1

    @property
    def is_quantile(self) -> bool:
        """Answered from per-(partition, leaf) weights rather than released as one noisy sum."""
        return self.aggregate in ("quantile_tree", "quantile_candidates")

    @property
    def is_integer_count(self) -> bool:
        return self.aggregate in ("privacy_units", "rows")


def metric_quantities(kind: str, column: str | None, bounds: tuple[float, float] | None, max_rows: int) -> list[Quantity]:
    """The noisy sums a metric other than a quantile needs, in a stable order; equal quantities have equal ids.

    Quantiles get `quantile_tree` or `quantile_candidates`, whose shape the planner chooses."""
    assert kind not in ("quantile", "median", "min", "max"), "quantiles are built by quantile_tree or _candidates"
    aggregates: dict[str, list[Aggregate]] = {
        "count": ["rows"],
        "privacy_id_count": ["privacy_units"],
        "sum": ["sum"],
        "mean": ["rows", "centered_sum"],
        "variance": ["rows", "centered_sum", "centered_sumsq"],
        "stddev": ["rows", "centered_sum", "centered_sumsq"],
    }
    return [build_quantity(a, column, bounds, max_rows) for a in aggregates[kind]]


def build_quantity(
    aggregate: Aggregate, column: str | None, bounds: tuple[float, float] | None, max_rows: int
) -> Quantity:
    """The quantity for values of `column` clamped to `bounds`, at most `max_rows` rows per unit and partition."""
    if aggregate == "privacy_units":
        return Quantity("privacy_units", "privacy_units", None, None, None, 0.0, 0, 1, 1)
    if aggregate == "rows":
        qid = f"rows({column})" if column is not None else "rows"
        return Quantity(qid, "rows", column, None, None, 0.0, 0, 1, max_rows)
    assert bounds is not None and column is not None, "value quantities need a column and bounds"
    lower, upper = bounds
    center = (lower + upper) / 2 if aggregate != "sum" else 0.0
    largest = float(value_reach(aggregate, lower, upper))
    exponent = math.frexp(largest)[1] - VALUE_BITS
    max_units = math.ceil(math.ldexp(largest, -exponent))
    return Quantity(
        id=f"{aggregate}({column} in [{lower:g}, {upper:g}])",
        aggregate=aggregate,
        column=column,
        lower=lower,
        upper=upper,
        center=center,
        unit_exponent=exponent,
        max_units=max_units,
        linf_units=max_rows * max_units,
    )


def value_reach(aggregate: Aggregate, lower: F, upper: F) -> F:
    """The largest |amount| one row adds to a value quantity with values clamped to [lower, upper]
    (before rounding to units): the sensitivity per row. Works on floats and on numpy arrays."""
    half = (upper - lower) / 2
    if aggregate == "sum":
        return np.maximum(np.abs(lower), np.abs(upper))
    return half * half if aggregate == "centered_sumsq" else half


def quantile_tree(column: str, domain: tuple[float, float], max_rows: int, branching: int, depth: int,
                  whole: bool = False) -> Quantity:
    """Node counts of a quantile tree with B^D leaves over `domain` (dprun.mechanisms.quantile_tree).

    Each unit adds weights of 2**-WEIGHT_BITS counts, at most `max_rows` counts in all, to one
    node per level: L∞ = m·2**WEIGHT_BITS units on each of the `depth` levels of a partition.
    `whole`: the domain is [a − 0.5, a − 0.5 + B^D] for whole bounds [a, b], one leaf per whole number.
    """
    lower, upper = domain
    return _weighted(f"quantile_tree({column} in [{lower:g}, {upper:g}], {branching}^{depth})", "quantile_tree",
                     column, domain, max_rows, branching=branching, depth=depth, whole=whole)


def quantile_candidates(
    column: str, bounds: tuple[float, float], max_rows: int, candidates: int, levels: tuple[float, ...]
) -> Quantity:
    """Weights per candidate slot over `bounds` (dprun.mechanisms.quantile_candidates), same weights as a tree."""
    lower, upper = bounds
    shown = ",".join(f"{level:g}" for level in levels)
    return _weighted(f"quantile_candidates({column} in [{lower:g}, {upper:g}], {candidates} candidates, q={shown})",
                     "quantile_candidates", column, bounds, max_rows, candidates=candidates, levels=levels)


def _weighted(qid: str, aggregate: Aggregate, column: str, span: tuple[float, float], max_rows: int,
              **shape: Any) -> Quantity:
    """A quantile quantity: weights of 2**-WEIGHT_BITS counts per value, at most `max_rows` counts per unit."""
    weight = 2**WEIGHT_BITS
    base = Quantity(id=qid, aggregate=aggregate, column=column, lower=span[0], upper=span[1], center=0.0,
                    unit_exponent=-WEIGHT_BITS, max_units=weight, linf_units=max_rows * weight)
    return replace(base, **shape)


def noise_for(quantity: Quantity, kind: NoiseKind, l0: int, epsilon: float, delta: float) -> NoisePlan:
    """Noise for a quantity; a quantile tree's levels count as separate partitions for L0."""
    noise = calibrate(kind, quantity.unit_exponent, quantity.linf_units, l0 * quantity.coordinates, epsilon, delta)
    if quantity.aggregate == "quantile_tree" and noise.grid_exponent > quantity.unit_exponent:
        # Rounding several nodes of one level to a coarser grid is not covered by the sensitivity.
        raise ValueError(f"the budget share of {quantity.id} is too small for a quantile tree")
    return noise

"""Noise on a power-of-two grid: calibration (planner time) and addition (run time).

Every released number is an exact integer aggregate plus integer noise, on a grid of
2**grid_exponent (Google's secure noise approach; Mironov 2012 showed that naive
floating-point Laplace noise leaks through its low bits, [D20 §4.3.3]):

* Laplace noise is the discrete Laplace P(k) ∝ exp(-|k|/t) on the grid, which is
  exactly ε-DP for an integer L1 sensitivity Δ1 with t = Δ1/ε (the geometric
  mechanism, [D20 §2.1.6]). Counts use the integer grid itself.
* Gaussian noise is the discrete Gaussian (Canonne, Kamath, Steinke 2020) on a grid
  2**-LATTICE_BITS of σ. Its σ comes from the analytic Gaussian mechanism (Balle &
  Wang 2018; [D20 §4.3.3], Theorem 16) for the grid's L2 sensitivity √L0·L∞, calibrated
  for the budget less what the lattice (GAUSSIAN_DELTA_SLACK) and the sampler's float
  acceptance step (GAUSSIAN_SAMPLER_EPSILON) can add (`exact_gaussian_budget`).

When the grid is coarser than the aggregate's own units, the aggregate is rounded to
the grid first and the sensitivity grows by one grid unit to cover that rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import polars as pl

from dprun.mechanisms.calibration import (
    analytic_gaussian_sigma,
    discrete_laplace_std,
    exact_gaussian_budget,
    gaussian_epsilon,
    laplace_scale,
    sampled_gaussian_guarantee,
)
from dprun.mechanisms.sampling import MAX_SCALE, RandomSource, discrete_gaussian, discrete_laplace

NoiseKind = Literal["laplace", "gaussian"]

LATTICE_BITS = 40
MIN_GAUSSIAN_DELTA = 2.0**-30


@dataclass(frozen=True)
class NoisePlan:
    """The noise of one quantity: integer noise in units of 2**grid_exponent.

    `linf` is the per-partition sensitivity in grid units (after any rounding to the grid),
    `l0` the number of partitions one privacy unit may change, `parameter` the discrete
    Laplace t or discrete Gaussian σ in grid units, (`epsilon`, `delta`) the standalone
    guarantee of releasing this quantity for every partition.
    """

    kind: NoiseKind
    grid_exponent: int
    linf: int
    l0: int
    parameter: float
    epsilon: float
    delta: float

    @property
    def sensitivity(self) -> float:
        """L1 (Laplace) or L2 (Gaussian) sensitivity in grid units."""
        return self.l0 * self.linf if self.kind == "laplace" else math.sqrt(self.l0) * self.linf

    @property
    def std(self) -> float:
        """Standard deviation of the noise in real units."""
        units = discrete_laplace_std(self.parameter) if self.kind == "laplace" else self.parameter
        return math.ldexp(units, self.grid_exponent)

    def scaled(self, factor: float) -> NoisePlan:
        """The same noise with its parameter multiplied by `factor` (tight accounting shrinks it)."""
        parameter = self.parameter * factor
        if self.kind == "laplace":
            epsilon, delta = self.sensitivity / parameter, 0.0
        else:
            delta = self.delta
            _, continuous_delta = exact_gaussian_budget(self.epsilon, delta, self.l0)
            exact = gaussian_epsilon(parameter, self.sensitivity, max(continuous_delta, 0.0))
            epsilon = sampled_gaussian_guarantee(exact, continuous_delta, self.l0)[0]
        return NoisePlan(self.kind, self.grid_exponent, self.linf, self.l0, parameter, epsilon, delta)


def gaussian_allowed(delta: float) -> bool:
    return delta >= MIN_GAUSSIAN_DELTA


def calibrate(
    kind: NoiseKind, unit_exponent: int, linf_units: int, l0: int, epsilon: float, delta: float
) -> NoisePlan:
    """Noise for an integer aggregate in units of 2**unit_exponent with L∞ = linf_units, L0 = l0.

    Raises ValueError for noise the samplers cannot draw or whose released numbers a float64
    cannot hold (a budget share or ε so small, or so large, that no release makes sense).
    """
    return _samplable(_calibrated(kind, unit_exponent, linf_units, l0, epsilon, delta))


# The released numbers are (aggregate + noise)·2**grid_exponent with both terms below 2**100
# in grid units: within ±2**MAX_GRID_EXPONENT the product stays a finite float64.
MAX_GRID_EXPONENT = 900


def _samplable(noise: NoisePlan) -> NoisePlan:
    if 0 < noise.parameter <= MAX_SCALE and abs(noise.grid_exponent) <= MAX_GRID_EXPONENT:
        return noise
    name = "Laplace scale" if noise.kind == "laplace" else "Gaussian σ"
    if 0 < noise.parameter < math.inf:
        name += f" this needs, about 10^{math.log10(noise.parameter) + noise.grid_exponent * math.log10(2):.0f},"
    raise ValueError(f"the {name} is out of the samplers' range: its share of the budget "
                     "(epsilon × budget_share) is too small or too large")


def _calibrated(
    kind: NoiseKind, unit_exponent: int, linf_units: int, l0: int, epsilon: float, delta: float
) -> NoisePlan:
    if kind == "laplace":
        real_scale = math.ldexp(laplace_scale(l0 * linf_units, epsilon), unit_exponent)
        grid = 0 if unit_exponent == 0 and linf_units * l0 / epsilon < 2.0**LATTICE_BITS else _grid(
            real_scale, unit_exponent)
        linf = grid_sensitivity(linf_units, unit_exponent, grid)
        return NoisePlan("laplace", grid, linf, l0, laplace_scale(l0 * linf, epsilon), epsilon, 0.0)
    if not gaussian_allowed(delta):
        raise ValueError(f"Gaussian noise needs a delta share of at least {MIN_GAUSSIAN_DELTA:.1e}")
    exact_epsilon, target = exact_gaussian_budget(epsilon, delta, l0)
    if not (exact_epsilon > 0 and target > 0):
        raise ValueError("the share of the budget is too small for Gaussian noise once the samplers' "
                         "rounding is set aside")
    real_l2 = math.ldexp(math.sqrt(l0) * linf_units, unit_exponent)
    grid = _grid(analytic_gaussian_sigma(real_l2, exact_epsilon, target), unit_exponent)
    linf = grid_sensitivity(linf_units, unit_exponent, grid)
    sigma = analytic_gaussian_sigma(math.sqrt(l0) * linf, exact_epsilon, target)
    return NoisePlan("gaussian", grid, linf, l0, sigma, epsilon, delta)


def _grid(real_parameter: float, unit_exponent: int) -> int:
    """The grid exponent that puts about 2**LATTICE_BITS grid units in one noise scale, but no
    finer than 2**-MAX_REFINEMENT_BITS of the aggregate's unit: `to_grid` shifts aggregates
    (below 2**64 units) into an Int128. Noise smaller than that (a huge ε) is then below one
    grid unit; it is still calibrated for the grid it is drawn on."""
    return max(math.frexp(real_parameter)[1] - LATTICE_BITS, unit_exponent - MAX_REFINEMENT_BITS)


MAX_REFINEMENT_BITS = 60


def grid_sensitivity(linf_units: int, unit_exponent: int, grid_exponent: int) -> int:
    """L∞ in grid units; rounding to a coarser grid can move a value by one more unit."""
    shift = grid_exponent - unit_exponent
    if shift <= 0:
        return linf_units << -shift
    return -(-linf_units >> shift) + 1


def to_grid(aggregates: pl.Series, unit_exponent: int, grid_exponent: int,
            dtype: type[pl.Int64] | type[pl.Int128] = pl.Int128) -> pl.Series:
    """Exact integer aggregates (units of 2**unit_exponent) in grid units, rounded half up, as Int128
    (or Int64 where the caller knows that every step fits it: `_fits_int64`)."""
    values = aggregates.cast(dtype)
    shift = grid_exponent - unit_exponent
    if shift <= 0:
        return values * pl.Series([1 << -shift], dtype=dtype)
    return (values + pl.Series([1 << (shift - 1)], dtype=dtype)) // pl.Series([1 << shift], dtype=dtype)


def add_noise(aggregates: pl.Series, unit_exponent: int, noise: NoisePlan, source: RandomSource) -> np.ndarray:
    """Release `aggregates` with the planned noise: (grid value + integer noise) · 2**grid_exponent."""
    count = len(aggregates)
    if noise.kind == "laplace":
        draws = discrete_laplace(source, noise.parameter, count)
    else:
        draws = discrete_gaussian(source, noise.parameter, count)
    return np.ldexp(noisy_on_grid(aggregates, unit_exponent, noise.grid_exponent, draws), noise.grid_exponent)


def noisy_on_grid(aggregates: pl.Series, unit_exponent: int, grid_exponent: int, draws: np.ndarray) -> np.ndarray:
    """The aggregates in grid units (`to_grid`) plus the integer draws, each sum rounded to float64.

    In Int64 where no step can leave it (less than half the time of Int128 over 10^6 values),
    else in Int128; the integers are the same either way, and both conversions round to the
    nearest float64, ties to even (tested)."""
    dtype = pl.Int64 if _fits_int64(aggregates, unit_exponent, grid_exponent, draws) else pl.Int128
    on_grid = to_grid(aggregates, unit_exponent, grid_exponent, dtype)
    return (on_grid + pl.Series(draws, dtype=dtype)).cast(pl.Float64).to_numpy()


def _fits_int64(aggregates: pl.Series, unit_exponent: int, grid_exponent: int, draws: np.ndarray) -> bool:
    """Whether every step of `noisy_on_grid` stays within Int64: integer aggregates without nulls
    whose largest magnitude, shifted onto the grid (or plus a grid unit, the divisor of `to_grid`,
    where the grid is coarser), plus the largest draw stays below 2**63."""
    if not aggregates.dtype.is_integer() or aggregates.null_count() or not len(aggregates):
        return False
    lowest, highest = aggregates.min(), aggregates.max()
    assert isinstance(lowest, int) and isinstance(highest, int)
    largest = max(-lowest, highest)
    shift = grid_exponent - unit_exponent
    reach = largest << -shift if shift <= 0 else largest + (1 << shift)
    return reach + int(np.abs(draws).max()) < 2**63

"""A value column's units summed per pair (dprun/engines/pair_units.py), compiled and as Python,
against Polars' `row_units` summed by numpy: the same integers for every value, exact halves of
a unit, the bounds, NaN, infinities, -0.0 and huge values among them. Seeds come from os.urandom
and are part of every assertion message."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest
from dprun_testing import fresh_seed

from dprun.engines import compiled, pair_units
from dprun.engines.polars_steps import row_unit_range, row_units
from dprun.mechanisms.quantities import Quantity, build_quantity

BOUNDS = [(0.0, 1.0), (-40.0, 90.0), (-1e-6, 3e-6), (0.0, 1e12), (-7.5, -2.25)]


def hostile_values(rng: np.random.Generator, quantity: Quantity, n: int) -> np.ndarray:
    """Values around and beyond the bounds, a third of them exact halves of a unit, and the odd ones."""
    assert quantity.lower is not None and quantity.upper is not None
    width = quantity.upper - quantity.lower
    values = rng.uniform(quantity.lower - width, quantity.upper + width, n)
    halves = rng.random(n) < 0.3
    # k + 1/2 units above the centre (squares of them where the quantity sums squares).
    half_units = (rng.integers(-2**31, 2**31, n) + 0.5) * quantity.unit
    values[halves] = (np.sqrt(np.abs(half_units)) if quantity.aggregate == "centered_sumsq" else half_units)[halves] \
        + quantity.center
    odd = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e308, -1e308, quantity.lower, quantity.upper,
                               quantity.center]), n)
    return np.where(rng.random(n) < 0.1, odd, values)


def expected_sums(quantity: Quantity, values: np.ndarray, order: np.ndarray, starts: np.ndarray) -> list[int]:
    """Polars' units of each row (NaN read as the null `_as_value` makes of it), summed per pair by numpy."""
    units = pl.DataFrame({quantity.column: values}).with_columns(pl.col(quantity.column).fill_nan(None)).select(
        row_units(quantity).fill_null(0)).to_series().to_numpy()
    return np.add.reduceat(units[order], starts, dtype=np.int64).tolist()


@pytest.mark.parametrize("aggregate", ["sum", "centered_sum", "centered_sumsq"])
def test_unit_sums_equal_polars_units_summed_by_numpy(aggregate: str) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    passes = compiled.compiled_passes().result()
    for case, (lower, upper) in enumerate(BOUNDS):
        quantity = build_quantity(aggregate, "v", (lower, upper), 3)  # type: ignore[arg-type]
        assert quantity.lower is not None and quantity.upper is not None
        n = 5000
        values = hostile_values(rng, quantity, n)
        # Read-only as numpy's view of a Polars column without nulls is.
        values.flags.writeable = case % 2 == 0
        order = rng.permutation(n).astype(np.int64)
        starts = np.unique(np.concatenate([[0], rng.integers(0, n, n // 3)])).astype(np.int64)
        expected = expected_sums(quantity, values, order, starts)
        low, high = row_unit_range(quantity)
        arguments = (values, order, starts, quantity.lower, quantity.upper, quantity.center,
                     math.ldexp(1.0, -quantity.unit_exponent), float(low), float(high), aggregate == "centered_sumsq")
        where = f"seed={seed} {quantity.id}"
        assert passes.pair_unit_sums(*arguments).tolist() == expected, f"{where}: compiled"
        assert pair_units.pair_unit_sums(*arguments).tolist() == expected, f"{where}: Python"
        present = np.add.reduceat((~np.isnan(values[order])).astype(np.int64), starts).tolist()
        counted = (values, order, starts, *pair_units.ONE_PER_VALUE)
        assert passes.pair_unit_sums(*counted).tolist() == present, f"{where}: compiled present"
        assert pair_units.pair_unit_sums(*counted).tolist() == present, f"{where}: Python present"

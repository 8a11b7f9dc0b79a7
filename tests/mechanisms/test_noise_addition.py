"""Adding the draws to the aggregates (dprun.mechanisms.noise.noisy_on_grid): int64 and Int128
steps give the same float64 values, those of Python's exact integers correctly rounded."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from dprun.mechanisms import noise
from dprun.mechanisms.noise import noisy_on_grid


def exact(aggregates: list[int], unit_exponent: int, grid_exponent: int, draws: list[int]) -> list[float]:
    """Python's integers: the aggregate rounded half up onto the grid, plus the draw, then float()
    (correctly rounded, ties to even)."""
    shift = grid_exponent - unit_exponent
    on_grid = [a << -shift if shift <= 0 else (a + (1 << (shift - 1))) >> shift for a in aggregates]
    return [float(g + d) for g, d in zip(on_grid, draws, strict=True)]


# Magnitudes around every boundary: float64's 2**53 (where sums start to round) and int64's 2**63.
MAGNITUDES = st.sampled_from([0, 1, 2**20, 2**52, 2**53, 2**54, 2**61, 2**62, 2**63 - 2**40, 2**63 - 1])
AGGREGATES = st.lists(st.builds(lambda base, offset, sign: sign * (base + offset) if base + offset < 2**63 else
                                sign * base, MAGNITUDES, st.integers(-5, 5), st.sampled_from([-1, 1])),
                      min_size=1, max_size=40)


@settings(max_examples=400, deadline=None)
@given(aggregates=AGGREGATES, unit_exponent=st.integers(-40, 10), shift=st.integers(-noise.MAX_REFINEMENT_BITS, 70),
       data=st.data())
def test_both_steps_release_the_exact_sums_correctly_rounded(aggregates: list[int], unit_exponent: int, shift: int,
                                                             data: st.DataObject) -> None:
    draws = data.draw(st.lists(st.integers(-(2**46), 2**46), min_size=len(aggregates), max_size=len(aggregates)))
    grid_exponent = unit_exponent + shift
    expected = exact(aggregates, unit_exponent, grid_exponent, draws)
    for dtype in (pl.Int64, pl.Int128):
        series = pl.Series(aggregates, dtype=dtype)
        released = noisy_on_grid(series, unit_exponent, grid_exponent, np.array(draws, dtype=np.int64))
        assert released.tolist() == expected, (dtype, aggregates, shift, draws)


def test_ties_round_to_even_on_both_steps() -> None:
    """2**53 + 1 lies halfway between two float64 values: it rounds to 2**53; 2**53 + 3 to 2**53 + 4,
    2**54 + 2 to 2**54."""
    aggregates = [2**53, 2**53 + 2, -(2**53), 2**54 + 1]
    draws = np.array([1, 1, -1, 1], dtype=np.int64)
    expected = [2.0**53, 2.0**53 + 4, -(2.0**53), 2.0**54]
    assert noise._fits_int64(pl.Series(aggregates), 0, 0, draws)
    assert noisy_on_grid(pl.Series(aggregates), 0, 0, draws).tolist() == expected
    assert not noise._fits_int64(pl.Series(aggregates), 0, -9, draws)
    assert noisy_on_grid(pl.Series(aggregates), 0, -9, draws).tolist() == exact(aggregates, 0, -9, draws.tolist())


def test_int64_is_used_only_where_no_step_can_leave_it() -> None:
    draws = np.array([2**40, -(2**40)], dtype=np.int64)
    assert noise._fits_int64(pl.Series([2**62, -(2**62)], dtype=pl.Int128), 0, 0, draws)
    # The aggregate shifted onto a finer grid, or plus the draw, or plus half a grid unit, would pass 2**63.
    assert not noise._fits_int64(pl.Series([2**62, 0]), 0, -1, draws)
    assert not noise._fits_int64(pl.Series([2**63 - 2**39, 0]), 0, 0, draws)
    assert not noise._fits_int64(pl.Series([2**63 - 2**39, 0]), 0, 41, np.zeros(2, dtype=np.int64))
    assert not noise._fits_int64(pl.Series([2**64, 0], dtype=pl.Int128), 0, 70, draws)
    # Nulls and empty series keep Polars' steps (a null aggregate releases NaN).
    assert not noise._fits_int64(pl.Series([1, None]), 0, 0, draws)
    assert not noise._fits_int64(pl.Series([], dtype=pl.Int64), 0, 0, draws[:0])
    assert np.isnan(noisy_on_grid(pl.Series([1, None]), 0, 0, draws)[1])

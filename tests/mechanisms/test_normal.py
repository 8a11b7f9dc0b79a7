"""dprun.mechanisms.normal: the standard-library log Φ and Φ⁻¹ agree with scipy's everywhere."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import scipy.special

from dprun.mechanisms import normal

# Dense where the formulas change (0, −37) and out to the ends of float64.
POINTS = np.unique(np.concatenate([
    np.linspace(-60.0, 40.0, 20_001), np.linspace(-37.5, -36.5, 2_001), np.linspace(-1e-3, 1e-3, 201),
    -np.logspace(-300, 150, 901), np.logspace(-300, 1.6, 301), [-1e308, -np.inf, np.inf, 0.0],
]))


def one_at_a_time(x: np.ndarray) -> np.ndarray:
    return np.array([normal.log_ndtr(float(value)) for value in x])


def in_arrays_within_the_limit(x: np.ndarray) -> np.ndarray:
    chunks = np.array_split(x, -(-x.size // normal.STDLIB_LIMIT))
    assert max(chunk.size for chunk in chunks) <= normal.STDLIB_LIMIT
    return np.concatenate([normal.log_ndtr(chunk) for chunk in chunks])


@pytest.mark.parametrize("ours_of", [one_at_a_time, in_arrays_within_the_limit])
def test_log_ndtr_from_the_standard_library_matches_scipy(ours_of: Callable[[np.ndarray], np.ndarray]) -> None:
    ours = ours_of(POINTS)
    theirs = scipy.special.log_ndtr(POINTS)
    tiny = np.abs(theirs) < 1e-300
    finite = np.isfinite(theirs) & ~tiny
    assert np.array_equal(ours[np.isinf(theirs)], theirs[np.isinf(theirs)])
    # Where log Φ is below the normal floats (x > 37.5), 0 and subnormals are all right.
    assert np.all(np.abs(ours[tiny]) < 1e-300)
    relative = np.abs(ours[finite] - theirs[finite]) / np.abs(theirs[finite])
    worst = int(np.argmax(relative))
    # In the upper tail both round x/√2 and lose ~x²·1e-16 relative (1.6e-13 at x = 35.7 against
    # 50-digit mpmath, for scipy's as for ours).
    assert relative[worst] < 1e-12, f"x={POINTS[finite][worst]!r}: {ours[finite][worst]!r} vs {theirs[finite][worst]!r}"


def test_log_ndtr_of_an_array_is_that_of_its_values_one_at_a_time() -> None:
    # The same C library erfc on both paths; numpy's log may differ from the C library's by an ulp.
    x = np.concatenate([POINTS[:: POINTS.size // 4000], [np.nan, -np.inf, np.inf]])
    assert np.allclose(normal.log_ndtr(x), one_at_a_time(x), rtol=4e-16, atol=0.0, equal_nan=True)


def test_log_ndtr_of_a_long_array_is_scipy_s() -> None:
    x = np.linspace(-50.0, 10.0, normal.STDLIB_LIMIT + 1)
    assert np.array_equal(normal.log_ndtr(x), scipy.special.log_ndtr(x))
    assert normal.log_ndtr(x[:3]).shape == (3,) and normal.log_ndtr(-1.0).shape == ()


@pytest.mark.parametrize("p", [1e-300, 1e-30, 2.0**-30, 1e-6, 0.025, 0.5, 0.975, 1 - 1e-12])
def test_ndtri_from_the_standard_library_matches_scipy(p: float) -> None:
    assert math.isclose(normal.ndtri(p), float(scipy.special.ndtri(p)), rel_tol=1e-13, abs_tol=1e-15)

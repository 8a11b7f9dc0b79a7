"""The standard normal distribution's log CDF and quantile, without importing scipy for a few values.

Importing `scipy.special` takes about 0.12 s, half of the start-up budget of `dprun validate`
and `explain-budget`, which evaluate these functions at a handful of points while planning.
Those points are computed from the standard library (`math.erfc`, the C library's erfc, and
`statistics.NormalDist.inv_cdf`, Wichura's AS241), and so are the arrays of up to
`STDLIB_LIMIT` values that composing a Gaussian with discrete losses evaluates while
planning (~115 arrays of 4,000 losses: 40 ms, against 120 ms to import scipy and use it);
longer arrays (partition selection at run time) go to scipy, imported then.
`tests/mechanisms/test_normal.py` holds the two within 1e-12 relative of each other.
"""

from __future__ import annotations

import math
import sys
from statistics import NormalDist

import numpy as np

STDLIB_LIMIT = 2**14

# Below this x, erfc(-x/√2) nears the smallest normal float64; the asymptotic series is used.
_SERIES_BELOW = -37.0
_SERIES_TERMS = 10
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# Below −√(2·max float), log Φ(x) < −x²/2 is below −max float: −inf is its rounding.
_MOST_NEGATIVE = -math.sqrt(2.0) * math.sqrt(sys.float_info.max)


def log_ndtr(x: np.ndarray | float) -> np.ndarray:
    """log Φ(x) elementwise: to about 1e-16 relative for x <= 0; above, x/√2 is rounded, which
    costs about x²·1e-16 relative (as in scipy)."""
    values = np.asarray(x, dtype=np.float64)
    if values.size > STDLIB_LIMIT:
        from scipy.special import log_ndtr as scipy_log_ndtr

        return np.asarray(scipy_log_ndtr(values))
    if values.ndim == 0:
        # Planning calls this thousands of times on one value: an array's set-up would be most of the time.
        return np.asarray(_log_ndtr(float(values)))
    return _log_ndtr_array(values)


def ndtri(p: float) -> float:
    """The standard normal quantile Φ⁻¹(p) for 0 < p < 1."""
    return NormalDist().inv_cdf(p)


def _log_ndtr_array(x: np.ndarray) -> np.ndarray:
    """`_log_ndtr` of each value, its branches taken a whole array at a time (numpy's log may
    differ from the C library's by an ulp)."""
    result = np.full(x.shape, np.nan)
    upper = x > 0.0
    middle = (x <= 0.0) & (x >= _SERIES_BELOW)
    lower = x < _SERIES_BELOW
    result[upper] = np.log1p(-0.5 * _erfc(x[upper] / math.sqrt(2.0)))
    result[middle] = np.log(0.5 * _erfc(-x[middle] / math.sqrt(2.0)))
    result[lower] = _log_ndtr_series(x[lower])
    return result


def _erfc(values: np.ndarray) -> np.ndarray:
    return np.fromiter(map(math.erfc, values.tolist()), np.float64, values.size)


def _log_ndtr_series(x: np.ndarray) -> np.ndarray:
    """log Φ(x) for x below `_SERIES_BELOW` (−inf below `_MOST_NEGATIVE`)."""
    result = np.full(x.shape, -math.inf)
    near = x >= _MOST_NEGATIVE
    y = x[near]
    # Φ(x) = φ(x)/|x| · Σ_k (−1)^k (2k−1)!!/x^(2k) (asymptotic; at |x| >= 37 ten terms leave
    # less than 1e-30 relative).
    inverse_square = (1.0 / y) ** 2
    term, total = np.ones_like(y), np.ones_like(y)
    for k in range(1, _SERIES_TERMS):
        term *= -(2 * k - 1) * inverse_square
        total += term
    result[near] = -0.5 * y * y - np.log(-y) - _HALF_LOG_2PI + np.log(total)
    return result


def _log_ndtr(value: float) -> float:
    x = float(value)
    if math.isnan(x):
        return math.nan
    if x > 0.0:
        # Φ(x) = 1 − Φ(−x): log1p keeps the small upper tail.
        return math.log1p(-0.5 * math.erfc(x / math.sqrt(2.0)))
    if x >= _SERIES_BELOW:
        return math.log(0.5 * math.erfc(-x / math.sqrt(2.0)))
    # Far in the lower tail (rare while planning): the array's series, on one value.
    return float(_log_ndtr_series(np.array([x]))[0])

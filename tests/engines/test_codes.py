"""Range codes decode to the values they were coded from, for every digit of a mixed-radix code.
Seeds come from os.urandom and are part of every assertion message."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from dprun_testing import fresh_seed

from dprun.engines.codes import Digit, RangeCodes

TYPES = (pl.Int8(), pl.Int16(), pl.Int32(), pl.Int64(), pl.UInt8(), pl.UInt32(), pl.UInt64())


@pytest.mark.parametrize("digits", [1, 2, 3])
def test_range_codes_decode_every_digit_to_the_values_coded(digits: int) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    columns = []
    for index in range(digits):
        dtype = TYPES[int(rng.integers(len(TYPES)))]
        low, high = (0, 100) if not dtype.is_signed_integer() else (-100, 100)
        minimum = int(rng.integers(low, high))
        span = int(rng.integers(1, 28))
        columns.append(Digit(f"c{index}", minimum, span, dtype, nulls=bool(rng.integers(2))))
    codes = RangeCodes(tuple(columns))
    rows = 500
    frame = pl.DataFrame({d.column: pl.Series(d.minimum + rng.integers(0, d.span, rows), dtype=d.dtype)
                          for d in codes.digits})
    # Nulls where a digit codes them: its code is the one after its largest value.
    frame = frame.with_columns(pl.when(pl.lit(rng.random(rows) < 0.2) & pl.lit(d.nulls)).then(None)
                               .otherwise(pl.col(d.column)).alias(d.column) for d in codes.digits)
    coded = frame.select(codes.code()).to_series().to_numpy()
    assert coded.min() >= 0 and coded.max() < codes.count, f"seed={seed}: codes out of 0 .. count−1"
    assert codes.values(coded).equals(frame), f"seed={seed}: {codes.digits} decode to other values"

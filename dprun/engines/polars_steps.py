"""Pieces both bounding strategies of the Polars engine share: column names, one row's
value in integer units, the per-partition scaling of a partial, and running a lazy frame
with Polars errors turned into dprun's (Polars' own messages can quote data values)."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from dprun.errors import DataError, OutputError
from dprun.mechanisms.quantities import Quantity

GLOBAL_KEY = "__dprun_partition__"
UNITS = "__dprun_units__"
LEAF = "__dprun_leaf__"
WEIGHT = "__dprun_weight__"
PARTITION = "__dprun_partition_index__"
STREAMING = "streaming"


def row_units(quantity: Quantity) -> pl.Expr:
    """A row's value in integer units of the quantity: clamped, centred, rounded, clipped."""
    value = pl.col(quantity.column).clip(quantity.lower, quantity.upper) - quantity.center
    if quantity.aggregate == "centered_sumsq":
        value = value * value
    scaled = (value * math.ldexp(1.0, -quantity.unit_exponent)).round()
    low = 0 if quantity.aggregate == "centered_sumsq" else -quantity.max_units
    return scaled.clip(low, quantity.max_units).cast(pl.Int64)


def scaled_partial(total: pl.Expr, present: pl.Expr, max_rows: int) -> pl.Expr:
    """A (unit, partition) total of `present` rows scaled to min(present, m) rows' worth.

    floor(total · kept / present) stays within ±kept · max_units, so L∞ = m · max_units holds.
    """
    kept = pl.min_horizontal(present, pl.lit(max_rows)).cast(pl.Int128)
    return pl.when(present > 0).then((total * kept) // present.cast(pl.Int128)).otherwise(0).cast(pl.Int128)


def sink(frame: pl.LazyFrame, target: Path | pl.PartitionBy, *, arrow: bool = False) -> None:
    """Stream a frame to Parquet, or to uncompressed Arrow IPC for scratch files read back at once."""
    try:
        if arrow:
            frame.sink_ipc(target, mkdir=True, engine=STREAMING, compression=None)
        else:
            frame.sink_parquet(target, mkdir=True, engine=STREAMING)
    except OSError as exc:
        # Polars raises some operating-system failures (a full disk) as OSError.
        raise _scratch_error(exc) from None
    except pl.exceptions.PolarsError as exc:
        if "os error" in str(exc):
            raise _scratch_error(exc) from None
        raise data_error(exc) from None


def _scratch_error(exc: Exception) -> OutputError:
    """An operating-system failure names no data value; say it as it is."""
    reason = str(exc).strip().splitlines()[0]
    return OutputError(f"cannot write intermediate files (set DPRUN_TMPDIR to a larger disk?): {reason}")


def collect(frame: pl.LazyFrame) -> pl.DataFrame:
    try:
        return frame.collect(engine=STREAMING)
    except pl.exceptions.PolarsError as exc:
        raise data_error(exc) from None


def data_error(exc: Exception) -> DataError:
    return DataError(f"the data could not be processed ({type(exc).__name__}); check the input files and column types")

"""Pieces of the Polars engine's steps (column names the Spark engine shares too): one row's
value in integer units, the per-partition scaling of a partial, and running a lazy frame
with Polars errors turned into dprun's (Polars' own messages can quote data values)."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

import polars as pl

from dprun.errors import DataError, OutputError
from dprun.mechanisms.quantities import Quantity

GLOBAL_KEY = "__dprun_partition__"
UNITS = "__dprun_units__"
# A partition's selection weight (`weighted_gaussian_threshold`): Σ over its units of w(partitions of the unit).
SELECTION_WEIGHTS = "__dprun_selection_weights__"
LEAF = "__dprun_leaf__"
WEIGHT = "__dprun_weight__"
PARTITION = "__dprun_partition_index__"
STREAMING: Final = "streaming"
TRUNCATION_KEY = 0x9E3779B97F4A7C15  # odd: `truncation_key` differs for every input position


def key_order(schema: Mapping[str, pl.DataType]) -> list[pl.Expr]:
    """The order candidates are drawn for: by each key in turn, nulls last; a categorical key by its
    text, as Spark orders the strings it holds them as."""
    return [pl.col(k).cast(pl.String) if isinstance(t, pl.Categorical | pl.Enum) else pl.col(k)
            for k, t in schema.items()]


def row_units(quantity: Quantity) -> pl.Expr:
    """A row's value in integer units of the quantity: clamped, centred, rounded, clipped."""
    assert quantity.column is not None
    value = pl.col(quantity.column).clip(quantity.lower, quantity.upper) - quantity.center
    if quantity.aggregate == "centered_sumsq":
        value = value * value
    scaled = (value * math.ldexp(1.0, -quantity.unit_exponent)).round()
    return scaled.clip(*row_unit_range(quantity)).cast(pl.Int64)


def row_unit_range(quantity: Quantity) -> tuple[int, int]:
    """The fewest and most units a row of the quantity counts for."""
    return (0 if quantity.aggregate == "centered_sumsq" else -quantity.max_units), quantity.max_units


def truncation_key(seed: int, position: int) -> int:
    """The secret key, in [0, 2**64), both engines cut the `position`-th input of a join with (1: the
    query's own input), from the run's truncation seed: each input's choice is independent."""
    return seed ^ (TRUNCATION_KEY * position % 2**64)


def truncated(frame: pl.LazyFrame, units: list[str], bound: int, seed: int) -> pl.LazyFrame:
    """Each privacy unit's rows cut to `bound`: the rows with the smallest keyed hash of the whole row.

    Which rows a unit keeps depends only on its own rows and the run's secret key (identical
    rows hash alike and are interchangeable), so the cut is a function of each unit's rows
    alone. Rows without a privacy unit are dropped. The units over the bound are found first
    (often none, and then the frame is returned as it is); only their rows are ranked, and the
    rows they keep are collected (at most `bound` per unit over it), so that the rest of the
    frame streams on without a second reader of the input holding rows back.
    """
    frame = frame.filter(pl.all_horizontal(pl.col(c).is_not_null() for c in units))
    if _one_row_per_unit_in_order(frame, units):
        return frame
    over = collect(frame.group_by(units).agg(pl.len().alias(UNITS)).filter(pl.col(UNITS) > bound).select(units))
    if over.height == 0:
        return frame
    within = frame.join(over.lazy(), on=units, how="anti")
    # An ordinal rank keeps exactly `bound` rows even where two of a unit's rows hash alike.
    rank = pl.struct(pl.all()).hash(seed).rank(method="ordinal").over(units)
    cut = collect(frame.join(over.lazy(), on=units, how="semi").filter(rank <= bound))
    return pl.concat([within, cut.lazy()])


def _one_row_per_unit_in_order(frame: pl.LazyFrame, units: list[str]) -> bool:
    """Whether a single unit column (numbers, dates or text) strictly increases down the rows:
    then no unit has two rows.

    A table keyed by the unit is often stored sorted by it; one ordered pass over the column
    shows it without the hash table of every unit that counting needs (10^7 units: 0.05 s
    against 0.4 s on the benchmark machine).
    """
    dtype = frame.collect_schema()[units[0]] if len(units) == 1 else None
    if dtype is None or not (dtype.is_numeric() or dtype.is_temporal() or dtype == pl.String):
        return False
    unit = pl.col(units[0])
    return bool(collect(frame.select((unit > unit.shift(1)).all())).item())


def scaled_partial(total: pl.Expr, present: pl.Expr, max_rows: int) -> pl.Expr:
    """A (unit, partition) total of `present` rows scaled to min(present, m) rows' worth.

    floor(total · kept / present) stays within ±kept · max_units, so L∞ = m · max_units holds.
    """
    kept = pl.min_horizontal(present, pl.lit(max_rows)).cast(pl.Int128)
    return pl.when(present > 0).then((total * kept) // present.cast(pl.Int128)).otherwise(0).cast(pl.Int128)


def sink(frame: pl.LazyFrame, target: Path | pl.PartitionBy, folder: Path, *, arrow: bool = False) -> None:
    """Stream a frame to Parquet, or to uncompressed Arrow IPC for scratch files read back at once.

    `folder` is the scratch folder the files go to. A failure is classified by what it is
    and by the state of that folder, never by Polars' message, which can quote data values:
    if the folder cannot take a small write now, the scratch disk failed (exit 6, with the
    operating system's own words); otherwise it is an input that could not be read or data
    Polars could not process (exit 3, `data_error`).
    """
    try:
        if arrow:
            frame.sink_ipc(target, mkdir=True, engine=STREAMING, compression=None)
        else:
            frame.sink_parquet(target, mkdir=True, engine=STREAMING)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise run_failure(exc, folder) from None


def run_failure(exc: Exception, folder: Path) -> OutputError | DataError:
    """What a failure while running a query is: the scratch disk's, or the data's (see `sink`)."""
    problem = scratch_write_problem(folder)
    return data_error(exc) if problem is None else scratch_failure(problem, folder)


def scratch_failure(problem: str, folder: Path) -> OutputError:
    """The scratch disk failed (exit 6), in the operating system's words."""
    return OutputError(f"cannot write intermediate files in {folder} (set DPRUN_TMPDIR to a larger disk?): {problem}")


SCRATCH_PROBE_BYTES = 1 << 20


def scratch_write_problem(folder: Path) -> str | None:
    """Why `folder` cannot take a 1 MiB file now (the OS's words), or None if it can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder) as probe:
            probe.write(bytes(SCRATCH_PROBE_BYTES))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        return exc.strerror or os.strerror(exc.errno or 0) or type(exc).__name__
    return None


def collect(frame: pl.LazyFrame) -> pl.DataFrame:
    try:
        return frame.collect(engine=STREAMING)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise data_error(exc) from None


def batches(frame: pl.LazyFrame, rows: int) -> Iterator[pl.DataFrame]:
    """The frame's rows in batches of about `rows`, from the streaming engine, in no set order
    (failures as `collect`'s)."""
    try:
        yield from frame.collect_batches(chunk_size=rows, maintain_order=False, engine=STREAMING)
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise data_error(exc) from None


def statistics_mismatch() -> DataError:
    """A row without a code: its unit or key is outside the range the footers gave, or its key
    missing from the key table."""
    return DataError("the input changed while dprun read it, or a Parquet footer's statistics do not match "
                     "the file's data; rewrite the file")


def data_error(exc: Exception) -> DataError:
    """A failure reading or processing the data, named by its type only (its text may quote values)."""
    if isinstance(exc, OSError):
        return DataError(f"an input file could not be read ({type(exc).__name__}); was it changed or removed "
                         "while dprun ran?")
    return DataError(f"the data could not be processed ({type(exc).__name__}); check the input files and column types")

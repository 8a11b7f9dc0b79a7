"""Every CSV and NDJSON row is well formed before any of it is counted.

Polars reads leniently where a release must not: a CSV row with fewer fields than the
header gets nulls for the missing ones, and an NDJSON value that is an object or a list
in a column of plain values is read as its JSON text. Either way a malformed row would
be counted. So before a plan runs, each CSV and NDJSON input is read once, row by row,
with Python's `csv` and `json` modules (Polars has no strict mode for these cases), and
the first malformed row stops the run with its file and line, never its values.

Cost: one extra pass over the file, about 0.3 s per million short CSV rows and a few
times that for NDJSON on the benchmark machine (docs/spec.md, "inputs"). Parquet files
carry their schema per file and need no such pass.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import polars as pl

from dprun.errors import DataError
from dprun.spec.input_schema import InputInfo


def check_rows(info: InputInfo) -> None:
    """Raise DataError at the first malformed row of a CSV or NDJSON input; Parquet passes."""
    for path in info.paths:
        try:
            if info.format == "csv":
                _check_csv(path)
            elif info.format == "ndjson":
                _check_ndjson(path, _plain_columns(info.schema))
        except OSError as exc:
            raise DataError(f"{path}: cannot read the input ({exc.strerror or type(exc).__name__}); was it "
                            "changed or removed while dprun ran?") from None


def _check_csv(path: Path) -> None:
    with _csv_text(path) as handle:
        reader = csv.reader(handle)
        width = len(next(reader, []))
        try:
            for row in reader:
                if row and len(row) != width:
                    raise DataError(f"{path}: line {reader.line_num} has {len(row)} fields, the header has "
                                    f"{width}; fix or remove the row (nothing was counted)")
        except csv.Error:
            raise DataError(f"{path}: line {reader.line_num} is not valid CSV (an unterminated quote?); "
                            "fix the row (nothing was counted)") from None


def _csv_text(path: Path) -> TextIO:
    # utf-8-sig drops a byte-order mark as Polars does; undecodable bytes are Polars' to refuse.
    return path.open(encoding="utf-8-sig", errors="replace", newline="")


def _plain_columns(schema: dict[str, pl.DataType]) -> set[str]:
    return {name for name, dtype in schema.items() if not dtype.is_nested()}


def _check_ndjson(path: Path, plain: set[str]) -> None:
    for number, line in _lines(path):
        try:
            row = json.loads(line)
        except ValueError:
            raise DataError(f"{path}: line {number} is not valid JSON; fix the row (nothing was counted)") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}: line {number} is not a JSON object; fix the row (nothing was counted)")
        for column, value in row.items():
            if column in plain and isinstance(value, (dict, list)):
                raise DataError(f"{path}: line {number}: column '{column}' holds a JSON object or list, not a "
                                "single value; fix the row (nothing was counted)")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line

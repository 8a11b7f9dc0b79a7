"""Every CSV and NDJSON row is well formed before any of it is counted.

Polars reads leniently where a release must not: a CSV row with fewer fields than the
header gets nulls for the missing ones, and an NDJSON value that is an object or a list
in a column of plain values is read as its JSON text. Either way a malformed row would
be counted. So before a plan runs, each CSV and NDJSON input is read once, row by row,
with Python's `csv` and `json` modules (Polars has no strict mode for these cases), and
the first malformed row stops the run with its file, line and column, never its values.
A CSV value in a column the spec types (`columns`) must parse as that type. Values of
the other typed columns (a metric's float64) are Polars' to parse; when Polars stops at one without saying where,
`run` calls `check_rows(..., every_value=True)` to find it (also for a Parquet column
the spec types, and for a Parquet file whose pages Polars could not decode: pyarrow's
reader, a second decoder, says whether the file or Polars is at fault).

`validate` runs the check, every value included, on the first SCHEMA_SAMPLE_ROWS rows.

Cost: one extra pass over the file, about 0.3 s per million short CSV rows and a few
times that for NDJSON on the benchmark machine (docs/spec.md, "inputs"). Parquet files
carry their schema per file and need no such pass.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TextIO

import polars as pl

from dprun.errors import DataError
from dprun.spec.input_schema import InputInfo, csv_rows, typed
from dprun.spec.models import ColumnType, ColumnTypeName

# What Polars' CSV reader takes for these types (it strips surrounding blanks).
# ASCII digits only (re.ASCII): Polars reads no other digits, where Python's \d takes any script's.
_INTEGER = re.compile(r"\s*[+-]?\d+\s*", re.ASCII)
_FLOAT = re.compile(r"\s*[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|infinity|nan)\s*",
                    re.IGNORECASE | re.ASCII)
_BOOLEAN = re.compile(r"\s*(true|false)\s*", re.IGNORECASE)


def check_rows(info: InputInfo, limit: int | None = None, *, every_value: bool = False,
               paths: Iterable[Path] | None = None) -> None:
    """Raise DataError at the first malformed row of a CSV or NDJSON input (of its first
    `limit` rows per file, if given; of the files in `paths` only, if given); Parquet passes.

    Values are checked in the columns the spec types; with `every_value` also in those
    the schema reads as numbers or booleans otherwise (a metric's float64), which costs about five times as long: `run` does that
    only after Polars has failed on a value, to say where (`validate` on its sample)."""
    for path in info.paths if paths is None else paths:
        shown = info.shown(path)
        if info.partitions:
            _check_partition_values(path, shown, info)
        try:
            if info.format == "csv":
                _check_csv(path, shown, info, limit, every_value)
            elif info.format == "ndjson":
                _check_ndjson(path, shown, info.schema, limit, every_value)
            elif every_value and limit is None:  # a whole column: never in validate's sample
                _check_parquet_pages(path, shown)
                _check_parquet_types(path, shown, info)
        except OSError as exc:
            raise DataError(f"{shown}: cannot read the input ({exc.strerror or type(exc).__name__}); was it "
                            "changed or removed while dprun ran?") from None


def _check_csv(path: Path, shown: str, info: InputInfo, limit: int | None, every_value: bool) -> None:
    reading = info.reading
    with _csv_text(path, reading.encoding) as handle:
        reader = csv_rows(handle, reading)
        rows: Iterator[list[str]] = (row for row in reader if row)  # blank lines (and comment lines) are skipped
        first = next(rows, [])
        width = len(first)
        # Without a header the columns have the names Polars gave them, in file order.
        names = first if reading.has_header else [name for name in info.schema if name not in reading.derive]
        checks = _value_checks(names, info, every_value)
        temporal = [_Temporal(index, name, kind) for index, name, kind, _ in checks if kind.type in TEMPORAL]
        checks = [check for check in checks if check[2].type not in TEMPORAL]

        def held_values_parse() -> None:
            """Raise at the first held date or time that does not parse (it comes before the current row)."""
            failures = [failure for column in temporal if (failure := column.first_unparsed()) is not None]
            if failures:
                line, name, kind, text = min(failures)
                raise _unparsed(shown, line, name, kind, text, info)

        if not reading.has_header:
            rows = _prepend(first, rows)
        try:
            strict_text = reading.encoding == "utf8"
            for row in islice(rows, limit):
                if strict_text and _INVALID_BYTE.search("".join(row)):
                    held_values_parse()
                    raise DataError(f"{shown}: line {reader.line_num} is not valid UTF-8; fix the file, or set the "
                                    "input's `encoding: utf8-lossy` to read such bytes as U+FFFD (nothing was counted)")
                if len(row) != width:
                    held_values_parse()
                    raise DataError(f"{shown}: line {reader.line_num} has {len(row)} fields, the header has "
                                    f"{width}; fix or remove the row (nothing was counted)")
                for index, name, kind, parses in checks:
                    text = row[index]
                    if text and text not in reading.null_values and not parses(text):
                        held_values_parse()
                        raise _unparsed(shown, reader.line_num, name, kind, text, info)
                for column in temporal:
                    text = row[column.index]
                    if text and text not in reading.null_values:
                        column.hold(reader.line_num, text)
                if any(column.full for column in temporal):
                    held_values_parse()
        except csv.Error:
            held_values_parse()
            raise DataError(f"{shown}: line {reader.line_num} is not valid CSV (an unterminated quote?); "
                            "fix the row (nothing was counted)") from None
        held_values_parse()


TEMPORAL = ("date", "datetime")


class _Temporal:
    """A date or datetime column's values, parsed by Polars in batches with the very expression the
    engines run (`input_schema.typed`), so that this check and the run agree on what parses (chrono's
    formats, `%.f` among them, are not Python's)."""

    BATCH = 1 << 16

    def __init__(self, index: int, name: str, kind: ColumnType) -> None:
        self.index, self.name, self.kind = index, name, kind
        self.lines: list[int] = []
        self.texts: list[str] = []

    @property
    def full(self) -> bool:
        return len(self.texts) >= self.BATCH

    def hold(self, line: int, text: str) -> None:
        self.lines.append(line)
        self.texts.append(text)

    def first_unparsed(self) -> tuple[int, str, ColumnType, str] | None:
        """The first held value that does not parse (its line, column, type and text), and the held
        values let go."""
        if not self.texts:
            return None
        frame = pl.DataFrame({"v": self.texts}, schema={"v": pl.String})
        failed = frame.select(typed(pl.col("v"), self.kind, strict=False).is_null().arg_true().first()).item()
        found = None if failed is None else (self.lines[failed], self.name, self.kind, self.texts[failed])
        self.lines, self.texts = [], []
        return found


def _prepend(first: list[str], rows: Iterator[list[str]]) -> Iterator[list[str]]:
    yield first
    yield from rows


def _value_checks(names: list[str], info: InputInfo,
                  every_value: bool) -> list[tuple[int, str, ColumnType, Callable[[str], bool]]]:
    """The columns whose values must parse: typed by the spec, and with `every_value` the other
    numeric or boolean ones (Polars stops at a value that does not fit, without saying where)."""
    types = info.reading.column_types()
    for name, dtype in info.schema.items() if every_value else ():
        kind = _SCHEMA_KINDS.get(type(dtype))
        if name not in types and kind is not None:
            types[name] = ColumnType(type=kind)
    return [(index, name, types[name], _parser(types[name])) for index, name in enumerate(names) if name in types]


_SCHEMA_KINDS: dict[type, ColumnTypeName] = {pl.Int64: "int64", pl.Float64: "float64", pl.Boolean: "bool"}


def parser_for(kind: ColumnTypeName) -> Callable[[str], bool]:
    """Whether a text parses as a value of `kind` (without a format), as this check decides."""
    return _parser(ColumnType(type=kind))


def _parser(kind: ColumnType) -> Callable[[str], bool]:
    """A text's parse by the rules Polars' CSV reader follows (dates and times: `_Temporal`)."""
    if kind.type == "int64":
        return lambda text: bool(_INTEGER.fullmatch(text)) and -(2**63) <= int(text) < 2**63
    if kind.type == "float64":
        return lambda text: bool(_FLOAT.fullmatch(text))
    if kind.type == "bool":
        return lambda text: bool(_BOOLEAN.fullmatch(text))
    return lambda text: True


# Texts that data tools write for a missing value (R, SQL dumps, spreadsheets, pandas). Such a
# text is a format marker, not a data value: a message may name it, so that the fix is clear.
MISSING_TOKENS = ("NA", "N/A", "#N/A", "NULL", "null", "\\N", "NaN", "nan", "None", "-", "?", ".")


def _unparsed(shown: str, line: int, name: str, kind: ColumnType, text: str, info: InputInfo) -> DataError:
    """A value that does not parse as its column's type; a missing-value token is named as one."""
    token = text.strip()
    if token in MISSING_TOKENS:
        described = _described(kind)
        article = "an" if described[0] in "aeiou" else "a"
        return DataError(f"{shown}: line {line}: column '{name}' holds `{token}`, a usual missing-value token, where "
                         f"{article} {described} is expected; list it in the input's `null_values` (e.g. "
                         f"`null_values: ['{token}']`) so that it reads as missing (nothing was counted)")
    return DataError(f"{shown}: line {line}: column '{name}' does not parse as {_described(kind)}"
                     f"{_why_typed(name, info)}; fix the row (nothing was counted)")


def _why_typed(name: str, info: InputInfo) -> str:
    """Why a column the spec does not type has a type other than text."""
    if name in info.reading.columns or info.schema.get(name) != pl.Float64:
        return ""
    return (" (a metric takes its values, so it is read as float64; if it is not a number, declare its type under "
            "the input's `columns:` and choose another column)")


def _described(kind: ColumnType) -> str:
    return kind.type + (f" with format {kind.format}" if kind.format else "")


def _check_parquet_pages(path: Path, shown: str) -> None:
    """Every page of the file decodes. Polars panics on some corrupt pages rather than
    raising an error, which would read as a bug in Polars; pyarrow's reader, one batch at a
    time (bounded memory), tells a corrupt file apart."""
    # Imported here: `validate` and `explain-budget` load this module and never need pyarrow.
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        for _ in pq.ParquetFile(path).iter_batches():
            pass
    except (pa.ArrowException, OSError):
        # pyarrow's message can quote the bytes it stopped at: not shown.
        raise DataError(f"{shown}: the Parquet file's data pages cannot be decoded (a corrupt or truncated file?); "
                        "write the file again (nothing was counted)") from None


def _check_partition_values(path: Path, shown: str, info: InputInfo) -> None:
    """Each partition folder's value converts to the type the spec gives its column."""
    types = info.reading.column_types()
    for name, value in info.partition_values(path):
        kind = types.get(name)
        if kind is None or value is None:
            continue
        converted = pl.select(typed(pl.lit(value, dtype=pl.String), kind, strict=False)).item()
        if converted is None:
            raise DataError(f"{shown}: partition folder '{name}' holds a value that does not convert to "
                            f"{_described(kind)}; fix the folder's name or the type in `columns` (nothing was counted)")


def _check_parquet_types(path: Path, shown: str, info: InputInfo) -> None:
    """Each column the spec types converts to that type in this file (a Parquet file has
    its own types; only a `columns` type can fail on a value). Partition columns: above."""
    for name, kind in info.reading.column_types().items():
        if name in info.partitions:
            continue
        try:
            pl.scan_parquet(path).select(typed(pl.col(name), kind)).collect(engine="streaming")
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
            raise DataError(f"{shown}: column '{name}' holds a value that does not convert to {_described(kind)}; "
                            "fix the file or the type in `columns` (nothing was counted)") from None


def _csv_text(path: Path, encoding: str) -> TextIO:
    """utf-8-sig drops a byte-order mark as Polars does. Under `utf8`, invalid bytes are kept as
    lone surrogates, which `_check_csv` finds and names by line (Polars would refuse the file
    without saying where); under `utf8-lossy` they read as U+FFFD, as Polars reads them."""
    return path.open(encoding="utf-8-sig", errors="surrogateescape" if encoding == "utf8" else "replace",
                     newline="")


# A byte that is not UTF-8, as `surrogateescape` decodes it.
_INVALID_BYTE = re.compile("[\udc80-\udcff]")


def _plain_columns(schema: dict[str, pl.DataType]) -> set[str]:
    return {name for name, dtype in schema.items() if not dtype.is_nested()}


def _check_ndjson(path: Path, shown: str, schema: dict[str, pl.DataType], limit: int | None,
                  every_value: bool) -> None:
    """Each line a JSON object, with single values where the columns hold them; with
    `every_value`, values of the numeric and boolean columns of their kind."""
    plain = _plain_columns(schema)
    kinds = {name: _SCHEMA_KINDS[type(dtype)] for name, dtype in schema.items()
             if every_value and type(dtype) in _SCHEMA_KINDS}
    for number, line in islice(_lines(path), limit):
        try:
            row = json.loads(line)
        except ValueError:
            raise DataError(f"{shown}: line {number} is not valid JSON; fix the row (nothing was counted)") from None
        if not isinstance(row, dict):
            raise DataError(f"{shown}: line {number} is not a JSON object; fix the row (nothing was counted)")
        for column, value in row.items():
            if column in plain and isinstance(value, (dict, list)):
                raise DataError(f"{shown}: line {number}: column '{column}' holds a JSON object or list, not a "
                                "single value; fix the row (nothing was counted)")
            expected = kinds.get(column)
            if expected is not None and value is not None and not _json_fits(value, expected):
                raise DataError(f"{shown}: line {number}: column '{column}' does not hold {expected} values here; "
                                "fix the row (nothing was counted)")


def _json_fits(value: object, kind: str) -> bool:
    """A JSON value Polars reads into a column of this kind (an integer into a float column too)."""
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == "int64" else isinstance(value, (int, float))


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                yield number, line

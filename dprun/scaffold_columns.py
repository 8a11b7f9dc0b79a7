"""What `dprun init` proposes for each column of a data file: the type to declare, its format,
the missing-value tokens to list, and how likely it is a measure.

A CSV file declares no types, so `init` reads its first SCHEMA_SAMPLE_ROWS rows as text and
proposes, per column, the narrowest type every value there parses as, after setting aside
the usual missing-value tokens (`NA`, `NULL`, `\\N`, …), which the spec then lists under
`null_values`. The user reviews the proposal; `validate` and `run` only ever read the
types the spec declares (docs/privacy.md, "What the plan reads"). Values are read to
decide, never written into the scaffold or a message.

The parse rules are the strict row check's (`strict_rows`), so a proposed type validates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from dprun.spec.input_schema import ISO_DATE, ISO_DATETIME, SCHEMA_SAMPLE_ROWS
from dprun.spec.models import ColumnTypeName
from dprun.spec.strict_rows import MISSING_TOKENS, parser_for

# Date formats tried in this order; the ISO ones are the spec's defaults (no `format` needed).
DATE_FORMATS = (ISO_DATE, "%d/%m/%Y", "%m/%d/%Y", "%Y/%m/%d", "%d.%m.%Y", "%Y%m%d")
DATETIME_FORMATS = (None, "%Y-%m-%dT%H:%M:%S%.fZ", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%d/%m/%Y %H:%M:%S",
                    "%m/%d/%Y %H:%M:%S")
# The spec's name for each Polars type a self-describing file (Parquet, NDJSON) can hold.
SPEC_TYPES: dict[type[pl.DataType], str] = {
    pl.Int8: "int64", pl.Int16: "int64", pl.Int32: "int64", pl.Int64: "int64", pl.UInt8: "int64",
    pl.UInt16: "int64", pl.UInt32: "int64", pl.Float32: "float64", pl.Float64: "float64",
    pl.Boolean: "bool", pl.String: "string", pl.Date: "date", pl.Datetime: "datetime",
}
# Name parts of columns that are identifiers, codes or calendar fields rather than measures:
# summing or averaging them is rarely what a release wants.
NOT_MEASURES = frozenset({
    "id", "uid", "key", "code", "zip", "postal", "postcode", "number", "num", "no", "nr", "phone", "fips", "flight",
    "tailnum", "year", "month", "day", "hour", "minute", "second", "week", "quarter", "dow", "doy", "date",
    "time", "weekday", "timestamp", "lat", "lon", "latitude", "longitude",
})


@dataclass(frozen=True)
class ProposedColumn:
    """What `init` proposes for one column."""

    name: str
    dtype: pl.DataType  # the Polars type it reads as with that proposal
    kind: str | None  # the spec's type name; None: the column has no spec type (nested), so it is not read
    format: str | None = None  # a date or datetime's format, where the ISO default does not fit
    tokens: tuple[str, ...] = ()  # missing-value tokens that kept the column from this type

    @property
    def is_measure_like(self) -> bool:
        """A number whose name is not that of an identifier, a code or a calendar field."""
        parts = {part.lower() for part in re.split(r"[^A-Za-z0-9]+|(?<=[a-z])(?=[A-Z])", self.name) if part}
        return self.kind in ("int64", "float64") and not parts & NOT_MEASURES


def propose_csv(path: Path) -> list[ProposedColumn]:
    """Each column of a CSV file (comma-separated, with a header) as its first rows suggest."""
    sample = pl.read_csv(path, infer_schema=False, n_rows=SCHEMA_SAMPLE_ROWS)
    return [_proposed(name, sample[name]) for name in sample.columns]


def propose_from_schema(schema: dict[str, pl.DataType]) -> list[ProposedColumn]:
    """Each column of a file that carries its types (Parquet's footer, NDJSON as Polars reads it)."""
    return [ProposedColumn(name, dtype, SPEC_TYPES.get(type(dtype))) for name, dtype in schema.items()]


def _proposed(name: str, column: pl.Series) -> ProposedColumn:
    values = column.drop_nulls().str.strip_chars()
    values = values.filter(values != "")
    tokens = tuple(token for token in MISSING_TOKENS if (values == token).any())
    rest = values.filter(~values.is_in(list(tokens))) if tokens else values
    texts = rest.to_list()
    simple: tuple[tuple[ColumnTypeName, pl.DataType], ...] = (
        ("int64", pl.Int64()), ("float64", pl.Float64()), ("bool", pl.Boolean()))
    for kind, dtype in simple:
        parses = parser_for(kind)
        if texts and all(parses(text) for text in texts):
            return ProposedColumn(name, dtype, kind, tokens=_needed(tokens, kind))
    found = _date_format(rest)
    if found is not None:
        temporal, fmt = found
        return ProposedColumn(name, pl.Date() if temporal == "date" else pl.Datetime("us"), temporal, fmt,
                              _needed(tokens, temporal))
    return ProposedColumn(name, pl.String(), "string")


def _needed(tokens: tuple[str, ...], kind: str) -> tuple[str, ...]:
    """The tokens that must be listed as missing for `kind` (a float reads NaN itself)."""
    return tuple(token for token in tokens if not (kind == "float64" and token.lower() == "nan"))


def _date_format(values: pl.Series) -> tuple[str, str | None] | None:
    """("date" or "datetime", the format, None for the ISO default) every value parses with."""
    if not values.len():
        return None
    for fmt in DATE_FORMATS:
        if values.str.to_date(fmt, strict=False).null_count() == 0:
            return "date", None if fmt == ISO_DATE else fmt
    for form in DATETIME_FORMATS:
        text = values.str.replace("T", " ", literal=True) if form is None else values
        if text.str.to_datetime(form or ISO_DATETIME, time_unit="us", strict=False).null_count() == 0:
            return "datetime", form
    return None

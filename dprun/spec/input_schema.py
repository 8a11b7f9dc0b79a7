"""Check a spec against its inputs' schemas without reading data rows.

A schema is what the files and the spec declare, never what data rows suggest
(docs/privacy.md, "What the plan reads"): Parquet's comes from the file footers;
a CSV file's column names from its header and their types from the spec (`columns`,
else float64 for a column a metric takes values from, else text); an NDJSON
file's columns and types from `columns` alone. No message here quotes a value
from a data file: Polars' own messages can, so they are never passed on.
"""

from __future__ import annotations

import csv
import glob
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Literal, Protocol, TextIO

import polars as pl

from dprun.errors import DataError
from dprun.spec.input_paths import (
    local_path,
    local_pattern,
    partition_root,
    partition_values,
    resolve_paths,
    url_problem,
    url_scheme,
)
from dprun.spec.models import (
    CSV_OPTIONS,
    KINDS_WITH_VALUES,
    ColumnType,
    InputSpec,
    Join,
    PublicColumn,
    Query,
    Scalar,
    Spec,
)
from dprun.spec.row_expressions import (
    NotRowWise,
    date_format_problem,
    first_line,
    parse_row_expression,
    row_filter,
)
from dprun.spec.rules import Finding
from dprun.spec.yaml_loader import FieldPath

if TYPE_CHECKING:
    import _csv

# The rows `validate` checks value by value (`strict_rows`), and `dprun init` infers types from.
SCHEMA_SAMPLE_ROWS = 1000
# The engines' own columns begin with this; a spec's column may not.
INTERNAL_PREFIX = "__dprun_"
FORMAT_UNKNOWN = "cannot tell the format from the suffix; set `format: csv | parquet | ndjson`"
# Said where a text column may have surprised the user.
TEXT_NOTE = "; a CSV column is read as text unless the input's `columns:` gives its type (e.g. `columns: {n: int64}`)"
SUFFIX_FORMATS = {".csv": "csv", ".parquet": "parquet", ".pq": "parquet", ".ndjson": "ndjson", ".jsonl": "ndjson"}


# The types a spec's `columns` can give, as Polars types (dates are read as text, then parsed).
# Without a format, a date is `%Y-%m-%d` and a datetime the same, a `T` or a blank, then
# `%H:%M:%S` with an optional fraction: a fixed format, never one guessed from the values.
ISO_DATE = "%Y-%m-%d"
ISO_DATETIME = "%Y-%m-%d %H:%M:%S%.f"
COLUMN_TYPES: dict[str, pl.DataType] = {
    "int64": pl.Int64(), "float64": pl.Float64(), "string": pl.String(), "bool": pl.Boolean(),
    "date": pl.Date(), "datetime": pl.Datetime("us"),
}


@dataclass(frozen=True)
class InputInfo:
    """An input as validated: its files, format, how to read them, and the schema of its files
    (derived columns included). What a query reads may also join other inputs to it (`joins`):
    `joined_schema` is then what the query sees."""

    name: str
    paths: tuple[Path, ...]
    format: str
    schema: dict[str, pl.DataType]
    reading: InputSpec
    joins: tuple[Joined, ...] = ()
    base_dir: Path | None = None  # the spec's folder, which a relative `path` is relative to
    # Columns from Hive partition folders (`day=3/`) below `partition_root`, outermost first.
    partitions: tuple[str, ...] = ()
    partition_root: Path | None = None
    # Read by Spark (`--engine spark`) from this URL rather than from `paths` (then empty).
    url: str | None = None
    url_base: str | None = None
    listing: tuple[tuple[str, int, int], ...] = ()  # (file URL, bytes, modification time in ms)

    def partition_values(self, path: Path) -> list[tuple[str, str | None]]:
        """One file's value of each partition column, as text (None: Hive's null folder)."""
        assert self.partition_root is not None, "an input with partition columns"
        found = partition_values(path, self.partition_root)
        assert found is not None and [name for name, _ in found] == list(self.partitions), "checked by validate"
        return found

    def shown(self, path: Path) -> str:
        """One of the input's files as the spec names it: its `path` as written, or for a glob or a
        folder the file relative to the spec's folder (absolute where the spec wrote an absolute path).
        Partition folders' values are data: shown as `name=…`."""
        pattern = self.reading.path
        if not glob.has_magic(pattern) and len(self.paths) == 1 and not self.partitions:
            return pattern
        if self.partition_root is not None:
            masked = [f"{folder.partition('=')[0]}=…" for folder in path.relative_to(self.partition_root).parts[:-1]]
            path = self.partition_root.joinpath(*masked, path.name)
        if self.base_dir is None or Path(pattern).is_absolute() or url_scheme(pattern) is not None:
            return str(path)
        return os.path.relpath(path, self.base_dir)

    @property
    def joined_schema(self) -> dict[str, pl.DataType]:
        schema = dict(self.schema)
        for joined in self.joins:
            schema |= {name: dtype for name, dtype in joined.info.schema.items() if name not in joined.on}
        return schema


@dataclass(frozen=True)
class Joined:
    """An input joined on `on` (`how`: inner or left) to a query's private input: a public lookup,
    whose `on` columns are unique, or a private input joined on the privacy unit."""

    info: InputInfo
    on: tuple[str, ...]
    how: Literal["inner", "left"]

    @property
    def public(self) -> bool:
        return self.info.reading.public


def lookup_table(lookup: Joined) -> pl.DataFrame:
    """The whole lookup table (it is public), checked again for unique join keys: the file may have
    changed since `validate`, and a duplicate key would count a person's rows twice."""
    table = scan(lookup.info).collect()
    if table.select(pl.struct(list(lookup.on)).is_duplicated().any()).item():
        raise DataError(f"input '{lookup.info.name}': the join column(s) {', '.join(lookup.on)} are not unique; "
                        "a duplicate key would count a person's rows twice")
    return table


def input_format(path: str, declared: str | None) -> str | None:
    if declared is not None:
        return declared
    return SUFFIX_FORMATS.get(Path(path.rstrip("*")).suffix.lower())


def scan(info: InputInfo) -> pl.LazyFrame:
    """A lazy scan of an input with the schema fixed at validation time, its columns typed
    and its derived columns added (its joins are the engines' to run)."""
    types = info.reading.column_types()
    read_as = {name: (pl.String() if types.get(name) and _parsed(types[name]) else dtype)
               for name, dtype in info.schema.items()
               if name not in info.reading.derive and name not in info.partitions}
    if info.partitions:
        # Each file with its folders' values as text columns, which the spec's `columns` types as any text.
        frame = pl.concat([_scan((path,), info.format, info.reading, read_as).with_columns(
            pl.lit(value, dtype=pl.String).alias(name) for name, value in info.partition_values(path))
            for path in info.paths], how="vertical")
    else:
        frame = _scan(info.paths, info.format, info.reading, read_as)
    return with_derived(_typed(frame, types), info.reading.derive)


def with_derived(frame: pl.LazyFrame, derive: dict[str, str]) -> pl.LazyFrame:
    """The frame with each derived column added in order, after the engines' row-wise check."""
    for name, text in derive.items():
        frame = frame.with_columns(row_filter(text, f"derive.{name}").alias(name))
    return frame


def derived_schema(schema: dict[str, pl.DataType], derive: dict[str, str],
                   at: FieldPath) -> tuple[dict[str, pl.DataType], list[Finding]]:
    """The schema with each derived column's type, or the first finding about one: a name
    taken, an expression that reads other rows, names an unknown column or does not apply."""
    schema = dict(schema)
    for name, text in derive.items():
        where: FieldPath = (*at, name)
        if name in schema:
            return schema, [(where, f"'{name}' is a column already; give the derived column another name")]
        if name.startswith(INTERNAL_PREFIX):
            return schema, [(where, f"names beginning with `{INTERNAL_PREFIX}` are dprun's own columns; rename it")]
        try:
            expression = parse_row_expression(text, "derived column")
        except NotRowWise as exc:
            return schema, [(where, str(exc))]
        missing = [column for column in expression.meta.root_names() if column not in schema]
        if missing:
            return schema, [(where, f"the derived column names unknown column(s) {', '.join(missing)}")]
        try:
            # Run on no rows: Polars checks some types (comparisons) only when it runs.
            schema[name] = pl.LazyFrame(schema=schema).with_columns(expression.alias(name)).collect().schema[name]
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
            # The expression is the spec's text, so Polars' message about it may be shown.
            return schema, [(where, f"the derived column does not apply: {first_line(str(exc))}"
                                    f"{_text_columns_note(expression, schema)}")]
    return schema, []


def query_schema(query: Query, info: InputInfo) -> dict[str, pl.DataType]:
    """The columns a query sees: its input's (derived ones included) and its own derived ones
    (`validate` has checked them)."""
    return derived_schema(info.joined_schema, query.derive, ("derive",))[0]


def read_schema(paths: tuple[Path, ...], fmt: str, reading: InputSpec,
                value_columns: frozenset[str] = frozenset()) -> dict[str, pl.DataType]:
    """The schema of the files (partition folders aside) the engines read with, from declarations only:
    Parquet's footer types; a CSV header's names, each column typed as the spec's `columns` says, else
    float64 where a metric takes its values (`value_columns`), else text; an NDJSON input's `columns`.
    No data row is read."""
    if fmt == "parquet":
        found = dict(pl.scan_parquet([str(p) for p in paths], hive_partitioning=False).collect_schema())
    elif fmt == "csv":
        names = _scan(paths, fmt, reading).collect_schema()
        found = {name: pl.Float64() if name in value_columns else pl.String() for name in names}
    else:
        found = {}
    # A typed column a CSV or Parquet input lacks is left to the caller to name (`inspect_inputs`).
    types = {name: kind for name, kind in reading.column_types().items() if fmt == "ndjson" or name in found}
    return found | {name: COLUMN_TYPES[kind.type] for name, kind in types.items()}


def _scan(paths: tuple[Path, ...], fmt: str, reading: InputSpec,
          schema: dict[str, pl.DataType] | None = None) -> pl.LazyFrame:
    """The files read with `schema`; without one, a CSV file's columns named by its header, all text."""
    sources = [str(p) for p in paths]
    if fmt == "parquet":
        # Partition folders are read by `scan`, below the input's own folder only (Polars' would read
        # every `name=value` folder of the path, from the root of the file system).
        return pl.scan_parquet(sources, hive_partitioning=False)
    if fmt == "csv":
        return pl.scan_csv(sources, schema=schema, infer_schema=False, separator=reading.separator,
                           quote_char=reading.quote_char, null_values=reading.null_values or None,
                           has_header=reading.has_header, encoding=reading.encoding,
                           comment_prefix=reading.comment_prefix)
    return pl.scan_ndjson(sources, schema=schema)


def _parsed(kind: ColumnType) -> bool:
    """Dates and datetimes are read as text and parsed with their format (strictly)."""
    return kind.type in ("date", "datetime")


def _typed(frame: pl.LazyFrame, types: dict[str, ColumnType]) -> pl.LazyFrame:
    """Every column the spec types, as that type."""
    conversions = [typed(pl.col(name), kind) for name, kind in types.items()]
    return frame.with_columns(conversions) if conversions else frame


def typed(column: pl.Expr, kind: ColumnType, strict: bool = True) -> pl.Expr:
    """A column as the type the spec gives it: dates parsed with their format (ISO 8601's
    without one), others cast; strictly (a value that does not convert is an error), or
    with `strict=False` as a null (`strict_rows` finds such values that way)."""
    text = column.cast(pl.String)
    if kind.type == "date":
        return text.str.to_date(kind.format or ISO_DATE, strict=strict)
    if kind.type == "datetime":
        if kind.format is None:
            text = text.str.replace("T", " ", literal=True)
        return text.str.to_datetime(kind.format or ISO_DATETIME, time_unit="us", strict=strict)
    return column.cast(COLUMN_TYPES[kind.type], strict=strict)


def _header_names_twice(paths: tuple[Path, ...], reading: InputSpec) -> list[str]:
    """Column names a CSV header repeats (Polars would rename the second one and read on)."""
    twice: set[str] = set()
    for path in paths:
        try:
            with path.open(encoding="utf-8-sig", errors="replace", newline="") as handle:
                header: list[str] = next((row for row in csv_rows(handle, reading) if row), [])
        except (OSError, csv.Error):
            continue  # Polars has read the schema; whatever fails here fails in the row check too
        twice |= {name for name in header if header.count(name) > 1}
    return sorted(twice)


# Python's csv module refuses a field longer than 131,072 characters by default; Polars reads
# any (free text, JSON in a column), so the row check must too.
csv.field_size_limit(sys.maxsize)


def csv_rows(handle: TextIO, reading: InputSpec) -> _csv.Reader:
    """The rows of a CSV text as Python's csv module reads them with the input's options
    (separator, quote, comment lines skipped as Polars skips them)."""
    quoting: Literal[0, 3] = csv.QUOTE_NONE if reading.quote_char is None else csv.QUOTE_MINIMAL
    lines: Iterable[str] = handle
    if reading.comment_prefix is not None:
        prefix = reading.comment_prefix
        # A comment line reads as an empty row, which every caller skips: line numbers stay true.
        lines = ("\n" if line.startswith(prefix) else line for line in handle)
    return csv.reader(lines, delimiter=reading.separator, quotechar=reading.quote_char or '"', quoting=quoting)


@dataclass(frozen=True)
class Located:
    """An input's files and format, found on this machine (`paths`) or by Spark (`url`: what Spark reads,
    with its files' `listing`), and its partition folders' columns."""

    fmt: str
    partitions: tuple[str, ...] = ()
    paths: tuple[Path, ...] = ()
    partition_root: Path | None = None
    url: str | None = None
    url_base: str | None = None  # Spark's `basePath` for a glob URL's partition folders
    listing: tuple[tuple[str, int, int], ...] = ()  # (file URL, bytes, modification time in ms)


class SparkInputs(Protocol):
    """Inputs named by a URL, found and their schemas read by Spark (`spark_engine.SparkInputReader`)."""

    def locate(self, declared: InputSpec) -> Located | str:
        """The input's files, or what is wrong."""

    def file_schema(self, located: Located, declared: InputSpec, value_columns: frozenset[str]
                    ) -> dict[str, pl.DataType] | str:
        """The schema of the files, partition folders aside (as `read_schema`), or what is wrong."""


def inspect_inputs(spec: Spec, base_dir: Path, spark_inputs: SparkInputs | None = None
                   ) -> tuple[dict[str, InputInfo], dict[str, InputInfo], list[Finding]]:
    """Every input's info, by input name; what each query reads (its input with its joins), by
    query name; and what is wrong. With `spark_inputs` (the Spark engine), a private input named by
    a URL is found and read by Spark."""
    infos: dict[str, InputInfo] = {}
    read: dict[str, InputInfo] = {}
    findings: list[Finding] = []
    value_columns = _value_columns(spec)
    for name, declared in spec.inputs.items():
        at: FieldPath = ("inputs", name, "path")
        scheme = url_scheme(declared.path)
        if spark_inputs is not None and declared.public and scheme not in (None, "file"):
            findings.append((at, "a public input is read whole on this machine, where its join keys are checked, "
                                 "also with --engine spark: give it a local path or a file:// URL"))
            continue
        by_spark = spark_inputs if spark_inputs is not None and scheme is not None and not declared.public else None
        located = _located(declared, base_dir) if by_spark is None else by_spark.locate(declared)
        if isinstance(located, str):
            findings.append((at, located))
            continue
        fmt, paths, partitions = located.fmt, located.paths, located.partitions
        misplaced = [option for option in CSV_OPTIONS if option in declared.model_fields_set]
        if fmt != "csv" and misplaced:
            findings.append((("inputs", name, misplaced[0]), f"`{misplaced[0]}` is a reading option for CSV "
                             f"inputs; this input is {fmt}"))
            continue
        if fmt == "ndjson" and not declared.columns:
            findings.append((("inputs", name), "an NDJSON file declares no schema: list the columns the spec reads "
                             "under `columns:` with their types (e.g. `columns: {user_id: string, amount: float64}`)"))
            continue
        if by_spark is not None:
            found = by_spark.file_schema(located, declared, value_columns.get(name, frozenset()))
            if isinstance(found, str):
                findings.append((at, found))
                continue
            schema = found
        else:
            try:
                schema = read_schema(paths, fmt, declared, value_columns.get(name, frozenset()))
            except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError) as exc:
                findings.append((at, f"cannot read the {fmt} schema ({type(exc).__name__}); is the file a valid "
                                 f"{fmt} file, and do its reading options fit it?"))
                continue
        # An NDJSON input's schema is its `columns`, which type the partition columns too.
        twice = [column for column in partitions if column in schema and fmt != "ndjson"]
        if twice:
            findings.append((at, f"column '{twice[0]}' is both in the files and a partition folder's name"))
            continue
        types = declared.column_types()
        schema |= {column: COLUMN_TYPES[types[column].type] if column in types else pl.String()
                   for column in partitions}
        unknown = [column for column in declared.columns if column not in schema]
        if unknown:
            findings.append((("inputs", name, "columns", unknown[0]), f"column '{unknown[0]}' is not in the input"))
            continue
        broken = [(column, problem) for column, kind in declared.column_types().items() if kind.format is not None
                  and (problem := date_format_problem(kind.format, kind.type == "datetime")) is not None]
        if broken:
            findings.append((("inputs", name, "columns", broken[0][0]), broken[0][1]))
            continue
        reserved = [column for column in schema if column.startswith(INTERNAL_PREFIX)]
        if reserved:
            findings.append((at, f"column '{reserved[0]}': names beginning with `{INTERNAL_PREFIX}` are dprun's own "
                                 "columns; rename it in the file"))
            continue
        units = [column for column in spec.privacy_unit_columns if column in schema]
        if declared.public and units:
            findings.append((("inputs", name, "public"), f"a public input holds no privacy unit, and this one has the "
                             f"column '{units[0]}': a file with the privacy unit is private (remove `public: true`)"))
            continue
        schema, derive_findings = derived_schema(schema, declared.derive, ("inputs", name, "derive"))
        if derive_findings:
            findings += derive_findings
            continue
        if not schema:
            findings.append((at, "the input has no columns (empty file?)"))
            continue
        twice = _header_names_twice(paths, declared) if fmt == "csv" and declared.has_header else []
        if twice:
            findings.append((at, f"the CSV header names column(s) {', '.join(twice)} more than once"))
            continue
        infos[name] = InputInfo(name, paths, fmt, schema, declared, base_dir=base_dir, partitions=partitions,
                                partition_root=located.partition_root, url=located.url, url_base=located.url_base,
                                listing=located.listing)
    for index, query in enumerate(spec.queries):
        info = infos.get(query.private_input)
        if info is not None and not isinstance(query.input, str):
            info, join_findings = _joined(query.input, info, infos)
            findings += [(("queries", index, "input", *path), message) for path, message in join_findings]
        if info is not None:
            read[query.name] = info
            findings += _query_columns(spec, query, info, ("queries", index))
            public = _public_file(query, base_dir)
            findings += [(("queries", index, *path), msg) for path, msg in public]
            if not public and query.partitions is not None and query.partitions.is_public:
                findings += [(("queries", index, *path), msg) for path, msg in _public_key_types(query, base_dir, info)]
    return infos, read, findings


def _located(declared: InputSpec, base_dir: Path) -> Located | str:
    """An input's files on this machine, or what is wrong."""
    problem = url_problem(declared.path)
    if problem is not None:
        return problem
    paths = resolve_paths(declared.path, base_dir)
    fmt = input_format(declared.path, declared.format) or files_format(paths)
    if fmt is None:
        return FORMAT_UNKNOWN
    if not paths:
        return f"no file matches '{declared.path}' (relative to the spec file's folder)"
    root = partition_root(declared.path, base_dir)
    partitions = partition_columns(paths, root)
    if partitions is None:
        return partitions_differ(declared.path)
    return Located(fmt, partitions, paths, root if partitions else None)


def partitions_differ(path: str) -> str:
    return (f"the files below '{path}' are not all in partition folders of the same columns (name=value folders, "
            "in the same order)")


def files_format(paths: Iterable[PurePath]) -> str | None:
    """The format all of a folder's files have by their suffix, or None (no files: None)."""
    formats = {SUFFIX_FORMATS.get(path.suffix.lower()) for path in paths}
    return formats.pop() if len(formats) == 1 else None


def partition_columns(paths: Iterable[PurePath], root: PurePath) -> tuple[str, ...] | None:
    """The columns of the files' Hive partition folders below `root`, or None where the files differ."""
    found = {tuple(name for name, _ in values) if (values := partition_values(path, root)) is not None else None
             for path in paths}
    columns = found.pop() if len(found) == 1 else None
    return None if columns is None or len(set(columns)) < len(columns) else columns


def _value_columns(spec: Spec) -> dict[str, frozenset[str]]:
    """By input name, the columns a metric of a query reading that input takes values from: a
    CSV input reads them as float64 unless `columns` types them."""
    found: dict[str, set[str]] = {}
    for query in spec.queries:
        names = [query.input] if isinstance(query.input, str) else query.input.join
        columns = {m.column for m in query.metrics if m.kind in KINDS_WITH_VALUES and m.column is not None}
        for name in names:
            found.setdefault(name, set()).update(columns)
    return {name: frozenset(columns) for name, columns in found.items()}


def _joined(join: Join, private: InputInfo, infos: dict[str, InputInfo]) -> tuple[InputInfo | None, list[Finding]]:
    """The private input with the inputs joined to it, after checking the join columns on every
    side and that every lookup's join keys are unique (read from the public file, before any
    private row)."""
    joins = []
    seen = dict(private.schema)  # the columns of the inputs joined so far
    for index, name in enumerate(join.join[1:], start=1):
        other = infos.get(name)
        if other is None:
            return None, []
        on = tuple(join.on_columns(name))
        at: FieldPath = ("on", name) if isinstance(join.on, dict) else ("on",)
        before = f"'{private.name}'" if index == 1 else f"the inputs before '{name}'"
        for where, schema in ((f"input {before}" if index == 1 else before, seen), (f"input '{name}'", other.schema)):
            missing = [column for column in on if column not in schema]
            if missing:
                return None, [(at, f"join column '{missing[0]}' is not in {where}")]
        for column in on:
            if seen[column] != other.schema[column]:
                note = TEXT_NOTE if pl.String() in (seen[column], other.schema[column]) else ""
                return None, [(at, f"join column '{column}' is {seen[column]} in {before} "
                                   f"but {other.schema[column]} in '{name}'{note}")]
        clash = sorted(c for c in other.schema if c not in on and c in seen)
        if clash:
            return None, [(("join", index), f"input '{name}' has a column '{clash[0]}' that an earlier input of the "
                                            "join has too: inputs of a join share only their join columns")]
        seen |= dict(other.schema)
        entry = Joined(other, on, join.how)
        if entry.public:
            try:
                lookup_table(entry)
            except DataError as exc:
                return None, [(("join", index), str(exc))]
            except (pl.exceptions.PolarsError, OSError) as exc:
                return None, [(("join", index), f"cannot read the lookup ({type(exc).__name__})")]
        joins.append(entry)
    return replace(private, name="+".join(join.join), joins=tuple(joins)), []


def _public_key_types(query: Query, base_dir: Path, info: InputInfo) -> list[Finding]:
    """Public keys must convert to the group_by columns' types (the keys are public: naming them is fine)."""
    schema = query_schema(query, info)
    if any(column not in schema for column in query.group_by):
        return []
    try:
        public_keys_frame(query, base_dir, schema, declared_types(info))
    except (pl.exceptions.PolarsError, ValueError, TypeError):
        types = ", ".join(f"{c}: {schema[c]}" for c in query.group_by)
        return [(("partitions", "public"), f"a public key does not convert to the group_by column types ({types})")]
    return []


def _query_columns(spec: Spec, query: Query, info: InputInfo, at: FieldPath) -> list[Finding]:
    schema, findings = derived_schema(info.joined_schema, query.derive, (*at, "derive"))
    if findings:
        return findings

    def need(column: str, where: FieldPath) -> None:
        if column not in schema:
            findings.append((where, f"column '{column}' is not in input '{info.name}' (query '{query.name}')"))

    for column in spec.privacy_unit_columns:
        need(column, ("privacy_unit",))
    for index, column in enumerate(query.group_by):
        need(column, (*at, "group_by", index))
    for index, metric in enumerate(query.metrics):
        if metric.column is None:
            continue
        need(metric.column, (*at, "metrics", index, "column"))
        if metric.kind in KINDS_WITH_VALUES and metric.column in schema:
            dtype = schema[metric.column]
            if not (dtype.is_numeric() or dtype == pl.Boolean):
                findings.append(
                    ((*at, "metrics", index, "column"), f"column '{metric.column}' is {dtype}, not numeric")
                )
    if query.filter is not None:
        findings += [((*at, *path), msg) for path, msg in _filter_findings(query.filter, schema, info.name)]
    return findings


def _filter_findings(text: str, schema: dict[str, pl.DataType], input_name: str) -> list[Finding]:
    try:
        expression = parse_row_expression(text)
    except NotRowWise as exc:
        return [(("filter",), str(exc))]
    missing = [name for name in expression.meta.root_names() if name not in schema]
    if missing:
        return [(("filter",), f"the filter names unknown column(s) {', '.join(missing)} of input '{input_name}'")]
    try:
        pl.LazyFrame(schema=schema).filter(expression).collect()  # on no rows, as for derived columns
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
        # The filter text comes from the spec, so Polars' message about it may be shown.
        return [(("filter",), f"the filter does not apply to input '{input_name}': {first_line(str(exc))}"
                              f"{_text_columns_note(expression, schema)}")]
    return []


def _text_columns_note(expression: pl.Expr, schema: dict[str, pl.DataType]) -> str:
    """Why a column an expression reads may be text: a CSV input's untyped columns are."""
    text = sorted({name for name in expression.meta.root_names() if schema.get(name) == pl.String})
    return f" ({', '.join(text)} {'is' if len(text) == 1 else 'are'} text){TEXT_NOTE}" if text else ""


def public_keys_frame(query: Query, base_dir: Path, schema: dict[str, pl.DataType],
                      kinds: dict[str, ColumnType]) -> pl.DataFrame:
    """The public partition keys as a frame with the group_by columns, typed like the input: a key
    written as text for a date or datetime column is parsed with the column's format (`kinds`: the
    spec's `columns` types; ISO 8601 without one)."""
    partitions = query.partitions
    assert partitions is not None and partitions.is_public
    if isinstance(partitions.public, dict):
        # Every combination: the cross join of each column's distinct values, in group_by order.
        frames = [_as_keys(_public_column(partitions.public[c], c, base_dir), [c], schema, kinds).unique(
            maintain_order=True) for c in query.group_by]
        frame = frames[0]
        for other in frames[1:]:
            frame = frame.join(other, how="cross")
        return frame
    if partitions.public is not None:
        rows = [key if isinstance(key, list) else [key] for key in partitions.public]
        columns = {col: [row[i] for row in rows] for i, col in enumerate(query.group_by)}
        frame = pl.DataFrame(columns, strict=False)
    else:
        frame = _key_file(partitions.public_file or "", base_dir).select(query.group_by)
    return _as_keys(frame, list(query.group_by), schema, kinds).unique(maintain_order=True)


def declared_types(info: InputInfo) -> dict[str, ColumnType]:
    """The spec's `columns` types of a query's input and of the inputs joined to it."""
    types: dict[str, ColumnType] = {}
    for source in (info, *(joined.info for joined in info.joins)):
        types |= source.reading.column_types()
    return types


def _as_keys(frame: pl.DataFrame, columns: list[str], schema: dict[str, pl.DataType],
             kinds: dict[str, ColumnType]) -> pl.DataFrame:
    """Key columns converted to the input's types, strictly."""
    conversions = []
    for column in columns:
        given, wanted = frame.schema[column], schema.get(column)
        if wanted is None or given == wanted:
            continue
        if given == pl.String and (wanted == pl.Date or isinstance(wanted, pl.Datetime)):
            kind = kinds.get(column)
            if kind is None or kind.type not in ("date", "datetime"):
                kind = ColumnType(type="date" if wanted == pl.Date else "datetime")
            conversions.append(typed(pl.col(column), kind).cast(wanted))
        else:
            conversions.append(pl.col(column).cast(wanted, strict=True))
    return frame.with_columns(conversions) if conversions else frame


def _public_column(values: list[Scalar] | PublicColumn, column: str, base_dir: Path) -> pl.DataFrame:
    if isinstance(values, list):
        return pl.DataFrame({column: values}, strict=False)
    return _key_file(values.file, base_dir).select(pl.col(values.column).alias(column))


def _key_file(name: str, base_dir: Path) -> pl.DataFrame:
    """A public key file, its values as written (CSV as text, so that they cast like inline keys)."""
    path = local_path(name, base_dir)
    return pl.read_parquet(path) if _is_parquet(path) else pl.read_csv(path, infer_schema_length=0)


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def _public_file(query: Query, base_dir: Path) -> list[Finding]:
    """Each public key file exists and holds the columns the keys are read from."""
    partitions = query.partitions
    if partitions is None:
        return []
    findings: list[Finding] = []
    for field, name, column in partitions.key_files():
        at: FieldPath = ("partitions", *field)
        problem = url_problem(name)
        if problem is not None:
            findings.append((at, problem))
            continue
        path = local_path(name, base_dir)
        if not path.is_file():
            findings.append((at, f"public partition file '{name}' not found"))
            continue
        try:
            if _is_parquet(path):
                columns = list(pl.read_parquet_schema(path))
            else:
                columns = list(pl.scan_csv(path, infer_schema_length=0).collect_schema())
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError) as exc:
            findings.append((at, f"cannot read the public partition file ({type(exc).__name__})"))
            continue
        missing = [c for c in (query.group_by if column is None else [column]) if c not in columns]
        if missing:
            kind = "group_by column(s)" if column is None else "column"
            findings.append((at, f"the public partition file lacks {kind} {', '.join(missing)}"))
    return findings

"""`dprun init DATAFILE`: a commented spec scaffolded from a data file's schema.

Only column names and types are used: Parquet's from the file footer; CSV's proposed from
its first rows (`scaffold_columns`: the narrowest type each column's values parse as, the
usual missing-value tokens set aside and listed under `null_values`), NDJSON's as Polars
infers them. The spec then declares those types under the input's `columns:` (a run never
infers a type from the data: the user reviews these). No value is read into the scaffold
or printed. What must come from domain knowledge rather than from the data, the privacy
unit, is left as the placeholder `FILL_IN`, so the scaffold fails validation, with a
message saying so, until the user fills it in; the bounds are `auto` (chosen with DP).
The metric suggestions put measures before columns named like identifiers, codes or
calendar fields.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import polars as pl

from dprun.errors import Problem, SpecError
from dprun.scaffold_columns import ProposedColumn, propose_csv, propose_from_schema
from dprun.small_files import UnreadableFile, read_small_file
from dprun.spec.input_schema import SCHEMA_SAMPLE_ROWS, input_format
from dprun.spec.yaml_loader import MAX_SPEC_BYTES

PLACEHOLDER = "FILL_IN"
PLACEHOLDER_MESSAGE = (
    f"`{PLACEHOLDER}` is a placeholder left by `dprun init`: replace it with a value from domain "
    "knowledge, never from the data (see the comment above it)"
)
_ID_LIKE = re.compile(r"(^|_)(id|uid|user|person|people|customer|client|visitor|account|member|patient|"
                      r"employee|email|device|household)s?($|_)|id$", re.IGNORECASE)


def _quote(text: str) -> str:
    """A YAML double-quoted scalar (JSON's escaping is valid YAML), safe in comments too."""
    return json.dumps(text, ensure_ascii=True)


def _identifier(text: str, fallback: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    if not name:
        return fallback
    return name if re.match(r"[A-Za-z_]", name) else f"_{name}"


def _type_name(dtype: pl.DataType) -> str:
    return re.sub(r"[^A-Za-z0-9_()\[\], ]", "", str(dtype))


def _proposals(path: Path, fmt: str) -> list[ProposedColumn]:
    """Parquet's footer types; CSV's proposed from its first rows (`scaffold_columns`); NDJSON's as
    Polars infers them from its first rows (for the user to review: `validate` and `run` read the
    types the spec declares)."""
    if fmt == "parquet":
        return propose_from_schema(dict(pl.scan_parquet(path).collect_schema()))
    if fmt == "csv":
        return propose_csv(path)
    return propose_from_schema(dict(pl.scan_ndjson(path, infer_schema_length=SCHEMA_SAMPLE_ROWS).collect_schema()))


def describe(path: Path, fmt: str | None = None) -> tuple[str, list[ProposedColumn]]:
    """The file's format and what `init` proposes for each column (names and types only)."""
    found = input_format(str(path), fmt)
    if found is None:
        raise SpecError([Problem(str(path), None, None, "",
                                 "cannot tell the format from the suffix; pass --format csv | parquet | ndjson")])
    if not path.is_file():
        raise SpecError([Problem(str(path), None, None, "", "data file not found")])
    try:
        columns = _proposals(path, found)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError) as exc:
        # Polars' own message may quote a value; never pass it on.
        raise SpecError([Problem(str(path), None, None, "",
                                 f"cannot read the {found} schema ({type(exc).__name__}); "
                                 f"is it a valid {found} file?")]) from None
    if not columns:
        raise SpecError([Problem(str(path), None, None, "", "the file has no columns (empty file?)")])
    return found, columns


def _metric_candidates(columns: list[ProposedColumn]) -> list[ProposedColumn]:
    """Numbers to sum or average: measures first (floats, then whole numbers), then the numbers whose
    names say identifier, code or calendar field, never the identifiers the unit candidates are."""
    numbers = [c for c in columns if c.kind in ("int64", "float64") and not _ID_LIKE.search(c.name)]
    return sorted(numbers, key=lambda c: (not c.is_measure_like, c.kind != "float64"))


def scaffold(data_path: Path, spec_path: Path | None = None, fmt: str | None = None, sql: bool = False) -> str:
    """The scaffold's text. Paths in it are relative to `spec_path`'s folder (else the working folder)."""
    found, columns = describe(data_path, fmt)
    base = (spec_path.resolve().parent if spec_path is not None else Path.cwd())
    relative = os.path.relpath(data_path.resolve(), base)
    stem = _identifier(data_path.name.split(".")[0], "data")
    keys = [c for c in columns if c.kind is not None and c.kind != "float64"]
    units = sorted(keys, key=lambda c: 0 if _ID_LIKE.search(c.name) else 1)
    # Categories first (text, dates, numbers named like codes or calendar fields), measures last.
    group_candidates = sorted((c for c in keys if not _ID_LIKE.search(c.name)),
                              key=lambda c: (c.is_measure_like, c.kind not in ("string", "bool", "date")))
    values = _metric_candidates(columns)

    def listing(chosen: list[ProposedColumn], limit: int = 12) -> str:
        shown = ", ".join(f"{_quote(c.name)} ({c.kind})" for c in chosen[:limit])
        more = f", and {len(chosen) - limit} more" if len(chosen) > limit else ""
        return (shown + more) or "(none)"

    types_from = ("types from the file footer" if found == "parquet"
                  else f"types proposed from the header and up to {SCHEMA_SAMPLE_ROWS} sample rows")
    lines = [
        f"# dprun spec scaffolded by `dprun init` from the column names and types of {_quote(relative)}",
        f"# ({found}; {types_from}).",
        "# No data value was read into this file.",
        "#",
        f"# Before running: replace every {PLACEHOLDER} below; `dprun validate` fails until you do.",
        "# Bounds are `auto`: dprun chooses them from the data with differential privacy, paid from",
        "# the query's budget (`dprun profile` shows the data's shape first). Or write bounds from",
        "# domain knowledge, NEVER computed from the data: such bounds leak it and void the privacy",
        "# guarantee. docs/spec.md documents every field.",
        "version: 1",
        f"name: {_quote(stem)}",
        "# The privacy unit: the column identifying whom the release protects (a person, a",
        "# customer account, ...). All rows with the same value are bounded together.",
        f"# Candidates: {listing(units)}",
        f"privacy_unit: {PLACEHOLDER}",
        "budget:",
        "  epsilon: 1.0       # the privacy loss of one release",
        "  delta: 1.0e-6      # 0 for pure DP (Laplace noise only)",
        "  accounting: basic  # or pld: tighter composition, less noise",
        "  # The most this dataset may spend over all releases, enforced with the ledger:",
        "  # lifetime: {epsilon: 10.0, delta: 1.0e-5}",
        "# A stable name for the dataset: all releases of specs with this id share its lifetime",
        "# budget. Without it, the dataset is identified by the fingerprints of its input files.",
        f"dataset: {_quote(stem)}",
        "# Every release is recorded here (an SQLite file relative to this one, or a postgresql://",
        "# URL for a ledger many CI runners share); a re-run of the same spec on the same data is",
        "# refused. Keep it safe and backed up: it is what stops a budget being spent twice (docs/ledger.md).",
        "ledger: dprun-ledger.db",
        "inputs:",
        f"  {stem}:",
        f"    path: {_quote(relative)}  # relative to this spec file",
        f"    format: {found}",
        *_missing_values(columns),
        *_declared_columns(columns, found),
        "queries:",
        f"  - name: {stem}",
        *(_sql_query if sql else _yaml_query)(stem, group_candidates, values, listing),
        "    output:",
        f"      path: out/{stem}.parquet  # relative to this spec file",
        "report: out/report.json  # the accounting report; report.md is written beside it",
    ]
    return "\n".join(lines) + "\n"


BOUNDS_COMMENT = [
    "    contribution_bounds:",
    "      # How many partitions (group_by keys; 1 without group_by) one privacy unit may",
    "      # contribute to, and how many of its rows count in each; the rest are dropped at random.",
    "      max_partitions_contributed: auto",
    "      max_contributions_per_partition: auto",
]


def _yaml_query(stem: str, groups: list[ProposedColumn], values: list[ProposedColumn],
                listing: Callable[[list[ProposedColumn]], str]) -> list[str]:
    lines = [
        f"    input: {stem}",
        "    # Partition by columns (e.g. categories, dates) to release one row per key. The keys",
        "    # are then selected privately unless listed under `partitions: {public: [...]}`.",
        f"    # Candidates: {listing(groups)}",
        f"    # group_by: [{_quote(groups[0].name) if groups else 'column'}]",
        *BOUNDS_COMMENT,
        "    metrics:",
        "      - {name: rows, kind: count}",
        "      - {name: people, kind: privacy_id_count}",
    ]
    if values:
        lines += [
            "      # Numbers to sum, measures first (columns named like identifiers, codes or calendar",
            "      # fields last). bounds: [lower, upper], the plausible range from domain knowledge, or",
            "      # `auto`; values outside are clamped. Other kinds: mean, variance, stddev, quantile",
            "      # (with q), median, min, max.",
        ]
        for index, (name, column) in enumerate(_sum_names(values)):
            metric = f"- {{name: {name}, kind: sum, column: {_quote(column.name)}, bounds: auto}}"
            lines.append(f"      {metric}" if index == 0 else f"      # {metric}")
    return lines


def _sql_query(stem: str, groups: list[ProposedColumn], values: list[ProposedColumn],
               listing: Callable[[list[ProposedColumn]], str]) -> list[str]:
    """The query as one SELECT (docs/spec.md, Queries in SQL); what SQL cannot say stays beside it."""
    sums = _sum_names(values)
    select = ["COUNT(*) AS rows", *(f"SUM({_sql_name(c.name)}) AS {name}" for name, c in sums[:1])]
    lines = [
        "    # Written in SQL: one SELECT … FROM … [WHERE …] [GROUP BY …]; docs/spec.md, Queries in SQL.",
        f"    # Group-by candidates: {listing(groups)}",
        f"    # Numbers to sum, measures first: {listing([c for _, c in sums])}",
        "    sql: |",
        f"      SELECT {', '.join(select)}",
        "      -- , COUNT(DISTINCT <the privacy unit>) AS people",
        f"      FROM {stem}",
        f"      -- GROUP BY {_sql_name(groups[0].name) if groups else 'column'}",
    ]
    if sums:
        lines += ["    # The range of each summed column, from domain knowledge (values outside are clamped),",
                  "    # or `auto`: chosen from the data with DP.",
                  f"    bounds: {{{_quote(sums[0][1].name)}: auto}}"]
    return [*lines, *BOUNDS_COMMENT]


def _sum_names(values: list[ProposedColumn]) -> list[tuple[str, ProposedColumn]]:
    """An output name per suggested column to sum (at most 12), unique and never `rows` or `people`."""
    used = {"rows", "people"}
    named = []
    for column in values[:12]:
        name = _identifier(column.name, "value") + "_sum"
        while name in used:
            name = f"{name}_"
        used.add(name)
        named.append((name, column))
    return named


def _sql_name(name: str) -> str:
    """A column name as SQL writes it: bare if it can be, else double-quoted."""
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else '"' + name.replace('"', '""') + '"'


def _missing_values(columns: list[ProposedColumn]) -> list[str]:
    """The input's `null_values`: every missing-value token a column's proposed type needs read as missing."""
    tokens = list(dict.fromkeys(token for column in columns for token in column.tokens))
    if not tokens:
        return []
    return ["    # Texts the file writes for a missing value (without them the columns marked below are text):",
            f"    null_values: [{', '.join(_quote(token) for token in tokens)}]"]


def _declared_columns(columns: list[ProposedColumn], fmt: str) -> list[str]:
    """The input's `columns:` lines (CSV and NDJSON): the proposed types, for the user to check, and
    the columns Parquet's footer types (as comments: the footer declares them)."""
    if fmt == "parquet":
        return ["    # Columns (types from the file footer):",
                *[f"    #   {_quote(c.name)}: {_type_name(c.dtype)}" for c in columns]]
    if not any(c.kind for c in columns):
        return []
    lines = ["    # The column types dprun reads with, proposed by `dprun init` from the first rows: check",
             "    # them (a CSV column not listed is read as text; an NDJSON input has these columns).",
             "    columns:"]
    for column in columns:
        if column.kind is None:
            lines.append(f"      # {_quote(column.name)}: {_type_name(column.dtype)} has no spec type; not read")
            continue
        kind = column.kind if column.format is None else f"{{type: {column.kind}, format: {_quote(column.format)}}}"
        why = (f"  # {', '.join(_quote(t) for t in column.tokens)} read as missing (`null_values`)"
               if column.tokens else "")
        lines.append(f"      {_quote(column.name)}: {kind}{why}")
    return lines


def placeholder_lines(text: str) -> list[tuple[int, int]]:
    """(line, column), 1-based, of every placeholder outside comments."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        content = _without_comment(line)
        for match in re.finditer(rf"\b{PLACEHOLDER}\b", content):
            found.append((number, match.start() + 1))
    return found


def _key_of(line: str) -> str:
    match = re.match(r"\s*(?:-\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*:", line)
    return match.group(1) if match else ""


def _without_comment(line: str) -> str:
    """The line up to a YAML comment: a `#` at its start or after a blank, outside quotes."""
    quote = ""
    escaped = False
    for index, char in enumerate(line):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\" and quote == '"':
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "\"'" and (index == 0 or line[index - 1] in " \t[{,:"):
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index]
    return line


def explain_placeholders(spec_path: Path, problems: list[Problem]) -> list[Problem]:
    """Problems with those on placeholder lines reworded, and unreported placeholders added."""
    try:
        text = read_small_file(spec_path, MAX_SPEC_BYTES).decode("utf-8")
    except (UnreadableFile, UnicodeDecodeError):
        return problems
    at = placeholder_lines(text)
    if not at:
        return problems
    lines = {line for line, _ in at}
    explained = [
        Problem(p.file, p.line, p.column, p.field, PLACEHOLDER_MESSAGE) if p.line in lines else p for p in problems
    ]
    reported = {p.line for p in explained}
    text_lines = text.splitlines()
    explained += [Problem(str(spec_path), line, column, _key_of(text_lines[line - 1]), PLACEHOLDER_MESSAGE)
                  for line, column in at if line not in reported]
    unique: list[Problem] = []
    for problem in sorted(explained, key=lambda p: (p.line or 0, p.column or 0)):
        if problem not in unique:
            unique.append(problem)
    return unique

"""Row-wise expressions: what a spec's `filter` may compute.

The privacy argument (docs/privacy.md) needs every decision about a privacy unit's rows
to depend on that unit's rows only. Polars SQL also accepts aggregates (`avg(x)`),
window functions (`count(*) over (...)`), row numbers and ranks, each computed over all
rows, so a filter using one could keep or drop one person's rows because of another
person's. This module parses the text with Polars and walks the expression tree Polars
builds (its JSON serialization, the only public view of the whole tree), allowing only
nodes on an explicit list: columns, scalar literals, arithmetic, comparisons, boolean
logic, CASE/WHEN, casts, and named scalar functions. Anything else is refused, including
a node this list does not know (a later Polars may add or rename nodes: then a filter is
refused, never let through).

`validate` calls `parse_row_expression` (for filters and derived columns) and both engines
call `row_filter` before they
scan, so the same check guards every path from a spec to the data.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import polars as pl

from dprun.errors import Problem, SpecError

PRIVACY_DOC = "see docs/privacy.md#filter-expressions"

# A sub-query can read files (`(SELECT ... FROM read_csv(...))`), and Polars opens them
# while parsing; so any SELECT is refused before the text reaches Polars.
SUBQUERY = re.compile(r"\bselect\b", re.IGNORECASE)

ROW_BINARY_OPERATORS = frozenset({
    "Eq", "NotEq", "Lt", "LtEq", "Gt", "GtEq", "EqValidity", "NotEqValidity",
    "Plus", "Minus", "Multiply", "Divide", "TrueDivide", "RustDivide", "FloorDivide", "Modulus",
    "And", "Or", "Xor", "LogicalAnd", "LogicalOr",
})

# Scalar functions, by the name Polars gives them in its expression tree (see
# `_function_name`); the SQL spellings that produce each are in docs/spec.md#filter.
ROW_FUNCTIONS = frozenset({
    # math
    "Abs", "Ceil", "Floor", "Exp", "Log", "Log1p", "Sign", "Atan2", "Pow.Sqrt", "Pow.Cbrt", "Pow.Generic",
    "Sql.Binary", "Sql.Round", "Sql.ToFloat",
    "Trigonometry.Sin", "Trigonometry.Cos", "Trigonometry.Tan", "Trigonometry.Cot",
    "Trigonometry.ArcSin", "Trigonometry.ArcCos", "Trigonometry.ArcTan",
    "Trigonometry.Degrees", "Trigonometry.Radians",
    # null handling and choosing between columns of the same row
    "Coalesce", "FillNull", "MaxHorizontal", "MinHorizontal",
    "Boolean.IsNull", "Boolean.IsNotNull", "Boolean.Not", "Boolean.IsNan", "Boolean.IsNotNan",
    "Boolean.IsFinite", "Boolean.IsInfinite",
    # membership in a literal list (`x IN (1, 2)`)
    "Sql.IsIn", "Boolean.IsIn",
    # strings
    "StringExpr.Uppercase", "StringExpr.Lowercase", "StringExpr.Titlecase", "StringExpr.LenChars",
    "StringExpr.LenBytes", "StringExpr.StartsWith", "StringExpr.EndsWith", "StringExpr.Contains",
    "StringExpr.Replace", "StringExpr.Reverse", "StringExpr.Slice", "StringExpr.StripChars",
    "StringExpr.StripCharsStart", "StringExpr.StripCharsEnd", "StringExpr.Normalize",
    "StringExpr.ConcatHorizontal", "StringExpr.Strptime", "StringExpr.Split", "StringExpr.Find",
    "StringExpr.PadStart", "StringExpr.PadEnd",
    "StructExpr.FieldByName", "ListExpr.Get", "ListExpr.Length", "ListExpr.Contains", "ListExpr.Join",
    # dates and times
    "TemporalExpr.Millennium", "TemporalExpr.Century", "TemporalExpr.Year", "TemporalExpr.IsoYear",
    "TemporalExpr.Quarter", "TemporalExpr.Month", "TemporalExpr.Week", "TemporalExpr.WeekDay",
    "TemporalExpr.Day", "TemporalExpr.OrdinalDay", "TemporalExpr.Hour", "TemporalExpr.Minute",
    "TemporalExpr.Second", "TemporalExpr.Millisecond", "TemporalExpr.Microsecond",
    "TemporalExpr.Nanosecond", "TemporalExpr.TimeStamp", "TemporalExpr.ToString",
    "TemporalExpr.OffsetBy",
})

MEMBERSHIP = frozenset({"Sql.IsIn", "Boolean.IsIn"})

# LPAD/RPAD: the length must be a literal this small (a column, or 10^9, would let one row exhaust memory).
PADDING = frozenset({"StringExpr.PadStart", "StringExpr.PadEnd"})
MAX_PAD_LENGTH = 10_000
# Bounds on an expression's text, checked before Polars parses it (`_too_large`).
MAX_EXPRESSION_CHARACTERS = 100_000
MAX_OPERATORS = 500  # a string concatenation of about 950 `||` crashed Polars (stack overflow)
_OPERATOR = re.compile(r"\b(?:and|or|xor|when)\b|[-+*/%<>=!|&^~]+", re.IGNORECASE)
_QUOTED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"")

# Why a refused node reads other rows, for the message; a node not named here is
# refused as "not on the list".
AGGREGATE = "aggregate function"
WINDOW = "window function"
POSITION = "row number, rank, shift or range"
REFUSED_NODES = {
    "Agg": AGGREGATE, "Len": AGGREGATE, "Quantile": AGGREGATE, "Correlation": AGGREGATE,
    "NullCount": AGGREGATE, "Boolean.Any": AGGREGATE, "Boolean.All": AGGREGATE,
    "StringExpr.ConcatVertical": AGGREGATE, "Implode": AGGREGATE,
    "Over": WINDOW, "Window": WINDOW, "Rolling": WINDOW,
    "Rank": POSITION, "Shift": POSITION, "Range": POSITION, "Gather": POSITION, "Slice": POSITION,
    "CumSum": POSITION, "CumProd": POSITION, "CumMin": POSITION, "CumMax": POSITION, "CumCount": POSITION,
    "Diff": POSITION,
    "Sort": "sorting", "SortBy": "sorting",
    "Unique": "compares rows with each other", "Boolean.IsUnique": "compares rows with each other",
    "Boolean.IsDuplicated": "compares rows with each other",
    "Boolean.IsFirstDistinct": "compares rows with each other",
    "Boolean.IsLastDistinct": "compares rows with each other",
    "Explode": "more than one output per row", "Selector": "more than one output per row",
}


class NotRowWise(ValueError):
    """An expression that is not a row expression; the message quotes the spec's text only."""


def parse_row_expression(text: str, role: str = "filter") -> pl.Expr:
    """The Polars expression for `text`, refused unless every node of it is row-wise.

    Raises NotRowWise with a message for the user naming the expression's `role`; the
    text comes from the spec, not the data, so it may be quoted (and so may the first line
    of Polars' message about a syntax error in it).
    """
    quoted = _quote(text)
    if SUBQUERY.search(text):
        raise NotRowWise(f"{quoted}: a {role} must be a row expression; sub-queries (SELECT) are not allowed")
    too_large = _too_large(text)
    if too_large is not None:
        raise NotRowWise(f"the {role} {too_large}")
    try:
        expression = pl.sql_expr(text)
        with _deep_json():
            tree = json.loads(expression.meta.serialize(format="json"))
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, ValueError) as exc:
        raise NotRowWise(f"the {role} is not a valid SQL expression: {first_line(str(exc))}") from None
    refusal = _refusal(tree, parent=None, position=0)
    if refusal is not None:
        raise NotRowWise(f"{quoted} {refusal}; a {role} must depend on its own row only ({PRIVACY_DOC})")
    return expression


def _too_large(text: str) -> str | None:
    """Why an expression is too large to parse safely, or None. Polars' SQL parser recurses once per
    operator of a chain (`a OR b OR …`): about 6,000 of them overflow its stack and kill the process
    (SIGSEGV, no message); 3,000 parse. So the text is bounded before Polars sees it."""
    if len(text) > MAX_EXPRESSION_CHARACTERS:
        return f"is longer than {MAX_EXPRESSION_CHARACTERS:,} characters; shorten it"
    operators = len(_OPERATOR.findall(_QUOTED.sub("''", text)))
    if operators > MAX_OPERATORS:
        return (f"has {operators:,} operators, more than the {MAX_OPERATORS:,} dprun parses; write a list of "
                "alternatives as `column IN (…)`, or derive a column in steps")
    return None


@contextmanager
def _deep_json() -> Iterator[None]:
    """Room for the JSON of a tree of MAX_OPERATORS operators (a few levels each): Python's json
    decoder recurses once per level."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * MAX_OPERATORS + 1000))
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


def row_filter(text: str, field: str = "filter") -> pl.Expr:
    """`parse_row_expression` for the engines: a refusal is a SpecError (exit 1) at `field`
    (`filter`, or `derive.<name>` for a derived column)."""
    try:
        return parse_row_expression(text, "filter" if field == "filter" else "derived column")
    except NotRowWise as exc:
        raise SpecError([Problem(file="", line=None, column=None, field=field, message=str(exc))]) from None


Children = list[tuple[Any, str | None, int]]  # (node, the function it is an input of, its position)


def _refusal(node: Any, parent: str | None, position: int) -> str | None:
    """Why `node` (a serialized Polars expression) is not row-wise, or None if it is: the first
    refused node, depth first and left to right, walked with a stack of its own (a filter of
    hundreds of `OR` terms is a tree that deep, beyond Python's recursion limit)."""
    pending: Children = [(node, parent, position)]
    while pending:
        current, within, place = pending.pop()
        verdict = _node_verdict(current, within, place)
        if isinstance(verdict, str):
            return verdict
        pending.extend(reversed(verdict))
    return None


def _node_verdict(node: Any, parent: str | None, position: int) -> str | Children:
    """Why this node alone is refused, or the children to check next."""
    if isinstance(node, str):
        return _refused(node)
    if not isinstance(node, dict) or len(node) != 1:
        return _refused("an unrecognised expression")
    ((kind, body),) = node.items()
    if kind == "Column":
        return [] if isinstance(body, str) else _refused("Column")
    if kind == "Literal":
        refusal = _literal_refusal(body, parent, position)
        return [] if refusal is None else refusal
    if not isinstance(body, dict):
        return _refused(kind)
    if kind == "BinaryExpr":
        if body.get("op") not in ROW_BINARY_OPERATORS:
            return _refused(f"the operator {body.get('op')}")
        return _children([body.get("left"), body.get("right")], None)
    if kind == "Ternary":
        return _children([body.get("predicate"), body.get("truthy"), body.get("falsy")], None)
    if kind == "Cast":
        dtype = body.get("dtype")
        if not (isinstance(dtype, dict) and set(dtype) == {"Literal"}):
            return _refused("a cast to a computed type")
        return _children([body.get("expr")], None)
    if kind == "Function":
        name = _function_name(body.get("function"))
        if name not in ROW_FUNCTIONS:
            return _refused(name)
        if name == "StringExpr.Strptime":
            fmt = _strptime_format(body.get("function"))
            if fmt is None:
                return ("parses a date or time without a format, which Polars then guesses from the first value "
                        "it reads (another person's row); give the format, e.g. date(s, '%Y-%m-%d') or "
                        "timestamp(s, '%Y-%m-%d %H:%M:%S')")
            problem = date_format_problem(fmt, with_time=True)
            if problem is not None:
                return f"parses with a format that does not work: {problem}"
        inputs = body.get("input")
        if name in PADDING and not _small_literal(inputs[1] if isinstance(inputs, list) and len(inputs) > 1 else None):
            return (f"pads to a length that is not a whole-number literal of at most {MAX_PAD_LENGTH:,} (one row "
                    "could ask for more memory than the machine has); write the length as a number")
        return _children(inputs if isinstance(inputs, list) else [None], name)
    return _refused(kind)


def _small_literal(node: Any) -> bool:
    """A literal whole number from 0 to MAX_PAD_LENGTH."""
    try:
        value = node["Literal"]["Dyn"]["Int"]
    except (KeyError, TypeError):
        return False
    return isinstance(value, int) and 0 <= value <= MAX_PAD_LENGTH


def _children(nodes: list[Any], parent: str | None) -> Children:
    return [(child, parent, position) for position, child in enumerate(nodes)]


def date_format_problem(fmt: str, with_time: bool) -> str | None:
    """Why Polars cannot read dates (or datetimes) written in `fmt`, or None: a fixed instant is
    written with the format and read back (chrono accepts any format string and then reads no
    value, which would be blamed on the data)."""
    instant = datetime.datetime(2001, 2, 3, 4, 5, 6, 789000)
    try:
        text = pl.select(pl.lit(instant).dt.strftime(fmt)).item()
        parsed = pl.lit(text).str.to_datetime(fmt, strict=False) if with_time else \
            pl.lit(text).str.to_date(fmt, strict=False)
        back = pl.select(parsed).item()
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
        back = None
    if back is None:
        return (f"the format '{fmt}' cannot read back a date it writes: check its directives (chrono's "
                "strftime, e.g. %Y-%m-%d, %d/%m/%Y %H:%M:%S%.f)")
    return None


def _strptime_format(function: Any) -> str | None:
    """The literal format of a serialized Strptime function ({"StringExpr": {"Strptime": [dtype,
    options]}}), or None where it has none (or the shape is not that one: then refused)."""
    try:
        options = function["StringExpr"]["Strptime"][1]
    except (KeyError, IndexError, TypeError):
        return None
    fmt = options.get("format") if isinstance(options, dict) else None
    return fmt if isinstance(fmt, str) else None


def _literal_refusal(body: Any, parent: str | None, position: int) -> str | None:
    if isinstance(body, dict) and len(body) == 1:
        ((variant, _),) = body.items()
        if variant in ("Dyn", "Scalar"):
            return None
        # A list literal is row-wise only as the list a value is looked up in (`x IN (1, 2)`);
        # as a column of its own it would pair rows with list items by position.
        if variant == "Series" and parent in MEMBERSHIP and position == 1:
            return None
    return _refused("a list literal outside IN (...)")


def _function_name(function: Any) -> str:
    """Polars' name for a function node: `Abs`, `StringExpr.Uppercase`, `Sql.Round`, `Rank`.

    A function is serialized as a bare name, or as {category: name}, or as
    {category: {name: options}}; a struct of options (lower-case keys) is not a name.
    """
    if isinstance(function, str):
        return function
    if not (isinstance(function, dict) and len(function) == 1):
        return "an unrecognised function"
    ((category, detail),) = function.items()
    if isinstance(detail, str):
        return f"{category}.{detail}"
    if isinstance(detail, dict) and len(detail) == 1:
        (name,) = detail
        if name[:1].isupper():
            return f"{category}.{name}"
    return category


def _refused(name: str) -> str:
    for key in (name, name.split(".")[0]):
        if key in REFUSED_NODES:
            return f"reads other rows ({REFUSED_NODES[key]})"
    return f"uses {name}, which is not on dprun's list of row-wise operations (docs/spec.md#filter)"


def _quote(text: str, limit: int = 80) -> str:
    flat = " ".join(text.split())
    return f"'{flat if len(flat) <= limit else flat[: limit - 1] + '…'}'"


def first_line(message: str) -> str:
    stripped = message.strip()
    return stripped.splitlines()[0] if stripped else "invalid expression"

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

import json
import re
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
    try:
        expression = pl.sql_expr(text)
        tree = json.loads(expression.meta.serialize(format="json"))
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, ValueError) as exc:
        raise NotRowWise(f"the {role} is not a valid SQL expression: {first_line(str(exc))}") from None
    refusal = _refusal(tree, parent=None, position=0)
    if refusal is not None:
        raise NotRowWise(f"{quoted} {refusal}; a {role} must depend on its own row only ({PRIVACY_DOC})")
    return expression


def row_filter(text: str, field: str = "filter") -> pl.Expr:
    """`parse_row_expression` for the engines: a refusal is a SpecError (exit 1) at `field`
    (`filter`, or `derive.<name>` for a derived column)."""
    try:
        return parse_row_expression(text, "filter" if field == "filter" else "derived column")
    except NotRowWise as exc:
        raise SpecError([Problem(file="", line=None, column=None, field=field, message=str(exc))]) from None


def _refusal(node: Any, parent: str | None, position: int) -> str | None:
    """Why `node` (a serialized Polars expression) is not row-wise, or None if it is."""
    if isinstance(node, str):
        return _refused(node)
    if not isinstance(node, dict) or len(node) != 1:
        return _refused("an unrecognised expression")
    ((kind, body),) = node.items()
    if kind == "Column":
        return None if isinstance(body, str) else _refused("Column")
    if kind == "Literal":
        return _literal_refusal(body, parent, position)
    if not isinstance(body, dict):
        return _refused(kind)
    if kind == "BinaryExpr":
        if body.get("op") not in ROW_BINARY_OPERATORS:
            return _refused(f"the operator {body.get('op')}")
        return _first_refusal([body.get("left"), body.get("right")], None)
    if kind == "Ternary":
        return _first_refusal([body.get("predicate"), body.get("truthy"), body.get("falsy")], None)
    if kind == "Cast":
        dtype = body.get("dtype")
        if not (isinstance(dtype, dict) and set(dtype) == {"Literal"}):
            return _refused("a cast to a computed type")
        return _refusal(body.get("expr"), None, 0)
    if kind == "Function":
        name = _function_name(body.get("function"))
        if name not in ROW_FUNCTIONS:
            return _refused(name)
        if name == "StringExpr.Strptime" and _strptime_format(body.get("function")) is None:
            return ("parses a date or time without a format, which Polars then guesses from the first value it "
                    "reads (another person's row); give the format, e.g. date(s, '%Y-%m-%d') or "
                    "timestamp(s, '%Y-%m-%d %H:%M:%S')")
        inputs = body.get("input")
        return _first_refusal(inputs if isinstance(inputs, list) else [None], name)
    return _refused(kind)


def _strptime_format(function: Any) -> str | None:
    """The literal format of a serialized Strptime function ({"StringExpr": {"Strptime": [dtype,
    options]}}), or None where it has none (or the shape is not that one: then refused)."""
    try:
        options = function["StringExpr"]["Strptime"][1]
    except (KeyError, IndexError, TypeError):
        return None
    fmt = options.get("format") if isinstance(options, dict) else None
    return fmt if isinstance(fmt, str) else None


def _first_refusal(children: list[Any], parent: str | None) -> str | None:
    for position, child in enumerate(children):
        refusal = _refusal(child, parent, position)
        if refusal is not None:
            return refusal
    return None


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

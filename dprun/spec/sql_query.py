"""Queries written in SQL, compiled into the spec's own query fields before anything is validated.

A query may give `sql:` (one `SELECT … FROM … [WHERE …] GROUP BY … [HAVING …] [ORDER BY …]
[LIMIT …]`) instead of `input`, `derive`, `filter`, `group_by` and `metrics`. This module turns
the statement into exactly those fields, so that the query is then validated, planned and run
as the same query written in YAML would be: nothing about SQL reaches the planner or the
engines. What SQL cannot say stays in YAML beside it: value `bounds` per column,
`metric_options` per output column (budget_share, noise, clamp, quantile settings),
contribution bounds, partitions, output. HAVING, ORDER BY and LIMIT act on the released
values, after the noise (`postprocess`: post-processing, free of budget).

The statement is parsed with sqlglot (pure Python, well kept, many dialects, positions of
identifiers), read as DuckDB's dialect, whose aggregates and `WITHIN GROUP` match what data
engineers write; expressions are written back in PostgreSQL's dialect, which Polars SQL
reads, and then face the same row-wise checks as a YAML filter. Everything that is not a
release of aggregates of one input's rows is refused with where it is in the statement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from dprun.spec.rules import percent_text

DIALECT = "duckdb"
WRITTEN = "postgres"
# Options a metric written in SQL may take from `metric_options`, by its output column's name.
METRIC_OPTIONS = frozenset({"budget_share", "noise", "clamp", "quantile_method", "candidates", "branching", "depth",
                            "unit"})
# Query fields that SQL writes itself: a query with `sql` may not give them.
COMPILED_FIELDS = ("input", "derive", "filter", "group_by", "metrics", "postprocess")


class SqlRefused(ValueError):
    """Why a statement is not a query dprun runs, and where in it (1-based line and column)."""

    def __init__(self, message: str, line: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message, self.line, self.column = message, line, column


@dataclass(frozen=True)
class _Aggregate:
    kind: str
    column: str | None
    q: float | None = None


def compile_query(sql: str, query: dict[str, Any], unit: list[str]) -> tuple[dict[str, Any], dict[tuple[Any, ...],
                                                                                                  tuple[int, int]]]:
    """The YAML fields the statement stands for (`COMPILED_FIELDS`), and where in the statement each
    compiled field comes from, as (line, column) by its path below the query."""
    statement = _parse(sql)
    fields: dict[str, Any] = {}
    where: dict[tuple[Any, ...], tuple[int, int]] = {}
    fields["input"] = _input(statement, query, where)
    group_by, derive = _grouping(statement, where)
    metrics, aggregates = _metrics(statement, group_by, unit, query, where)
    fields.update(group_by=group_by, metrics=metrics)
    if derive:
        fields["derive"] = derive
    condition = statement.args.get("where")
    if condition is not None:
        _refuse_aggregates(condition.this, "WHERE")
        fields["filter"] = condition.this.sql(dialect=WRITTEN)
        where[("filter",)] = _position(condition)
    post = _postprocess(statement, aggregates, group_by, {m["name"] for m in metrics})
    if post:
        fields["postprocess"] = post
    return fields, where


def _parse(sql: str) -> exp.Select:
    try:
        statements = [s for s in sqlglot.parse(sql, read=DIALECT) if s is not None]
    except sqlglot.errors.ParseError as exc:
        error = exc.errors[0] if exc.errors else {}
        raise SqlRefused(f"the SQL does not parse: {error.get('description', 'a syntax error')}",
                         error.get("line") or 1, error.get("col") or 1) from None
    except sqlglot.errors.SqlglotError as exc:  # a tokenizer error: an unterminated quote, say
        raise SqlRefused(f"the SQL does not parse: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise SqlRefused("give one SELECT statement (a query releases one table)")
    statement = statements[0]
    if isinstance(statement, exp.SetOperation):
        raise SqlRefused("UNION, INTERSECT and EXCEPT are not supported: each query releases one aggregate of "
                         "one input; write the parts as separate queries", *_position(statement))
    if not isinstance(statement, exp.Select):
        raise SqlRefused(f"only SELECT is supported, not {statement.key.upper()}")
    if statement.args.get("with_"):
        raise SqlRefused("WITH (a common table expression) is a sub-query: name the input in FROM and derive "
                         "columns under `derive:` instead", *_position(statement.args["with_"]))
    if statement.args.get("distinct"):
        raise SqlRefused("SELECT DISTINCT releases the distinct keys themselves, which is partition selection: "
                         "use GROUP BY with COUNT(DISTINCT <privacy unit>) instead")
    for node in statement.find_all(exp.Subquery, exp.Exists):
        raise SqlRefused("a sub-query reads rows other than the row at hand; a query reads one input, joined "
                         "with FROM … JOIN", *_position(node))
    for node in statement.find_all(exp.Select):
        if node is not statement:
            raise SqlRefused("a sub-query reads rows other than the row at hand", *_position(node))
    for node in statement.find_all(exp.Window):
        raise SqlRefused("a window function (OVER …) reads other rows: one person's rows would change another's "
                         "value", *_position(node))
    return statement


def _input(statement: exp.Select, query: dict[str, Any], where: dict[tuple[Any, ...], tuple[int, int]]) -> Any:
    """FROM's input, or a join of inputs (USING or ON equal columns), as the spec's `input`."""
    source = statement.args.get("from_")
    if source is None:
        raise SqlRefused("FROM is missing: name the spec's input the query reads")
    first = _table(source.this)
    where[("input",)] = _position(source)
    joins = statement.args.get("joins") or []
    if not joins:
        return first
    names, on, how = [first], {}, set()
    for join in joins:
        name = _table(join.this)
        side = (join.args.get("side") or "").upper()
        kind = (join.args.get("kind") or "").upper()
        if kind in ("CROSS", "SEMI", "ANTI") or side in ("RIGHT", "FULL"):
            raise SqlRefused(f"{' '.join(p for p in (side, kind) if p) or 'this'} JOIN cannot be bounded: dprun "
                             "joins lookups and private inputs to the first input (JOIN or LEFT JOIN)",
                             *_position(join))
        how.add("left" if side == "LEFT" else "inner")
        on[name] = _join_columns(join)
        names.append(name)
    if len(how) > 1:
        raise SqlRefused("mix of JOIN and LEFT JOIN: dprun applies one kind of join to all inputs",
                         *_position(joins[-1]))
    columns = list(on.values())
    join_spec: dict[str, Any] = {"join": names, "on": columns[0] if all(c == columns[0] for c in columns) else on,
                                 "how": how.pop()}
    if "max_rows_per_unit" in query:
        join_spec["max_rows_per_unit"] = query["max_rows_per_unit"]
    return join_spec


def _table(node: exp.Expression) -> str:
    if not isinstance(node, exp.Table) or node.args.get("db") or node.args.get("catalog"):
        raise SqlRefused("FROM and JOIN name the spec's inputs, by name", *_position(node))
    return str(node.name)


def _join_columns(join: exp.Join) -> list[str]:
    """USING (a, b), or ON x.a = y.a AND …: the same column names on both sides."""
    using = join.args.get("using")
    if using:
        return [str(identifier.name) for identifier in using]
    condition = join.args.get("on")
    parts = list(condition.flatten()) if isinstance(condition, exp.And) else [condition]
    columns = []
    for part in parts:
        if not (isinstance(part, exp.EQ) and isinstance(part.this, exp.Column) and isinstance(part.expression, exp.Column)
                and part.this.name == part.expression.name):
            raise SqlRefused("a join must be on equal columns of the same name (USING (…), or ON a.x = b.x): "
                             "other conditions cannot be bounded", *_position(join))
        columns.append(str(part.this.name))
    return columns


def _grouping(statement: exp.Select,
              where: dict[tuple[Any, ...], tuple[int, int]]) -> tuple[list[str], dict[str, str]]:
    """GROUP BY's columns, and a derived column for each grouped expression (named by its alias in
    the SELECT list)."""
    group = statement.args.get("group")
    if group is None:
        return [], {}
    aliases = {str(e.alias): e.this for e in statement.expressions if isinstance(e, exp.Alias)}
    columns: list[str] = []
    derive: dict[str, str] = {}
    for index, node in enumerate(group.expressions):
        if isinstance(node, exp.Literal):
            raise SqlRefused("GROUP BY by position: name the column or its alias", *_position(node))
        if isinstance(node, exp.Column) and node.name in aliases and not isinstance(aliases[node.name], exp.Column):
            name = str(node.name)
            derive[name] = _row_expression(aliases[name], "GROUP BY")
        elif isinstance(node, exp.Column):
            name = str(node.name)
        else:
            name = next((alias for alias, value in aliases.items() if value == node), "")
            if not name:
                raise SqlRefused("a grouped expression needs a name: give it an alias in the SELECT list and "
                                 "GROUP BY the alias", *_position(node))
            derive[name] = _row_expression(node, "GROUP BY")
        where[("group_by", index)] = _position(node)
        columns.append(name)
    return columns, derive


def _row_expression(node: exp.Expression, clause: str) -> str:
    _refuse_aggregates(node, clause)
    return node.sql(dialect=WRITTEN)


def _refuse_aggregates(node: exp.Expression, clause: str) -> None:
    for inner in node.find_all(exp.AggFunc):
        raise SqlRefused(f"an aggregate in {clause} reads other rows: a {clause} expression is computed from its "
                         "own row", *_position(inner))


def _metrics(statement: exp.Select, group_by: list[str], unit: list[str], query: dict[str, Any],
             where: dict[tuple[Any, ...], tuple[int, int]]) -> tuple[list[dict[str, Any]], dict[_Aggregate, str]]:
    """A metric per aggregate of the SELECT list, named by its alias; the grouped columns checked."""
    bounds = query.get("bounds") or {}
    options = query.get("metric_options") or {}
    metrics: list[dict[str, Any]] = []
    released: dict[_Aggregate, str] = {}
    for node in statement.expressions:
        if isinstance(node, exp.Star):
            raise SqlRefused("SELECT * would release every column: select the grouped columns and aggregates",
                             *_position(node))
        value = node.this if isinstance(node, exp.Alias) else node
        if not value.find(exp.AggFunc):
            name = str(node.alias_or_name)
            if name not in group_by:
                raise SqlRefused(f"'{name}' is neither grouped nor aggregated: add it to GROUP BY or aggregate it",
                                 *_position(node))
            continue
        aggregate = _aggregate(value, unit)
        name = str(node.alias) if isinstance(node, exp.Alias) else _default_name(aggregate)
        metric: dict[str, Any] = {"name": name, "kind": aggregate.kind}
        if aggregate.column is not None and aggregate.kind != "privacy_id_count":
            metric["column"] = aggregate.column
        if aggregate.q is not None:
            metric["q"] = aggregate.q
        if aggregate.kind not in ("count", "privacy_id_count"):
            if aggregate.column not in bounds:
                raise SqlRefused(f"{aggregate.kind} of '{aggregate.column}' needs bounds: give them under `bounds: "
                                 f"{{{aggregate.column}: [lower, upper]}}` beside the SQL, or `auto`",
                                 *_position(value))
            metric["bounds"] = bounds[aggregate.column]
        extra = options.get(name) or {}
        unknown = sorted(set(extra) - METRIC_OPTIONS) if isinstance(extra, dict) else ["(not a mapping)"]
        if unknown:
            raise SqlRefused(f"metric_options.{name}: {unknown[0]} is not an option of a metric written in SQL "
                             f"({', '.join(sorted(METRIC_OPTIONS))})", *_position(node))
        metric.update(extra)
        where[("metrics", len(metrics))] = _position(node)
        released[aggregate] = name
        metrics.append(metric)
    if not metrics:
        raise SqlRefused("the SELECT list has no aggregate: a release is of counts, sums, means, quantiles…")
    return _quantile_levels_merged(metrics, options, where), released


def _quantile_levels_merged(metrics: list[dict[str, Any]], options: dict[str, Any],
                            where: dict[tuple[Any, ...], tuple[int, int]]) -> list[dict[str, Any]]:
    """Quantiles of one column aliased `<name>_p<level>` (`spend_p10`, `spend_p90`) as the one metric
    `<name>` with those levels, whose output columns are exactly those aliases: the YAML form of
    several levels, answered together by one mechanism."""
    groups: dict[tuple[str, str], list[int]] = {}
    for index, metric in enumerate(metrics):
        if metric["kind"] == "quantile":
            prefix, _, _ = metric["name"].rpartition("_p")
            if prefix and metric["name"] == f"{prefix}_p{percent_text(metric['q'])}":
                groups.setdefault((prefix, metric["column"]), []).append(index)
    merged = {indices[0]: (prefix, indices) for (prefix, _), indices in groups.items() if len(indices) > 1}
    dropped = {i for _, indices in merged.values() for i in indices[1:]}
    out: list[dict[str, Any]] = []
    positions = {}
    for index, metric in enumerate(metrics):
        if index in dropped:
            continue
        if index in merged:
            prefix, indices = merged[index]
            metric = {**metric, "name": prefix, "q": [metrics[i]["q"] for i in indices], **(options.get(prefix) or {})}
        positions[len(out)] = where.get(("metrics", index), (1, 1))
        out.append(metric)
    for index in range(len(metrics)):
        where.pop(("metrics", index), None)
    where.update({("metrics", index): position for index, position in positions.items()})
    return out





def _aggregate(node: Any, unit: list[str]) -> _Aggregate:
    """The metric an aggregate call is: its kind, its column, its quantile level."""
    if isinstance(node, exp.WithinGroup):
        return _within_group(node)
    if not isinstance(node, exp.AggFunc):
        raise SqlRefused("an expression of aggregates is not a metric: select each aggregate alone (a mean is "
                         "AVG(x), not SUM(x) / COUNT(x))", *_position(node))
    if isinstance(node, exp.Count):
        argument = node.this
        if isinstance(argument, exp.Star):
            return _Aggregate("count", None)
        if isinstance(argument, exp.Distinct):
            columns = [e.name for e in argument.expressions if isinstance(e, exp.Column)]
            if columns != list(unit) or len(argument.expressions) != len(unit):
                raise SqlRefused("COUNT(DISTINCT …) is only for the privacy unit (it releases the number of "
                                 "privacy units); distinct counts of other columns are not bounded by one unit",
                                 *_position(node))
            return _Aggregate("privacy_id_count", None)
        return _Aggregate("count", _column(argument))
    kinds: dict[type, str] = {
        exp.Sum: "sum", exp.Avg: "mean", exp.VariancePop: "variance", exp.Variance: "variance",
        exp.Stddev: "stddev", exp.StddevPop: "stddev", exp.StddevSamp: "stddev", exp.Median: "median",
        exp.Min: "min", exp.Max: "max",
    }
    kind = kinds.get(type(node))
    if kind is not None:
        if node.args.get("distinct") or isinstance(node.this, exp.Distinct):
            raise SqlRefused("DISTINCT inside an aggregate is not bounded by one unit's contribution",
                             *_position(node))
        return _Aggregate(kind, _column(node.this))
    if isinstance(node, exp.PercentileCont) and node.expression is not None:  # QUANTILE_CONT(col, q)
        return _Aggregate("quantile", _column(node.this), _level(node.expression))
    raise SqlRefused(f"{node.key.upper()} is not an aggregate dprun releases (COUNT, SUM, AVG, VAR_POP, STDDEV, "
                     "MEDIAN, PERCENTILE_CONT, QUANTILE_CONT, MIN, MAX)", *_position(node))


def _within_group(node: exp.WithinGroup) -> _Aggregate:
    """PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY col)."""
    function, order = node.this, node.expression
    if not isinstance(function, exp.PercentileCont) or not isinstance(order, exp.Order) or len(order.expressions) != 1:
        raise SqlRefused("WITHIN GROUP is for PERCENTILE_CONT(q) WITHIN GROUP (ORDER BY column)", *_position(node))
    ordered = order.expressions[0]
    return _Aggregate("quantile", _column(ordered.this), _level(function.this))


def _column(node: exp.Expression | None) -> str:
    if not isinstance(node, exp.Column):
        raise SqlRefused("aggregate a column: derive an expression first (under `derive:`) and aggregate it by "
                         "name", *_position(node) if node is not None else (1, 1))
    return str(node.name)


def _level(node: exp.Expression | None) -> float:
    if not isinstance(node, exp.Literal) or node.is_string:
        raise SqlRefused("a quantile's level must be a number from 0 to 1", *_position(node) if node else (1, 1))
    return float(node.this)


def _default_name(aggregate: _Aggregate) -> str:
    level = "" if aggregate.q is None else f"_p{round(aggregate.q * 100):g}"
    return f"{aggregate.kind}_{aggregate.column}{level}" if aggregate.column else aggregate.kind


def _postprocess(statement: exp.Select, aggregates: dict[_Aggregate, str], group_by: list[str],
                 released: set[str]) -> dict[str, Any]:
    """HAVING, ORDER BY and LIMIT over the released table: each aggregate they name is the metric the
    SELECT list releases for it."""
    post: dict[str, Any] = {}
    having = statement.args.get("having")
    if having is not None:
        post["having"] = _over_released(having.this, aggregates, group_by, released, "HAVING").sql(dialect=WRITTEN)
    order = statement.args.get("order")
    if order is not None:
        post["order_by"] = [{"column": _over_released(o.this, aggregates, group_by, released, "ORDER BY").sql(
            dialect=WRITTEN), "descending": bool(o.args.get("desc"))} for o in order.expressions]
    limit = statement.args.get("limit")
    if limit is not None:
        count = limit.expression
        if not isinstance(count, exp.Literal) or count.is_string or not str(count.this).isdigit():
            raise SqlRefused("LIMIT takes a whole number", *_position(limit))
        post["limit"] = int(count.this)
    if statement.args.get("offset") is not None:
        raise SqlRefused("OFFSET is not supported: order the release and take the rows you need",
                         *_position(statement.args["offset"]))
    return post


def _over_released(node: exp.Expression, aggregates: dict[_Aggregate, str], group_by: list[str], released: set[str],
                   clause: str) -> exp.Expression:
    """`node` with each aggregate replaced by the released metric that is that aggregate."""
    def swap(inner: exp.Expression) -> exp.Expression:
        if isinstance(inner, (exp.AggFunc, exp.WithinGroup)) and not isinstance(inner.parent, exp.WithinGroup):
            name = aggregates.get(_aggregate(inner, []) if not _is_unit_count(inner) else _Aggregate(
                "privacy_id_count", None))
            if name is None:
                raise SqlRefused(f"{clause} uses an aggregate the SELECT list does not release: select it too",
                                 *_position(inner))
            return exp.column(name)
        if isinstance(inner, exp.Column) and inner.name not in released and inner.name not in group_by:
            raise SqlRefused(f"{clause} can only use the released columns (the grouped columns and the aggregates' "
                             f"aliases), not '{inner.name}'", *_position(inner))
        return inner
    return node.copy().transform(swap)


def _is_unit_count(node: exp.Expression) -> bool:
    return isinstance(node, exp.Count) and isinstance(node.this, exp.Distinct)


def _position(node: Any) -> tuple[int, int]:
    """The (line, column) in the statement where `node` starts: its first identifier's, as sqlglot
    records them (line 1, column 1 where it recorded none)."""
    if node is None:
        return 1, 1
    found = [(i.meta["start"], i.meta["line"], i.meta["col"] - len(str(i.this)) + 1)
             for i in node.find_all(exp.Identifier) if "start" in i.meta]
    if not found:
        return 1, 1
    _, line, column = min(found)
    return line, max(1, column)


def compile_sql_queries(data: Any, marks: dict[tuple[Any, ...], tuple[int, int]], filename: str,
                        text: str) -> None:
    """Replace, in a spec document, every query's `sql` companions by the fields the statement
    stands for, and mark where each compiled field comes from (so that a later problem with it is
    located inside the statement). Raises SpecError, located, for a statement dprun refuses."""
    from dprun.errors import Problem, SpecError

    queries = data.get("queries") if isinstance(data, dict) else None
    if not isinstance(queries, list):
        return
    unit = data.get("privacy_unit")
    unit_columns = [unit] if isinstance(unit, str) else [u for u in unit if isinstance(u, str)] \
        if isinstance(unit, list) else []
    problems = []
    for index, query in enumerate(queries):
        if not isinstance(query, dict) or "sql" not in query:
            continue
        at = ("queries", index)
        key_line, key_column = marks.get((*at, "sql"), marks.get(at, (1, 1)))
        clash = [name for name in COMPILED_FIELDS if name in query]
        if clash:
            line, column = marks.get((*at, clash[0]), (key_line, key_column))
            problems.append(Problem(filename, line, column, f"queries[{index}].{clash[0]}",
                                    f"a query written in SQL takes its `{clash[0]}` from the statement: remove it"))
            continue
        if not isinstance(query["sql"], str):
            continue  # the model says what `sql` must be
        try:
            fields, where = compile_query(query["sql"], query, unit_columns)
        except SqlRefused as refused:
            line, column = _in_file(text, key_line, refused.line, refused.column)
            problems.append(Problem(filename, line, column, f"queries[{index}].sql",
                                    f"{refused.message} (line {refused.line}, column {refused.column} of the SQL)"))
            continue
        for companion in ("bounds", "metric_options", "max_rows_per_unit"):
            query.pop(companion, None)
        query.update(fields)
        for path, (line, column) in where.items():
            marks[(*at, *path)] = _in_file(text, key_line, line, column)
    if problems:
        raise SpecError(problems)


def _in_file(text: str, key_line: int, line: int, column: int) -> tuple[int, int]:
    """Where (line, column) of a statement is in the spec file, given the line of its `sql:` key:
    a block scalar (`|`, `>`) starts on the next line, indented; an inline one after the colon."""
    lines = text.splitlines()
    if not 1 <= key_line <= len(lines):
        return key_line, 1
    after = lines[key_line - 1].split(":", 1)[-1]
    if after.strip()[:1] in ("|", ">") and key_line < len(lines):
        body = lines[key_line]
        indent = len(body) - len(body.lstrip(" "))
        return key_line + line, indent + column
    start = len(lines[key_line - 1]) - len(after.lstrip()) + 1
    quoted = after.strip()[:1] in ("'", '"')
    return key_line + line - 1, (start + quoted - 1 if line == 1 else 0) + column

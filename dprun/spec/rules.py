"""Spec rules that span several fields (references, uniqueness, δ = 0 consequences).

Each rule yields (field path, message); `dprun.spec.load` turns them into
located problems. Rules never look at data, only at the spec.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Iterator
from pathlib import Path

from dprun.ledger.location import companion_files, has_password, is_database_url
from dprun.publish import STORE
from dprun.spec.input_paths import local_path, local_pattern
from dprun.spec.models import Join, PublicColumn, Query, Scalar, Spec
from dprun.spec.row_expressions import NotRowWise, parse_row_expression
from dprun.spec.yaml_loader import FieldPath

Finding = tuple[FieldPath, str]


def spec_findings(spec: Spec, base_dir: Path, spec_path: Path) -> list[Finding]:
    loops = list(_symlink_loops(spec, base_dir))
    if loops:
        return loops  # the checks below compare resolved paths
    findings: list[Finding] = []
    findings += _unique_query_names(spec)
    findings += _outputs_distinct(spec, base_dir, spec_path)
    findings += _public_files_not_inputs(spec, base_dir)
    findings += _ledger_apart(spec, base_dir, spec_path)
    if isinstance(spec.privacy_unit, list):
        findings += _listed_twice(spec.privacy_unit, ("privacy_unit",))
    for index, query in enumerate(spec.queries):
        at: FieldPath = ("queries", index)
        findings += [((*at, "input", *path), message) for path, message in _input_findings(query, spec)]
        findings += [((*at, *path), message) for path, message in _query_findings(query, spec)]
    return findings


def _input_findings(query: Query, spec: Spec) -> list[Finding]:
    """A query reads one private input, alone or joined with public lookups and with other private
    inputs on the privacy unit (each truncated to `max_rows_per_unit` rows per unit first)."""
    known = ", ".join(sorted(spec.inputs))
    names = [query.input] if isinstance(query.input, str) else query.input.join
    paths: list[FieldPath] = [()] if isinstance(query.input, str) else [("join", i) for i in range(len(names))]
    for name, path in zip(names, paths, strict=True):
        if name not in spec.inputs:
            return [(path, f"no input named '{name}' (inputs: {known})")]
    if spec.inputs[names[0]].public:
        return [(paths[0], f"'{names[0]}' is a public input: a query reads a private input, which it may join "
                           "with public ones")]
    if len(set(names)) < len(names):
        return [(paths[-1], "an input is joined twice")]
    if isinstance(query.input, str):
        return []
    return _on_findings(query.input) or _private_join_findings(query.input, spec)


def _on_findings(join: Join) -> list[Finding]:
    """`on` as a mapping names every input after the first, and only those."""
    if not isinstance(join.on, dict):
        return []
    for name in join.on:
        if name not in join.join[1:]:
            return [(("on", name), f"'{name}' is not an input joined to '{join.join[0]}' here: `on` maps each input "
                                   f"after the first ({', '.join(join.join[1:])}) to its join column(s)")]
    missing = [name for name in join.join[1:] if name not in join.on]
    return [(("on",), f"give the join column(s) of input '{missing[0]}'")] if missing else []


def _private_join_findings(join: Join, spec: Spec) -> list[Finding]:
    """A join of private inputs is on the privacy unit, and every private input after the first has a bound."""
    private = [name for name in join.join if not spec.inputs[name].public]
    for name in join.max_rows_per_unit:
        if name not in private:
            what = "a public input" if name in join.join else "not an input of this join"
            return [(("max_rows_per_unit", name), f"'{name}' is {what}: only private inputs of a join are truncated")]
    if len(private) == 1:
        if join.max_rows_per_unit:
            return [(("max_rows_per_unit",), "a join with one private input truncates nothing: the query's "
                                              "contribution bounds cap what its rows add")]
        return []
    for name in private[1:]:
        missing_unit = [c for c in spec.privacy_unit_columns if c not in join.on_columns(name)]
        if missing_unit:
            at: FieldPath = ("on", name) if isinstance(join.on, dict) else ("on",)
            return [(at, f"a join of private inputs must be on the privacy unit: add '{missing_unit[0]}' to `on`"
                         f"{f' for {name}' if isinstance(join.on, dict) else ''}, so that each person's rows only "
                         "ever meet their own")]
    unbounded = [name for name in private[1:] if name not in join.max_rows_per_unit]
    if unbounded:
        return [(("max_rows_per_unit",), f"give private input '{unbounded[0]}' a bound, e.g. "
                                          f"`max_rows_per_unit: {{{unbounded[0]}: 1}}`: each of its rows per "
                                          f"privacy unit multiplies that unit's rows of '{private[0]}'")]
    return []


def resolved(path: Path) -> Path:
    """`path` made absolute through symbolic links; a symbolic link loop stays as written."""
    try:
        return path.resolve()
    except (RuntimeError, OSError):
        return Path(os.path.abspath(path))


def _named_paths(spec: Spec) -> Iterator[tuple[FieldPath, str]]:
    for name, declared in spec.inputs.items():
        yield ("inputs", name, "path"), declared.path
    for index, query in enumerate(spec.queries):
        for field, path, _ in _key_files(query):
            yield ("queries", index, "partitions", *field), path
        yield ("queries", index, "output", "path"), query.output.path
    yield ("report",), spec.report
    if spec.ledger is not None and not is_database_url(spec.ledger):
        yield ("ledger",), spec.ledger


def _symlink_loops(spec: Spec, base_dir: Path) -> Iterator[Finding]:
    for at, text in _named_paths(spec):
        try:
            (base_dir / text).resolve()
        except (RuntimeError, OSError):
            yield at, f"'{text}' cannot be resolved: a symbolic link loop"


def _unique_query_names(spec: Spec) -> Iterator[Finding]:
    seen: set[str] = set()
    for index, query in enumerate(spec.queries):
        if query.name in seen:
            yield ("queries", index, "name"), f"query name '{query.name}' is used twice"
        seen.add(query.name)


def _input_paths(spec: Spec, base_dir: Path, *, private_only: bool = False) -> set[Path]:
    """Every data file the spec's inputs (or its private inputs only) name (each file a glob
    matches), resolved through symlinks."""
    read: set[Path] = set()
    for declared in spec.inputs.values():
        if private_only and declared.public:
            continue
        pattern = local_pattern(declared.path, base_dir)
        read.add(Path(pattern).resolve())
        read |= {Path(p).resolve() for p in glob.glob(pattern, recursive=True)}
    return read


def _read_paths(spec: Spec, base_dir: Path, spec_path: Path) -> set[Path]:
    """Every file the spec reads: inputs, public key files, the spec itself."""
    read = {spec_path.resolve(), *_input_paths(spec, base_dir)}
    for query in spec.queries:
        read |= {local_path(path, base_dir).resolve() for _, path, _ in _key_files(query)}
    return read


def _key_files(query: Query) -> list[tuple[tuple[str, ...], str, str | None]]:
    return [] if query.partitions is None else query.partitions.key_files()


def _public_files_not_inputs(spec: Spec, base_dir: Path) -> Iterator[Finding]:
    """Public keys read from the private data would be the data's own keys, released without selection.
    A public input (a lookup table) is a public source: its file may hold the keys too."""
    inputs = _input_paths(spec, base_dir, private_only=True)
    for index, query in enumerate(spec.queries):
        for field, path, _ in _key_files(query):
            if local_path(path, base_dir).resolve() in inputs:
                yield ("queries", index, "partitions", *field), (
                    "the public partition file is a private input of this spec: public keys must come from a "
                    "public source, not from the private data (use private selection instead, see docs/privacy.md)"
                )


def published_path(base_dir: Path, written: str) -> Path:
    """A path dprun publishes to: its folder resolved, its last part kept as written (publication
    makes the path itself a link, `dprun.publish`; resolving it would name the file it shows now)."""
    candidate = Path(written) if Path(written).is_absolute() else base_dir / written
    try:
        return candidate.parent.resolve() / candidate.name
    except (OSError, RuntimeError):  # a symbolic link loop in the folder: publication names it
        return candidate


def _outputs_distinct(spec: Spec, base_dir: Path, spec_path: Path) -> Iterator[Finding]:
    inputs = _read_paths(spec, base_dir, spec_path)
    report = published_path(base_dir, spec.report)
    if set(report_files(report)) & inputs:
        yield ("report",), ("the report (or the report.md or report.html beside it) would overwrite a file this "
                            "spec reads")
    if STORE in report.parts:
        yield ("report",), f"the report path is inside a `{STORE}` folder, where dprun keeps its releases"
    seen: dict[Path, str] = {}
    for index, query in enumerate(spec.queries):
        target = published_path(base_dir, query.output.path)
        at = ("queries", index, "output", "path")
        if STORE in target.parts:
            yield at, f"the output path is inside a `{STORE}` folder, where dprun keeps its releases"
        if target in seen:
            yield at, f"queries '{seen[target]}' and '{query.name}' write the same output"
        if target in inputs:
            yield at, "the output path is a file this spec reads (an input, a public key file or the spec)"
        if target in report_files(report):
            yield at, "the output path is the report's path (report.json and the report.md and report.html beside it)"
        if target.suffix.lower() not in (".parquet", ".csv") and query.output.format is None:
            yield at, "cannot tell the output format: use a .parquet or .csv suffix, or set `format`"
        seen[target] = query.name
    if report.suffix.lower() != ".json":
        yield ("report",), "the report path must end in .json (the Markdown report is written beside it)"


def _query_findings(query: Query, spec: Spec) -> Iterator[Finding]:
    pure = spec.budget.delta == 0
    yield from _listed_twice(query.group_by, ("group_by",))
    yield from _postprocess_findings(query)
    for index, column in enumerate(query.group_by):
        if column in spec.privacy_unit_columns:
            yield ("group_by", index), (
                f"column '{column}' is the privacy unit: a query cannot group by it (each partition "
                "would hold one unit's rows); group by other columns")
    yield from _metric_names(query)
    if query.contribution_bounds.auto_budget_share is not None and not query.has_auto:
        yield ("contribution_bounds", "auto_budget_share"), (
            "`auto_budget_share` is for `auto` bounds; no contribution or value bound of this query is `auto`")
    for index, metric in enumerate(query.metrics):
        if pure and (metric.noise or query.noise) == "gaussian":
            yield ("metrics", index, "noise"), "Gaussian noise needs delta > 0; set budget.delta or use laplace"
    if pure and query.noise == "gaussian" and not query.metrics:
        yield ("noise",), "Gaussian noise needs delta > 0"
    partitions = query.partitions
    if not query.group_by:
        if partitions is not None:
            yield ("partitions",), "a query without group_by has one global partition; remove `partitions`"
        return
    if partitions is None or not partitions.is_public:
        if pure:
            where: FieldPath = ("partitions", "selection") if partitions is not None else ("group_by",)
            yield where, (
                "private partition selection needs delta > 0: set budget.delta, "
                "or list the partitions with `partitions.public` / `partitions.public_file`"
            )
        if partitions is not None and partitions.selection == "released_count":
            if not any(m.kind in ("count", "privacy_id_count") for m in query.metrics):
                yield ("partitions", "selection"), (
                    "`released_count` thresholds a released count: add a count or privacy_id_count metric"
                )
        if partitions is not None and partitions.selection == "gaussian_threshold" and pure:
            yield ("partitions", "selection"), "gaussian_threshold needs delta > 0"
        return
    if isinstance(partitions.public, dict):
        yield from _cross_product_findings(partitions.public, query.group_by)
    elif partitions.public is not None:
        if not partitions.public:
            yield ("partitions", "public"), "the public partition list is empty; nothing would be released"
        width = len(query.group_by)
        for index, key in enumerate(partitions.public):
            arity = len(key) if isinstance(key, list) else 1
            if arity != width:
                yield ("partitions", "public", index), (
                    f"a key has {arity} value(s) but group_by has {width} column(s)"
                )


# Keys of a cross product written out in the spec: beyond this the release would be mostly
# noise, and the key frame alone would take gigabytes.
MAX_CROSS_PRODUCT = 10**7


def _cross_product_findings(public: dict[str, list[Scalar] | PublicColumn], group_by: list[str]) -> Iterator[Finding]:
    if set(public) != set(group_by):
        yield ("partitions", "public"), (f"a mapping of public keys names each group_by column once "
                                         f"({', '.join(group_by)}); it names {', '.join(public) or 'none'}")
        return
    for column, values in public.items():
        if isinstance(values, list) and not values:
            yield ("partitions", "public", column), "no values: nothing would be released"
    sizes = [len(values) for values in public.values() if isinstance(values, list)]
    if math.prod(sizes) > MAX_CROSS_PRODUCT:
        yield ("partitions", "public"), f"every combination makes more than {MAX_CROSS_PRODUCT:,} keys"


def _ledger_apart(spec: Spec, base_dir: Path, spec_path: Path) -> Iterator[Finding]:
    """A ledger file (and the journal beside it) is neither a file the spec reads nor one it
    publishes; a database URL in the spec, a file people commit, holds no password."""
    if spec.ledger is None:
        return
    if is_database_url(spec.ledger):
        if has_password(spec.ledger):
            yield ("ledger",), ("the ledger URL holds a password: keep it out of the spec (set PGPASSWORD, or use "
                                "~/.pgpass or a service file; docs/ledger.md)")
        return
    problem = ledger_file_problem((base_dir / spec.ledger).resolve(), published_and_read(spec, base_dir, spec_path))
    if problem is not None:
        yield ("ledger",), problem


def ledger_file_problem(ledger: Path, touched: set[Path]) -> str | None:
    """Why a ledger file cannot be at `ledger`, given every file a run `touched` (reads or
    publishes), or None: a folder, or a file the run reads or publishes (the ledger, or the
    journal SQLite keeps beside it). `validate` asks it of `ledger:`, `run` of --ledger too."""
    if not ledger.name or ledger.is_dir():
        return f"the ledger path is a folder ({ledger}): give the path of a file (e.g. ledger.db)"
    if not companion_files(ledger).isdisjoint(touched):
        return (f"the ledger {ledger} (or the journal SQLite keeps beside it) is a file this spec reads or "
                "publishes (an input, a public key file, the spec, an output or the report)")
    return None


def published_and_read(spec: Spec, base_dir: Path, spec_path: Path) -> set[Path]:
    """Every file a run of the spec reads (resolved) or publishes to (`published_path`)."""
    report = published_path(base_dir, spec.report)
    outputs = {published_path(base_dir, query.output.path) for query in spec.queries}
    return _read_paths(spec, base_dir, spec_path) | outputs | set(report_files(report))


def report_files(report: Path) -> tuple[Path, ...]:
    """The report and what is published beside it: report.md and the card, report.html.
    A path without a name (`/`) is refused for its suffix anyway."""
    return (report, report.with_suffix(".md"), report.with_suffix(".html")) if report.name else (report,)


def _postprocess_findings(query: Query) -> Iterator[Finding]:
    """HAVING and ORDER BY are row-wise expressions of the released columns (checked now: they run
    after the noise, when a refusal would waste the run)."""
    post = query.postprocess
    if post is None:
        return
    released = set(query.group_by) | {c for m in query.metrics for c in output_columns(m.name, m.kind, m.q)}
    texts: list[tuple[FieldPath, str]] = [(("postprocess", "having"), post.having)] if post.having is not None \
        else []
    texts += [(("postprocess", "order_by", i, "column"), o.column) for i, o in enumerate(post.order_by)]
    for at, text in texts:
        try:
            expression = parse_row_expression(text, "released-table expression")
        except NotRowWise as exc:
            yield at, str(exc)
            continue
        unknown = sorted(set(expression.meta.root_names()) - released)
        if unknown:
            yield at, f"names {', '.join(unknown)}, which the query does not release (its columns: " \
                      f"{', '.join(sorted(released))})"


def _listed_twice(columns: list[str], at: FieldPath) -> Iterator[Finding]:
    seen: set[str] = set()
    for index, column in enumerate(columns):
        if column in seen:
            yield (*at, index), f"column '{column}' is listed twice"
        seen.add(column)


def _metric_names(query: Query) -> Iterator[Finding]:
    taken = set(query.group_by)
    for index, metric in enumerate(query.metrics):
        for column in output_columns(metric.name, metric.kind, metric.q):
            if column in taken:
                yield ("metrics", index, "name"), f"output column '{column}' is used twice in this query"
            taken.add(column)


def quantile_levels(kind: str, q: float | list[float] | None) -> list[float]:
    """The quantile levels a metric releases (median, min and max are shorthands)."""
    shorthand = {"median": [0.5], "min": [0.0], "max": [1.0]}
    if kind in shorthand:
        return shorthand[kind]
    if kind != "quantile" or q is None:
        return []
    return list(q) if isinstance(q, list) else [q]


def output_columns(name: str, kind: str, q: float | list[float] | None) -> list[str]:
    """Output column names of a metric: `<name>_p<q·100>` per level of a multi-level quantile."""
    if kind == "quantile" and isinstance(q, list) and len(q) > 1:
        return [f"{name}_p{percent_text(level)}" for level in q]
    return [name]


def percent_text(level: float) -> str:
    """A quantile level as a column name writes it: 0.1 → 10, 0.025 → 2_5."""
    text = f"{level * 100:.6g}"
    return text.replace(".", "_")

"""Spec → validated spec: parse strictly, check the rules, check the input schemas.

Both layers run before any data row is read and report every problem they find,
each located as `file:line:col: field.path: message`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from dprun.errors import DataError, Problem, SpecError
from dprun.spec.input_schema import SCHEMA_SAMPLE_ROWS, InputInfo, SparkInputs, inspect_inputs
from dprun.spec.models import Spec
from dprun.spec.rules import Finding, published_and_read, spec_findings
from dprun.spec.sql_query import compile_sql_queries
from dprun.spec.strict_rows import check_rows
from dprun.spec.yaml_loader import FieldPath, Marks, dotted, load_document, locate


@dataclass(frozen=True)
class LoadedSpec:
    """A spec that passed the spec-only checks, with where it came from."""

    path: Path
    spec: Spec
    marks: Marks
    sha256: str

    @property
    def base_dir(self) -> Path:
        return self.path.resolve().parent

    def resolve(self, relative: str) -> Path:
        candidate = Path(relative)
        return (candidate if candidate.is_absolute() else self.base_dir / candidate).resolve()

    def target(self, relative: str) -> Path:
        """A path dprun publishes to: its folder resolved, its last part kept as written.

        Publication makes the path itself a symbolic link (`dprun.publish`); resolving it
        would name the file of the release it shows now instead.
        """
        candidate = Path(relative)
        candidate = candidate if candidate.is_absolute() else self.base_dir / candidate
        return candidate.parent.resolve() / candidate.name

    def published_and_read(self) -> set[Path]:
        """Every file a run of this spec reads or writes, resolved."""
        return published_and_read(self.spec, self.base_dir, self.path)

    def problems(self, findings: list[Finding]) -> list[Problem]:
        return [_problem(str(self.path), self.marks, path, message) for path, message in findings]


@dataclass(frozen=True)
class ValidatedSpec:
    """A spec that also matches its inputs' schemas; the planner's only input."""

    loaded: LoadedSpec
    inputs: dict[str, InputInfo]  # by input name
    query_inputs: dict[str, InputInfo]  # what each query reads, by query name: its input, with its `joins`

    @property
    def spec(self) -> Spec:
        return self.loaded.spec


def load_spec(path: Path) -> LoadedSpec:
    data, marks, raw = load_document(path)
    sha256 = hashlib.sha256(raw).hexdigest()
    filename = str(path)
    if not isinstance(data, dict):
        raise SpecError([Problem(filename, 1, 1, "", "the spec must be a mapping of fields (version, budget, ...)")])
    compile_sql_queries(data, marks, filename, raw.decode("utf-8"))
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(_at_most(_pydantic_problems(exc, filename, marks, data), filename)) from None
    loaded = LoadedSpec(path=path, spec=spec, marks=marks, sha256=sha256)
    findings = spec_findings(spec, loaded.base_dir, path)
    if findings:
        raise SpecError(loaded.problems(findings))
    return loaded


def validate_spec(path: Path, spark_inputs: SparkInputs | None = None) -> ValidatedSpec:
    """The spec checked against its inputs' schemas; with `spark_inputs` (the Spark engine), inputs named
    by a URL are listed and read by Spark."""
    loaded = load_spec(path)
    inputs, query_inputs, findings = inspect_inputs(loaded.spec, loaded.base_dir, spark_inputs)
    findings += _sample_row_findings(inputs)
    if findings:
        raise SpecError(loaded.problems(findings))
    return ValidatedSpec(loaded=loaded, inputs=inputs, query_inputs=query_inputs)


def _sample_row_findings(inputs: dict[str, InputInfo]) -> list[Finding]:
    """The strict row check, every value, on the first rows of each file (`strict_rows`)."""
    findings: list[Finding] = []
    for name, info in inputs.items():
        try:
            check_rows(info, limit=SCHEMA_SAMPLE_ROWS, every_value=True)
        except DataError as exc:
            findings.append((("inputs", name, "path"), exc.message))
    return findings


# More problems than a person reads: the rest are counted, not listed (a spec of 300,000 unknown keys).
MAX_PROBLEMS = 100


def _at_most(problems: list[Problem], filename: str) -> list[Problem]:
    if len(problems) <= MAX_PROBLEMS:
        return problems
    more = len(problems) - MAX_PROBLEMS
    return [*problems[:MAX_PROBLEMS], Problem(filename, None, None, "", f"and {more:,} more problem(s) like these")]


def _problem(filename: str, marks: Marks, path: FieldPath, message: str) -> Problem:
    line, column = locate(marks, path)
    return Problem(filename, line, column, dotted(path), message)


def _pydantic_problems(exc: ValidationError, filename: str, marks: Marks, data: Any) -> list[Problem]:
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        path = _document_path(error["loc"], data, missing=error["type"] == "missing")
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            message = "this field is required"
        elif error["type"] == "extra_forbidden":
            message = "unknown field (check the spelling; see docs/spec.md)"
        problems.append(_problem(filename, marks, path, message))
    return problems


def _document_path(loc: tuple[int | str, ...], data: Any, missing: bool = False) -> FieldPath:
    """Drop pydantic's union/validator tags from a location, keeping the fields a user wrote.

    A part is a field the user wrote if it is a key of the mapping at that point, or
    the last part of a `missing` error (the required field that is absent).
    """
    path: list[str | int] = []
    node = data
    for index, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int):
            path.append(part)
            node = node[part] if 0 <= part < len(node) else None
        elif missing and index == len(loc) - 1 and isinstance(part, str):
            path.append(part)
    return tuple(path)

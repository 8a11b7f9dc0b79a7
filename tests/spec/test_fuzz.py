"""Fuzzing `dprun validate`: whatever the spec file holds, the answer is "ok" (exit 0) or
located problems (exit 1) -- never an internal error (exit 2), never a traceback.

(a) random YAML/JSON documents and random text, (b) random mutations of the example
spec `specs/restaurants_public.yaml` (values of random types at random paths, deleted
and unknown fields, edited lines), each written to a temporary file and validated
through the CLI entry point `dprun.cli.main` driven by `click.testing.CliRunner`.
"""

from __future__ import annotations

import io
import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from dprun.spec.yaml_loader import parse_text
from dprun_testing import invoke

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "specs" / "restaurants_public.yaml"

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# `validate` runs with DPRUN_DEBUG unset; a failure is shown again with it set, which lets the exception through.
NO_DEBUG = {"DPRUN_DEBUG": None}
DEBUG = {"DPRUN_DEBUG": "1"}


def assert_handled(spec: Path) -> None:
    for fmt in ("text", "json"):
        result = invoke("validate", str(spec), "--format", fmt, env=NO_DEBUG)
        failed = (
            result.exit_code not in (0, 1)
            or "Traceback (most recent call last)" in result.output
            or not (result.exception is None or isinstance(result.exception, SystemExit))
        )
        if failed:
            # Show the bug: run again with DPRUN_DEBUG=1, which lets the exception through.
            debug = invoke("validate", str(spec), "--format", fmt, env=DEBUG)
            raise AssertionError(
                f"exit {result.exit_code}, exception {result.exception!r}\n--- spec:\n{spec.read_text(errors='replace')}"
                f"\n--- output:\n{result.output}\n--- with DPRUN_DEBUG=1: {debug.exception!r}"
            ) from debug.exception
        if fmt == "json":
            document = json.loads(result.stdout)
            assert document["ok"] is (result.exit_code == 0)
            if result.exit_code == 1:
                assert document["exit_code"] == 1 and document["problems"]
        elif result.exit_code == 1:
            assert result.stderr.startswith("error: "), result.output


def _yaml_text(document: Any, flow: bool | None) -> str:
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = flow
    stream = io.StringIO()
    yaml.dump(document, stream)
    return stream.getvalue()


def _json_text(document: Any, indent: int | None) -> str:
    return json.dumps(document, indent=indent, ensure_ascii=False, allow_nan=True, default=str)


# --------------------------------------------------------------------------- strategies

INTERESTING_STRINGS = st.sampled_from([
    "", "visits", "visitor_id", "restaurant_id", "spend_eur", "count", "privacy_id_count", "sum", "mean",
    "quantile", "median", "gaussian", "laplace", "auto", "released_count", "gaussian_threshold", "pld", "basic",
    "out.csv", "out.parquet", "report.json", "x.txt", "../sample_data/visits.csv", "*.csv", "[",
    "spend_eur > 0", "spend_eur >>> (", "no", "yes", "~", "null", ".nan", "-.inf", "1e-6", "!!python/object:os.system",
    "a\nb", "é", "\x00", "visits.csv", "restaurants.csv", "../sample_data/restaurants.csv",
])

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-3, max_value=3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=0, max_value=1),
    st.text(max_size=20),
    INTERESTING_STRINGS,
)

KEYS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["version", "budget", "epsilon", "delta", "queries", "inputs", "metrics", "kind", "name"]),
    st.integers(min_value=-5, max_value=5),
    st.none(),
    st.booleans(),
)

DOCUMENTS = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(KEYS, children, max_size=5),
    ),
    max_leaves=30,
)

VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=8), INTERESTING_STRINGS), children, max_size=4),
    ),
    max_leaves=8,
)

YAMLISH_TEXT = st.lists(
    st.sampled_from(list("abcxyz019 .-_:,[]{}!&*#|>'\"%@?~\n\t\\") + ["epsilon", "version: 1\n", "  ", "- ", "!!"]),
    max_size=60,
).map("".join)


def example_document() -> dict[str, Any]:
    """The example spec as plain data, with its input paths made absolute (the copy lives elsewhere)."""
    data, _ = parse_text(EXAMPLE.read_text(), str(EXAMPLE))
    data["inputs"]["visits"]["path"] = str((EXAMPLE.parent / data["inputs"]["visits"]["path"]).resolve())
    partitions = data["queries"][0]["partitions"]
    partitions["public_file"] = str((EXAMPLE.parent / partitions["public_file"]).resolve())
    return data


def paths_of(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths_of(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += paths_of(value, (*prefix, index))
    return found


def mutate(document: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    for _ in range(data.draw(st.integers(min_value=1, max_value=3), label="mutations")):
        paths = paths_of(document)
        path = data.draw(st.sampled_from(paths[1:]), label="path")
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        action = data.draw(st.sampled_from(["replace", "replace", "replace", "delete", "add_field", "duplicate"]))
        if action == "replace":
            parent[last] = data.draw(VALUES, label="value")
        elif action == "delete":
            del parent[last]
        elif action == "add_field" and isinstance(parent[last], dict):
            parent[last][data.draw(st.one_of(st.text(max_size=8), INTERESTING_STRINGS), label="key")] = data.draw(VALUES)
        elif action == "duplicate" and isinstance(parent, list):
            parent.insert(last, json.loads(json.dumps(parent[last])))
    return document


# --------------------------------------------------------------------------- tests

def test_the_unmutated_example_is_valid() -> None:
    with tempfile.TemporaryDirectory() as folder:
        for name, text in (("spec.yaml", _yaml_text(example_document(), False)),
                           ("spec.json", _json_text(example_document(), 2))):
            spec = Path(folder) / name
            spec.write_text(text)
            result = invoke("validate", str(spec), env=NO_DEBUG)
            assert result.exit_code == 0, result.output


@FUZZ
@given(document=DOCUMENTS, as_json=st.booleans(), layout=st.sampled_from([None, False, True]))
def test_random_documents(document: Any, as_json: bool, layout: bool | None) -> None:
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / ("spec.json" if as_json else "spec.yaml")
        spec.write_text(_json_text(document, 2 if layout else None) if as_json else _yaml_text(document, layout))
        assert_handled(spec)


@FUZZ
@given(text=st.one_of(st.text(max_size=200), YAMLISH_TEXT), raw=st.binary(max_size=40), use_raw=st.booleans())
def test_random_text(text: str, raw: bytes, use_raw: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.yaml"
        if use_raw:
            spec.write_bytes(raw)
        else:
            spec.write_text(text, encoding="utf-8", errors="surrogatepass")
        assert_handled(spec)


@FUZZ
@given(data=st.data(), as_json=st.booleans(), layout=st.sampled_from([None, False, True]))
def test_mutated_example(data: st.DataObject, as_json: bool, layout: bool | None) -> None:
    document = mutate(example_document(), data)
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / ("spec.json" if as_json else "spec.yaml")
        spec.write_text(_json_text(document, 2) if as_json else _yaml_text(document, layout))
        assert_handled(spec)


@FUZZ
@given(data=st.data())
def test_edited_example_lines(data: st.DataObject) -> None:
    """Line-level edits of the YAML text: deleted, repeated (duplicate keys), replaced or re-indented lines."""
    lines = _yaml_text(example_document(), False).splitlines(keepends=True)
    for _ in range(data.draw(st.integers(min_value=1, max_value=3), label="edits")):
        index = data.draw(st.integers(min_value=0, max_value=len(lines) - 1), label="line")
        action = data.draw(st.sampled_from(["delete", "repeat", "replace", "indent", "dedent"]))
        if action == "delete" and len(lines) > 1:
            del lines[index]
        elif action == "repeat":
            lines.insert(index, lines[index])
        elif action == "replace":
            lines[index] = data.draw(YAMLISH_TEXT, label="text") + "\n"
        elif action == "indent":
            lines[index] = "  " + lines[index]
        elif action == "dedent":
            lines[index] = lines[index].lstrip(" ")
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.yaml"
        spec.write_text("".join(lines))
        assert_handled(spec)


SQL_TOKENS = st.sampled_from([
    "spend_eur", "visitor_id", "restaurant_id", "day", "amount", ">", "<", "=", "!=", "AND", "OR", "NOT", "(", ")",
    "'x'", "1", "2.5", "-", "*", "/", "IS NULL", "IN", "LIKE", "'%a'", "CAST(", "AS", "INT", ",", "SELECT", "FROM",
    "CASE", "WHEN", "THEN", "END", "ABS(", "COALESCE(", "COALESCE()", "BETWEEN", "NULL", "TRUE", "::", "[", "||",
    "COUNT(*)", "SUM(", "OVER", ";", "--", "$1", "?",
])


@settings(FUZZ, max_examples=75)  # each example reads the sample CSV's schema: slower than the others
@given(tokens=st.lists(SQL_TOKENS, min_size=1, max_size=8))
def test_random_filters(tokens: list[str]) -> None:
    document = example_document()
    document["queries"][0]["filter"] = " ".join(tokens)
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.yaml"
        spec.write_text(_yaml_text(document, False))
        assert_handled(spec)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400, -(10**30), 1e-320, "", [], {}, None, True])
@pytest.mark.parametrize("path", [
    ("version",), ("budget", "epsilon"), ("budget", "delta"), ("queries", 0, "metrics", 1, "bounds"),
    ("queries", 0, "metrics", 1, "bounds", 0), ("queries", 0, "contribution_bounds"), ("queries", 0, "group_by"),
    ("queries", 0, "partitions", "public_file"), ("queries", 0, "filter"), ("inputs",), ("privacy_unit",),
])
def test_extreme_values(path: tuple[Any, ...], value: Any) -> None:
    """Edge values everywhere that matters; some are valid (a null filter), most are not."""
    document = example_document()
    parent = document
    for part in path[:-1]:
        parent = parent[part]
    parent[path[-1]] = value
    with tempfile.TemporaryDirectory() as folder:
        spec = Path(folder) / "spec.yaml"
        spec.write_text(_yaml_text(document, False))
        assert_handled(spec)

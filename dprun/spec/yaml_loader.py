"""Strict loading of spec files (YAML 1.2 or JSON) with the line and column of every node.

ruamel.yaml is used rather than PyYAML because it implements YAML 1.2 (so `no`
and `yes` stay strings and `1e-6` is a float), refuses duplicate keys, and keeps
line marks on every mapping and sequence in its round-trip mode. The round-trip
tree is turned into plain dicts, lists and scalars; any tagged node (`!!python/...`
or a custom tag) is refused, so no object is ever constructed from a spec.
"""

from __future__ import annotations

import re
import warnings
from datetime import date, datetime
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, ReusedAnchorWarning, YAMLError

from dprun.errors import Problem, SpecError
from dprun.small_files import UnreadableFile, read_small_file

# A spec is a page or two of YAML: a larger file is not one (and would take long to parse).
MAX_SPEC_BYTES = 1 << 20

FieldPath = tuple[str | int, ...]
Marks = dict[FieldPath, tuple[int, int]]


def load_document(path: Path) -> tuple[Any, Marks, bytes]:
    """Read a spec file into plain Python data, a map from field path to (line, column), 1-based,
    and the file's bytes (read once: the spec's sha256 is of these)."""
    try:
        raw = read_small_file(path, MAX_SPEC_BYTES)
        text = raw.decode("utf-8")
    except UnreadableFile as exc:
        reason = "spec file not found" if str(exc) == "not found" else f"cannot read the spec file: {exc}"
        raise SpecError([Problem(f"{path!s:.300}", None, None, "", reason)]) from None
    except UnicodeDecodeError:
        raise SpecError([Problem(str(path), None, None, "", "cannot read the spec file: not readable as UTF-8 "
                                 "text")]) from None
    return (*parse_text(text, str(path)), raw)


def parse_text(text: str, filename: str) -> tuple[Any, Marks]:
    yaml = YAML(typ="rt", pure=True)
    yaml.allow_duplicate_keys = False
    try:
        with warnings.catch_warnings():
            # ruamel.yaml only warns about an anchor defined twice, then lets the second one
            # win: which value an alias means would depend on that, so it is an error.
            warnings.simplefilter("error", ReusedAnchorWarning)
            tree = yaml.load(text)
    except ReusedAnchorWarning as exc:
        line, column = _second_occurrence(str(exc))
        raise SpecError([Problem(filename, line, column, "", "an anchor (&name) is defined twice; give each "
                                 "anchor its own name")]) from None
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        reason = _yaml_reason(exc)
        raise SpecError([Problem(filename, line, column, "", reason)]) from None
    except TypeError:
        # ruamel.yaml hashes a mapping used as a mapping key (`? {a: 1}`) while checking for
        # duplicates, which fails; dprun's keys are strings anyway.
        raise SpecError([Problem(filename, None, None, "", "a mapping key is itself a mapping or a list; keys "
                                 "must be strings")]) from None
    except (YAMLError, ValueError, RecursionError) as exc:
        raise SpecError([Problem(filename, None, None, "", f"not valid YAML/JSON ({type(exc).__name__})")]) from None
    marks: Marks = {}
    problems: list[Problem] = []
    try:
        data = _plain(tree, (), marks, problems, filename, _Budget(MAX_NODES))
    except _TooLarge:
        raise SpecError([Problem(filename, None, None, "", (
            f"the spec expands to more than {MAX_NODES:,} values (YAML aliases `*name` repeat what an "
            "anchor `&name` holds); write the values out"))]) from None
    if problems:
        raise SpecError(problems)
    return data, marks


def _second_occurrence(text: str) -> tuple[int | None, int | None]:
    """Where ruamel.yaml's message about a reused anchor says the second one is."""
    found = re.search(r"second occurrence.*?line (\d+), column (\d+)", text, re.DOTALL)
    return (int(found.group(1)), int(found.group(2))) if found else (None, None)


def _yaml_reason(exc: MarkedYAMLError) -> str:
    problem = (exc.problem or "syntax error").strip()
    if "duplicate key" in problem:
        return "duplicate key: " + problem.split('"')[1] if '"' in problem else "duplicate key"
    context = (exc.context or "").strip()
    return f"{context}: {problem}" if context else problem


# Aliases let a few lines stand for exponentially many values ("billion laughs"): the
# loader keeps them shared, but turning them into plain data expands every one. A spec
# with thousands of public keys stays far below this (a million keys belong in a `public_file`).
MAX_NODES = 200_000


class _TooLarge(Exception):
    pass


class _Budget:
    """How many more values the expanded document may hold."""

    def __init__(self, nodes: int) -> None:
        self.left = nodes

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _TooLarge


def _plain(node: Any, path: FieldPath, marks: Marks, problems: list[Problem], filename: str,
           budget: _Budget) -> Any:
    budget.spend()
    if isinstance(node, (CommentedMap, CommentedSeq)):
        if not path:
            marks[()] = (node.lc.line + 1, node.lc.col + 1)
        if getattr(getattr(node, "tag", None), "value", None) is not None:
            # `!!python/object:...` or a custom tag on a mapping or sequence: refused like tagged scalars.
            line, column = marks.get(path, (None, None))
            problems.append(
                Problem(filename, line, column, dotted(path), "tagged or unsupported YAML node; use plain values")
            )
            return None
    if isinstance(node, CommentedMap):
        result: dict[str, Any] = {}
        for key in node:
            try:
                line, column = node.lc.key(key)
            except (KeyError, TypeError):
                # A key brought in by a merge (`<<: *anchor`) has no mark of its own here.
                line, column = node.lc.line or 0, node.lc.col or 0
            child_path = (*path, str(key))
            marks[child_path] = (line + 1, column + 1)
            if not isinstance(key, str):
                problems.append(Problem(filename, line + 1, column + 1, dotted(child_path), "keys must be strings"))
                continue
            result[key] = _plain(node[key], child_path, marks, problems, filename, budget)
        return result
    if isinstance(node, CommentedSeq):
        items = []
        for index, item in enumerate(node):
            line, column = node.lc.item(index)
            child_path = (*path, index)
            marks[child_path] = (line + 1, column + 1)
            items.append(_plain(item, child_path, marks, problems, filename, budget))
        return items
    if node is None or isinstance(node, (bool, int, float, str)):
        # ruamel's scalar subclasses (ScalarFloat, ...) become the plain builtin.
        if isinstance(node, bool) or node is None:
            return node
        for builtin in (int, float, str):
            if isinstance(node, builtin):
                return builtin(node)
    if isinstance(node, (date, datetime)):
        return node.isoformat()
    line, column = marks.get(path, (None, None))
    problems.append(
        Problem(filename, line, column, dotted(path), "tagged or unsupported YAML node; use plain values")
    )
    return None


def dotted(path: FieldPath) -> str:
    """`queries[0].metrics[1].bounds` for a field path."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def locate(marks: Marks, path: FieldPath) -> tuple[int | None, int | None]:
    """The line and column of the deepest node of `path` that exists in the file (at worst, the document's)."""
    for end in range(len(path), -1, -1):
        if path[:end] in marks:
            return marks[path[:end]]
    return None, None



"""Fuzzing `dprun run`: mutated specs, mutated data files and signals at random instants.

For every case: no traceback, an exit code from docs/ci.md (never 2, an internal error), no
planted secret in any message or written file, no temporary or scratch file left, and the
previous release (pre-existing outputs) unchanged unless the run succeeded. A case that takes
longer than CASE_SECONDS fails. CI runs a fixed number of examples per test; set
DPRUN_FUZZ_EXAMPLES for more (e.g. `DPRUN_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz_run.py`).

Runs go in-process through `dprun.cli.main` (`dprun_testing.invoke`), except signals, which are
sent to a real `python -m dprun` process.
"""

from __future__ import annotations

import copy
import html
import io
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import chartless_dprun, invoke
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from planted_secrets import (
    OUTPUTS,
    PRE_EXISTING,
    SECRET_ID,
    SECRET_VALUE,
    check_failed_run,
    check_streams,
    file_leaks,
    planted,
    snapshot,
    spec_document,
    start_run,
    wait_until_it_catches_signals,
    temporaries,
    write_long_input,
)
from ruamel.yaml import YAML

from dprun.spec.row_expressions import MAX_OPERATORS

EXAMPLES = int(os.environ.get("DPRUN_FUZZ_EXAMPLES", "100"))
CASE_SECONDS = 60
DOCUMENTED_EXITS = {0, 1, 3, 4, 5, 6}  # docs/ci.md; 2 is a usage error or a bug, 130 a signal
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- running one case -------------------------------------------------------------------------


class _TooSlow(Exception):
    pass


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the case after `seconds` (SIGALRM; the CLI leaves that signal alone)."""
    def expire(signum: int, frame: FrameType | None) -> None:
        raise _TooSlow(f"the case took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def case_folder() -> Iterator[tuple[Path, Path]]:
    """A fresh work folder (with the previous release in out/) and an empty scratch folder."""
    with tempfile.TemporaryDirectory(prefix="dprun-fuzz-") as base:
        work, scratch = Path(base) / "work", Path(base) / "scratch"
        (work / "out").mkdir(parents=True)
        scratch.mkdir()
        for name in OUTPUTS:
            (work / name).write_bytes(PRE_EXISTING)
        yield work, scratch


def run_case(work: Path, scratch: Path, spec: Path, what: str, *extra: str) -> tuple[int, str]:
    """`dprun run SPEC --overwrite EXTRA` and every check that holds whatever the case: (exit code, stderr)."""
    before = snapshot(work, scratch)
    saved = {k: os.environ.get(k) for k in ("DPRUN_TMPDIR", "DPRUN_LEDGER", "DPRUN_DEBUG")}
    os.environ["DPRUN_TMPDIR"] = str(scratch)
    os.environ.pop("DPRUN_LEDGER", None)
    os.environ.pop("DPRUN_DEBUG", None)
    try:
        with time_limit(CASE_SECONDS):
            result = invoke("run", str(spec), "--overwrite", "--seed", "7", *extra)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    after = snapshot(work, scratch)
    text = result.stdout + result.stderr
    assert "took more than" not in text, f"{what}: {text}"
    assert result.exception is None or isinstance(result.exception, SystemExit), f"{what}: {result.exception!r}"
    check_streams(result.stdout, result.stderr, what)
    assert result.exit_code in DOCUMENTED_EXITS, f"{what}: exit {result.exit_code}: {result.stderr}"
    assert not temporaries(work), f"{what}: temporary files left: {temporaries(work)}"
    assert not list(scratch.iterdir()), f"{what}: scratch not emptied: {list(scratch.iterdir())}"
    if result.exit_code != 0:
        check_failed_run(what, result.exit_code, result.stderr, "", before, after)
    else:
        for name in sorted(after.keys() - before.keys()) + [k for k in before if after.get(k) != before[k]]:
            assert not file_leaks(work / name), f"{what}: {name} holds data values {file_leaks(work / name)}"
    return result.exit_code, result.stderr


# --- spec mutations ---------------------------------------------------------------------------


FIELDS: list[tuple[str | int, ...]] = [
    ("version",), ("privacy_unit",), ("budget",), ("budget", "epsilon"), ("budget", "delta"),
    ("budget", "accounting"), ("inputs", "data"), ("inputs", "data", "path"), ("inputs", "data", "format"),
    ("queries", 0, "group_by"), ("queries", 0, "group_by", 0), ("queries", 0, "partitions"),
    ("queries", 0, "partitions", "public"), ("queries", 0, "partitions", "selection"),
    ("queries", 0, "contribution_bounds", "max_partitions_contributed"),
    ("queries", 0, "contribution_bounds", "max_contributions_per_partition"),
    ("queries", 0, "metrics", 0, "kind"), ("queries", 0, "metrics", 0, "budget_share"),
    ("queries", 0, "metrics", 1, "bounds"), ("queries", 0, "metrics", 1, "column"), ("queries", 0, "filter"),
    ("queries", 0, "noise"), ("queries", 0, "budget_share"), ("queries", 0, "output", "path"), ("report",),
    ("ledger",), ("dataset",),
]
EXTREME_NUMBERS = [0, -1, 1, 2**63, -(2**63), 10**30, 0.0, -0.0, 1e-300, 5e-324, 1e300, 1.7e308,
                   float("nan"), float("inf"), float("-inf"), 0.5, 1e-6, 1e6]
ODD_PATHS = ["", ".", "/", "..", "out", "out/", "/dev/null", "data.parquet", "spec.yaml", "out/report.json",
             "out/report.md", "a\x00b.parquet", "x" * 300 + ".parquet", "ü/ñ.parquet", "out/q.csv", "~/x.parquet",
             "missing/dir/q.parquet", "keys.csv", "*.parquet", "out/../out/q.parquet"]
ODD_TEXT = ["uid", "shop", "v", "SELECT 1", "v > avg(v)", "count(*) over ()", "v >= 0", "pld", "basic", "laplace",
            "gaussian", "auto", "sum", "median", "ünï", "\u202e", "a" * 200, "&anchor", "*alias", "{}", "[]"]
VALUES = st.one_of(
    st.just("<delete>"), st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.sampled_from(EXTREME_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD_PATHS), st.sampled_from(ODD_TEXT),
    st.text(max_size=12), st.lists(st.sampled_from(["a", "b", 1, None, "uid", "shop"]), max_size=4),
    st.dictionaries(st.sampled_from(["epsilon", "path", "x", "public"]), st.sampled_from([1, "a", None]), max_size=2),
)


def set_at(document: Any, path: tuple[str | int, ...], value: Any) -> None:
    node = document
    for part in path[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return
    if not isinstance(node, (dict, list)):
        return
    last = path[-1]
    if isinstance(node, list) and not (isinstance(last, int) and last < len(node)):
        return
    if value == "<delete>":
        if isinstance(node, dict):
            node.pop(last, None)  # type: ignore[arg-type]
        return
    node[last] = value  # type: ignore[index]


def yaml_text(document: Any) -> str:
    # ruamel writes an object that occurs twice once, with an anchor, and then an alias to it.
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = None
    stream = io.StringIO()
    yaml.dump(document, stream)
    return stream.getvalue()


def base_folder(work: Path) -> None:
    planted(np.random.default_rng(3)).write_parquet(work / "data.parquet")
    pl.DataFrame({"shop": ["a", "b"]}).write_csv(work / "keys.csv")


@FUZZ
@given(mutations=st.lists(st.tuples(st.sampled_from(FIELDS), VALUES), min_size=1, max_size=3),
       alias=st.one_of(st.none(), st.tuples(st.sampled_from(FIELDS), st.sampled_from(FIELDS))))
def test_a_mutated_spec_is_run_or_refused_cleanly(mutations: list[tuple[tuple[str | int, ...], Any]],
                                                  alias: tuple[tuple[str | int, ...], tuple[str | int, ...]] | None
                                                  ) -> None:
    document = copy.deepcopy(spec_document())  # its metrics are shared module data
    for path, value in mutations:
        set_at(document, path, copy.deepcopy(value))
    if alias is not None:  # one subtree shared by two fields: written as an anchor and an alias
        source, target = alias
        node: Any = document
        for part in source:
            node = node[part] if isinstance(node, (dict, list)) and _has(node, part) else None
        if isinstance(node, (dict, list)):
            set_at(document, target, node)
    with case_folder() as (work, scratch):
        base_folder(work)
        spec = work / "spec.yaml"
        try:
            spec.write_text(yaml_text(document), encoding="utf-8", errors="surrogatepass")
        except (ValueError, RecursionError):
            return  # a document YAML itself cannot write (a subtree aliased into itself)
        run_case(work, scratch, spec, f"mutations={mutations!r} alias={alias!r}")


def _has(node: dict[Any, Any] | list[Any], part: str | int) -> bool:
    return part in node if isinstance(node, dict) else isinstance(part, int) and part < len(node)


# --- data mutations ---------------------------------------------------------------------------


ROWS = 1500  # past Polars' 1000-row schema sample
CSV_KINDS = ["clean", "extra field", "missing field", "one field", "unterminated quote", "bom", "crlf",
             "text in a number column", "empty privacy unit", "truncated", "empty file", "header only",
             "blank lines"]
MALFORMED = {"extra field", "missing field", "one field", "unterminated quote"}


def csv_lines(rng: np.random.Generator) -> list[str]:
    frame = planted(rng, rows=ROWS)
    return ["uid,shop,v"] + [f"{u},{s},{v!r}" for u, s, v in frame.iter_rows()]


def mutate_csv(kind: str, lines: list[str], at: int) -> bytes:
    bad = {"extra field": f"{SECRET_ID},a,1,{SECRET_VALUE}", "missing field": f"{SECRET_ID},a",
           "one field": SECRET_ID, "unterminated quote": f'"{SECRET_ID},a,1',
           "text in a number column": f"u1,a,{SECRET_ID}", "empty privacy unit": ",a,1"}
    if kind in bad:
        lines.insert(at, bad[kind])
    if kind == "blank lines":
        lines.insert(at, "")
    text = "\n".join(lines) + "\n"
    if kind == "crlf":
        text = text.replace("\n", "\r\n")
    data = text.encode()
    if kind == "bom":
        data = b"\xef\xbb\xbf" + data
    if kind == "truncated":
        data = data[: len(data) * at // (ROWS + 1)]
    if kind == "empty file":
        data = b""
    if kind == "header only":
        data = b"uid,shop,v\n"
    return data


@FUZZ
@given(kind=st.sampled_from(CSV_KINDS), at=st.integers(1, ROWS), seed=st.integers(0, 2**32 - 1))
def test_a_mutated_csv_file_is_released_or_refused_cleanly(kind: str, at: int, seed: int) -> None:
    with case_folder() as (work, scratch):
        (work / "data.csv").write_bytes(mutate_csv(kind, csv_lines(np.random.default_rng(seed)), at))
        spec = work / "spec.yaml"
        spec.write_text(json.dumps(spec_document("data.csv")))
        code, stderr = run_case(work, scratch, spec, f"csv {kind} at line {at + 1}, seed={seed}")
        if kind in MALFORMED:
            # Exit 1 when the bad row falls in the schema sample and makes a column text (an early
            # unterminated quote swallows the file): refused at validation, nothing counted either way.
            assert code in (1, 3), f"csv {kind} at line {at + 1}: a malformed row was counted: {stderr}"
        if kind in ("clean", "bom", "crlf", "blank lines"):
            assert code == 0, f"csv {kind}: a well-formed file must run, exit {code}: {stderr}"


NDJSON_KINDS = ["clean", "object id", "list id", "null id", "number id", "not json", "not an object",
                "object value", "truncated", "blank lines"]


@FUZZ
@given(kind=st.sampled_from(NDJSON_KINDS), at=st.integers(0, ROWS - 1), seed=st.integers(0, 2**32 - 1))
def test_a_mutated_ndjson_file_is_released_or_refused_cleanly(kind: str, at: int, seed: int) -> None:
    rows = [json.dumps({"uid": u, "shop": s, "v": v}) for u, s, v in planted(np.random.default_rng(seed),
                                                                               rows=ROWS).iter_rows()]
    bad = {"object id": {"uid": {"id": SECRET_ID}, "shop": "a", "v": 1},
           "list id": {"uid": [SECRET_ID], "shop": "a", "v": 1}, "null id": {"uid": None, "shop": "a", "v": 1},
           "number id": {"uid": 12, "shop": "a", "v": 1},
           "object value": {"uid": "u1", "shop": "a", "v": {"x": SECRET_VALUE}}}
    if kind in bad:
        rows.insert(at, json.dumps(bad[kind]))
    elif kind == "not json":
        rows.insert(at, f'{{"uid": "{SECRET_ID}", "shop": "a", "v": 1')
    elif kind == "not an object":
        rows.insert(at, json.dumps([SECRET_ID, "a", 1]))
    elif kind == "blank lines":
        rows.insert(at, "   ")
    text = "\n".join(rows) + "\n"
    if kind == "truncated":
        text = text[: len(text) * (at + 1) // (ROWS + 1)]
    with case_folder() as (work, scratch):
        (work / "data.ndjson").write_text(text)
        spec = work / "spec.yaml"
        spec.write_text(json.dumps(spec_document("data.ndjson")))
        code, stderr = run_case(work, scratch, spec, f"ndjson {kind} at line {at + 1}, seed={seed}")
        if kind in ("object id", "list id", "object value", "not json", "not an object"):
            assert code in (1, 3), f"ndjson {kind} at line {at + 1}: must not be counted, exit {code}: {stderr}"
        if kind in ("clean", "null id", "blank lines"):
            assert code == 0, f"ndjson {kind}: a well-formed file must run, exit {code}: {stderr}"


@FUZZ
@given(cut=st.floats(0.0, 1.0), flips=st.lists(st.integers(0, 10**6), max_size=3))
def test_a_damaged_parquet_file_is_released_or_refused_cleanly(cut: float, flips: list[int]) -> None:
    buffer = io.BytesIO()
    planted(np.random.default_rng(11), rows=ROWS).write_parquet(buffer)
    data = bytearray(buffer.getvalue())
    for position in flips:
        data[position % len(data)] ^= 0x5A
    data = data[: max(0, round(len(data) * cut))] if cut < 1.0 else data
    with case_folder() as (work, scratch):
        (work / "data.parquet").write_bytes(bytes(data))
        spec = work / "spec.yaml"
        spec.write_text(json.dumps(spec_document()))
        run_case(work, scratch, spec, f"parquet cut at {cut:.3f}, flips {flips}")


# --- signals ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A spec whose run takes about a second: 800,000 rows with private partition selection."""
    folder = tmp_path_factory.mktemp("signals")
    write_long_input(folder / "data.parquet")
    spec = folder / "spec.yaml"
    spec.write_text(json.dumps(spec_document(str(folder / "data.parquet"), query={"partitions": {"selection": "auto"}})))
    return spec


SIGNAL_EXAMPLES = max(4, EXAMPLES // 8)


@settings(max_examples=SIGNAL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(delay=st.floats(0.0, 2.35), burst=st.integers(1, 5), gap=st.floats(0.0, 0.05),
       signum=st.sampled_from([signal.SIGINT, signal.SIGTERM]))
def test_signals_at_random_instants_leave_one_whole_release_or_none(slow_spec: Path, delay: float, burst: int,
                                                                   gap: float, signum: int) -> None:
    with case_folder() as (work, scratch):
        spec = work / "spec.yaml"
        document = json.loads(slow_spec.read_text())
        document["queries"][0]["output"]["path"] = str(work / "out" / "q.parquet")
        document["report"] = str(work / "out" / "report.json")
        spec.write_text(json.dumps(document))
        before = snapshot(work, scratch)
        process = start_run(spec, scratch)
        try:
            wait_until_it_catches_signals(process)  # the delay counts from there, whatever the load
            time.sleep(delay)
            for _ in range(burst):
                process.send_signal(signum)
                time.sleep(gap)
            stdout, stderr = process.communicate(timeout=CASE_SECONDS)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        what = f"{signal.Signals(signum).name} ×{burst} {delay:.3f} s after the handlers, {gap * 1000:.0f} ms apart"
        check_streams(stdout, stderr, what)
        assert process.returncode in (0, 130), f"{what}: exit {process.returncode}: {stderr!r}"
        assert not temporaries(work), f"{what}: temporary files left: {temporaries(work)}"
        assert not list(scratch.iterdir()), f"{what}: scratch not emptied: {list(scratch.iterdir())}"
        after = snapshot(work, scratch)
        if process.returncode == 130:
            assert re.search(r"interrupted.*nothing was published", stderr), f"{what}: {stderr!r}"
            check_failed_run(what, 130, stderr, "interrupted", before, after)
        else:  # finished first: the whole new release is there
            assert all(after[name] != before[name] for name in OUTPUTS), f"{what}: a mixed release"


# --- round 3 (issue #41): ledger locations, hostile keys, long expressions, publication races ----------


# Fewer examples than the families above: each family's case is slower (a real file system object,
# a full release, a large parse); DPRUN_FUZZ_EXAMPLES scales them alike.
ROUND3_EXAMPLES = max(1, EXAMPLES // 4)
ROUND3 = settings(FUZZ, max_examples=ROUND3_EXAMPLES)
LEDGER_PLACES = ["new file", "missing folder", "folder", "fifo", "symlink loop", "dangling symlink",
                 "long name", "dev null", "dev full", "bad url", "empty file", "garbage file",
                 "json lines file", "other sqlite", "the input", "the report"]


def ledger_place(work: Path, kind: str) -> str:
    """A ledger location of the given kind, made in `work`."""
    place = work / "ledger.db"
    if kind == "missing folder":
        place = work / "nowhere" / "ledger.db"
    elif kind == "folder":
        place.mkdir()
    elif kind == "fifo":
        os.mkfifo(place)
    elif kind == "symlink loop":
        place.symlink_to(place)
    elif kind == "dangling symlink":
        place.symlink_to(work / "gone.db")
    elif kind == "long name":
        place = work / ("l" * 300)
    elif kind in ("dev null", "dev full"):
        return "/dev/null" if kind == "dev null" else "/dev/full"
    elif kind == "bad url":
        return "postgresql://[::1/x"
    elif kind == "empty file":
        place.write_bytes(b"")
    elif kind == "garbage file":
        place.write_bytes(os.urandom(300))
    elif kind == "json lines file":
        place.write_text('{"ledger_version": 1}\n')
    elif kind == "other sqlite":
        import sqlite3

        connection = sqlite3.connect(place)
        connection.execute("CREATE TABLE t (x)")
        connection.commit()
        connection.close()
    elif kind == "the input":
        place = work / "data.parquet"
    elif kind == "the report":
        place = work / "out" / "report.json"
    return str(place)


@ROUND3
@given(kind=st.sampled_from(LEDGER_PLACES), seed=st.integers(0, 2**32 - 1))
def test_a_ledger_anywhere_is_used_or_refused_cleanly(kind: str, seed: int) -> None:
    with case_folder() as (work, scratch):
        planted(np.random.default_rng(seed)).write_parquet(work / "data.parquet")
        spec = work / "spec.yaml"
        spec.write_text(json.dumps(spec_document()))
        code, stderr = run_case(work, scratch, spec, f"ledger at {kind}, seed={seed}", "--ledger",
                                ledger_place(work, kind))
        assert code in ((0,) if kind in ("new file", "empty file", "dangling symlink") else (1, 6)), \
            f"ledger at {kind}: exit {code}: {stderr}"
        assert not Path("/dev/null-journal").exists()


# Keys matplotlib's math text, HTML or a shell would read otherwise.
HOSTILE = st.text(alphabet=st.sampled_from(list("$\\{}^_%&<>\"'#~ abcx9")), min_size=1, max_size=12)


@pytest.mark.draws_charts
@ROUND3
@given(keys=st.lists(HOSTILE, min_size=1, max_size=3, unique=True), seed=st.integers(0, 2**32 - 1))
def test_hostile_partition_keys_are_released_and_drawn_as_text(keys: list[str], seed: int) -> None:
    """A key with `$...$` reached matplotlib's math parser: one row could block every release."""
    with case_folder() as (work, scratch):
        rng = np.random.default_rng(seed)
        frame = planted(rng).with_columns(shop=pl.Series([keys[i % len(keys)] for i in range(600)]))
        frame.write_parquet(work / "data.parquet")
        spec = work / "spec.yaml"
        spec.write_text(json.dumps(spec_document(query={"partitions": {"public": keys}})))
        code, stderr = run_case(work, scratch, spec, f"keys {keys!r}, seed={seed}")
        assert code == 0, f"keys {keys!r}: exit {code}: {stderr}"
        card = (work / "out" / "report.html").read_text()
        assert all(html.escape(key) in card for key in keys), keys
        assert '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>' not in card, "charts undrawn"


@ROUND3
@given(terms=st.integers(1, 8000), joiner=st.sampled_from([" or ", " and ", " + ", " || "]))
def test_long_expressions_are_run_or_refused_cleanly(terms: int, joiner: str) -> None:
    """About 500 OR terms raised RecursionError; about 6,000 killed the process in Polars' parser, and about
    950 `||` in its optimizer (a segmentation fault of the whole process)."""
    parts = {" or ": "v = {}", " and ": "v <> {}", " + ": "v", " || ": "shop"}[joiner]
    text = joiner.join(parts.format(i) for i in range(terms))
    text = {" + ": f"({text}) >= 0", " || ": f"length({text}) > 0"}.get(joiner, text)
    with case_folder() as (work, scratch):
        planted(np.random.default_rng(terms)).write_parquet(work / "data.parquet")
        spec = work / "spec.yaml"
        spec.write_text(json.dumps(spec_document(query={"filter": text})))
        code, stderr = run_case(work, scratch, spec, f"{terms} terms joined by {joiner!r}")
        operators = terms - 1 + (terms if joiner in (" or ", " and ") else 1)  # the terms' own, or the comparison
        assert code == (0 if operators <= MAX_OPERATORS else 1), f"{terms} terms joined by {joiner!r}: exit {code}: {stderr}"


@settings(ROUND3, max_examples=max(1, EXAMPLES // 20))
@given(pause=st.floats(0.0, 0.05), runners=st.integers(2, 3))
def test_concurrent_publications_leave_one_whole_release(pause: float, runners: int) -> None:
    """Runs on one report path at once: each publishes in turn; `current` always names a folder."""
    import subprocess
    import sys

    with case_folder() as (work, _):
        planted(np.random.default_rng(runners)).write_parquet(work / "data.parquet")
        for name in OUTPUTS:
            (work / name).unlink()
        spec = work / "spec.yaml"
        spec.write_text(json.dumps(spec_document()))
        env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "DPRUN_DEBUG")}
        env["DPRUN_TEST_PUBLISH_PAUSE"] = str(pause)
        racers = [subprocess.Popen(chartless_dprun("run", str(spec), "--overwrite"),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
                  for _ in range(runners)]
        errors = [racer.communicate(timeout=CASE_SECONDS * 2)[1] for racer in racers]
        assert [racer.returncode for racer in racers] == [0] * runners, errors
        verified = invoke("verify", str(work / "out" / "report.json"))
        assert verified.exit_code == 0, verified.output
        dangling = [p for p in work.rglob("*") if p.is_symlink() and not p.exists() and ".dprun" not in p.parts]
        assert not dangling, dangling

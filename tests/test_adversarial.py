"""Adversarial inputs through the CLI: every case ends with a clear message and its documented exit
code (docs/ci.md), publishes nothing when it fails, overwrites nothing, leaves no temporary file,
prints no traceback, and never shows a value from the data.

Each case builds a folder (data, spec) in tmp_path and runs `dprun run SPEC --overwrite --seed N`
in-process through the entry point `dprun.cli.main`, with DPRUN_TMPDIR pointing at an empty
folder. Failing cases pre-create the query output and both reports: `--overwrite` lets the run go
as far as it can, and their bytes must be unchanged afterwards (the whole folder is compared file by
file). Every input holds planted secrets — privacy ids `SECRET-ID-9e1f…` and the value
987654.321 — which must not appear in stdout, stderr or any file the run writes. SIGINT and SIGTERM
are sent to a real `python -m dprun` process in the middle of a run.

Cases marked xfail are dprun bugs; the reason names the fix.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from dprun import publish
from dprun.engines import sorted_bounding
from dprun_testing import fresh_seed, invoke

SECRET_ID = "SECRET-ID-9e1f"
SECRET_VALUE = 987654.321
# How a planted secret could show up in text: the id, the value in any usual notation.
SECRET_TEXT = re.compile(r"SECRET-ID|987[,_ ]?654[.,]321|9\.876543\d*e\+?0*5", re.IGNORECASE)
SECRET_BYTES = (SECRET_ID.encode(), struct.pack("<d", SECRET_VALUE), struct.pack(">d", SECRET_VALUE))
PRE_EXISTING = b"pre-existing output: a failed run must leave these bytes alone\n"
OUTPUTS = ("out/q.parquet", "out/report.json", "out/report.md")


# --- running the CLI ------------------------------------------------------------------------


# --- data and specs -------------------------------------------------------------------------


def planted(rng: np.random.Generator, rows: int = 600, shops: tuple[str, ...] = ("a", "b")) -> pl.DataFrame:
    """Visits with secret-looking privacy ids and values among ordinary ones."""
    uid = [f"u{i}" for i in rng.integers(0, rows // 3, rows)]
    v = rng.uniform(0, 50, rows)
    for i in range(0, rows, 50):
        uid[i] = f"{SECRET_ID}-{i}" if i else SECRET_ID
        v[i + 1] = SECRET_VALUE
    return pl.DataFrame({"uid": uid, "shop": [shops[i] for i in rng.integers(0, len(shops), rows)], "v": v})


METRICS = [{"name": "visits", "kind": "count"}, {"name": "spend", "kind": "sum", "column": "v", "bounds": [0, 50]}]


def spec_document(data: str | dict[str, Any] = "data.parquet", **changes: Any) -> dict[str, Any]:
    query: dict[str, Any] = {
        "name": "q", "input": "data", "group_by": ["shop"], "partitions": {"public": ["a", "b"]},
        "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 2},
        "metrics": METRICS, "output": {"path": "out/q.parquet"},
    }
    query.update(changes.pop("query", {}))
    document = {
        "version": 1, "name": "adversarial", "privacy_unit": "uid",
        "budget": {"epsilon": 1.0, "delta": 1e-6},
        "inputs": {"data": data if isinstance(data, dict) else {"path": data}},
        "queries": [query], "report": "out/report.json",
    }
    document.update(changes)
    return document


def write_spec(folder: Path, document: dict[str, Any]) -> Path:
    path = folder / "spec.yaml"
    # JSON is YAML 1.2; literal non-ASCII text (YAML's \u escapes cannot pair UTF-16 surrogates).
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


def budget(epsilon: Any = 1.0, delta: Any = 1e-6) -> dict[str, Any]:
    return {"budget": {"epsilon": epsilon, "delta": delta}}


# --- the cases ------------------------------------------------------------------------------


@dataclass
class Case:
    """What one adversarial run must end with."""

    spec: Path
    exit_codes: tuple[int, ...]  # the documented code (several when either outcome is right)
    message: str = ""  # a regex stderr must match on failure
    check: Callable[[Path], None] | None = None  # more checks of a successful run's outputs
    extra_args: tuple[str, ...] = ()


Builder = Callable[[Path, np.random.Generator, pytest.MonkeyPatch], Case]


def good_parquet(folder: Path, rng: np.random.Generator) -> None:
    planted(rng).write_parquet(folder / "data.parquet")


def missing_input_file(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    return Case(write_spec(folder, spec_document("missing.parquet")), (1,), r"no file matches 'missing\.parquet'")


def empty_csv(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    (folder / "data.csv").write_bytes(b"")
    return Case(write_spec(folder, spec_document("data.csv")), (1,), r"inputs\.data\.path: cannot read the csv schema")


def glob_matching_nothing(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    (folder / "parts").mkdir()
    good_parquet(folder, rng)  # a file the glob does not match
    return Case(write_spec(folder, spec_document("parts/*.parquet")), (1,), r"no file matches 'parts/\*\.parquet'")


def corrupt_parquet(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    (folder / "data.parquet").write_bytes(b"PAR1" + f"{SECRET_ID},{SECRET_VALUE}".encode() * 40 + b"PAR1")
    return Case(write_spec(folder, spec_document()), (1,), r"cannot read the parquet schema")


def corrupt_parquet_pages(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """A valid footer and schema, garbage in the compressed pages of the privacy unit column."""
    planted(rng, rows=20_000).write_parquet(folder / "data.parquet", compression="zstd")
    chunk = pq.ParquetFile(folder / "data.parquet").metadata.row_group(0).column(0)
    data = bytearray((folder / "data.parquet").read_bytes())
    start = chunk.data_page_offset + chunk.total_compressed_size // 4
    for i in range(start, start + min(chunk.total_compressed_size // 2, 4000)):
        data[i] = (i * 131 + 7) % 256
    (folder / "data.parquet").write_bytes(bytes(data))
    return Case(write_spec(folder, spec_document()), (3,), r"data could not be processed")


def ragged_csv(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    lines = ["uid,shop,v"] + [f"u{i},a,{i % 50}" for i in range(200)]
    lines.insert(50, f"{SECRET_ID},b,1,{SECRET_VALUE}")  # one field too many
    (folder / "data.csv").write_text("\n".join(lines) + "\n")
    return Case(write_spec(folder, spec_document("data.csv")), (3,), r"data could not be processed")


def strings_in_the_schema_sample(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    frame = planted(rng).with_columns(pl.col("v").cast(pl.String))
    frame = frame.with_columns(v=pl.when(pl.int_range(pl.len()) == 7).then(pl.lit(f"{SECRET_VALUE}€"))
                               .otherwise(pl.col("v")))
    frame.write_csv(folder / "data.csv")
    return Case(write_spec(folder, spec_document("data.csv")), (1,), r"column 'v' is (String|str), not numeric")


def strings_beyond_the_schema_sample(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    frame = planted(rng, rows=3000).with_columns(pl.col("v").cast(pl.String))
    frame = frame.with_columns(v=pl.when(pl.int_range(pl.len()) == 2500).then(pl.lit(f"{SECRET_ID}"))
                               .otherwise(pl.col("v")))
    frame.write_csv(folder / "data.csv")
    return Case(write_spec(folder, spec_document("data.csv")), (3,), r"data could not be processed")


def released_keys(expected: list[Any], column: str = "shop") -> Callable[[Path], None]:
    def check(folder: Path) -> None:
        out = pl.read_parquet(folder / "out" / "q.parquet")
        assert sorted(out[column].to_list()) == sorted(expected), out
        for name in out.columns:
            if out[name].dtype.is_float():
                assert out[name].is_finite().all(), f"non-finite {name}: {out[name].to_list()[:10]}"
    return check


def all_null_privacy_units(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    frame = planted(rng)
    lines = ["uid,shop,v"] + [f",{s},{v}" for s, v in zip(frame["shop"], frame["v"], strict=True)]
    (folder / "data.csv").write_text("\n".join(lines) + "\n")
    # Rows without a privacy unit are dropped: the listed partitions come out with noise only.
    return Case(write_spec(folder, spec_document("data.csv")), (0,), check=released_keys(["a", "b"]))


def nan_inf_and_huge_values(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    frame = planted(rng)
    extremes = [np.nan, np.inf, -np.inf, 1e308, -1e308, 5e-324, SECRET_VALUE]
    frame = frame.with_columns(v=pl.Series([extremes[i % len(extremes)] if i % 3 == 0 else x
                                            for i, x in enumerate(frame["v"])]))
    frame.write_parquet(folder / "data.parquet")
    metrics = [*METRICS, {"name": "avg", "kind": "mean", "column": "v", "bounds": [0, 50]},
               {"name": "sd", "kind": "stddev", "column": "v", "bounds": [0, 50]}]
    return Case(write_spec(folder, spec_document(query={"metrics": metrics})), (0,), check=released_keys(["a", "b"]))


def a_million_public_partitions(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    keys = [f"k{i:07d}" for i in range(10**6)]
    planted(rng, shops=("k0000001", "k0999999", "unlisted")).write_parquet(folder / "data.parquet")
    pl.DataFrame({"shop": keys}).write_csv(folder / "keys.csv")

    def check(out_folder: Path) -> None:
        out = pl.read_parquet(out_folder / "out" / "q.parquet")
        assert out.height == 10**6 and out["shop"].n_unique() == 10**6, out.height
        assert out["shop"].is_sorted() and out["shop"][0] == keys[0] and out["shop"][-1] == keys[-1]

    return Case(write_spec(folder, spec_document(query={"partitions": {"public_file": "keys.csv"}})), (0,),
                check=check)


UNICODE_KEYS = ["", " ", "café", "cafe\u0301", "日本", "😀", "a,b", 'q"x', "line\nbreak", "ﬁ", "\u200b"]


def unicode_and_empty_string_keys(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    frame = planted(rng, rows=3000, shops=tuple(UNICODE_KEYS))
    frame.with_columns(uid=pl.col("uid") + "-ß✓").write_csv(folder / "data.csv")
    public = [*UNICODE_KEYS, "Ω-absent"]
    return Case(write_spec(folder, spec_document("data.csv", query={"partitions": {"public": public}})), (0,),
                check=released_keys(public))


def metric_bounds(bounds: list[float]) -> Builder:
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        metrics = [{"name": "spend", "kind": "sum", "column": "v", "bounds": bounds}]
        return Case(write_spec(folder, spec_document(query={"metrics": metrics})), (1,),
                    r"metrics\[0\]\.bounds: .*(smaller|finite)")
    return build


def budget_of(epsilon: Any, delta: Any, field_name: str, codes: tuple[int, ...] = (1,)) -> Builder:
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        document = spec_document(**budget(epsilon, delta))
        path = write_spec(folder, document)
        if isinstance(epsilon, float) and epsilon != epsilon:  # JSON has no NaN: YAML's .nan
            path.write_text(path.read_text().replace("NaN", ".nan"))
        if isinstance(delta, float) and delta != delta:
            path.write_text(path.read_text().replace("NaN", ".nan"))
        return Case(path, codes, rf"budget\.{field_name}")
    return build


def read_only_output_folder(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    good_parquet(folder, rng)
    locked = folder / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):
        # Root ignores the mode: a folder that cannot be created stands in (its parent is a file).
        (folder / "locked.parquet").write_text("a regular file\n")
        target = "locked.parquet/q.parquet"
    else:
        target = "locked/q.parquet"
    return Case(write_spec(folder, spec_document(query={"output": {"path": target}})), (6,),
                r"(cannot write|not writable).*q\.parquet|locked")


def output_folder_is_a_file(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    good_parquet(folder, rng)
    (folder / "out.parquet").write_text("a regular file where a folder should be\n")
    return Case(write_spec(folder, spec_document(query={"output": {"path": "out.parquet/x.parquet"}})), (6,),
                r"cannot write .*out\.parquet/x\.parquet")


def output_is_the_input(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    planted(rng).write_csv(folder / "data.csv")
    document = spec_document("data.csv", query={"output": {"path": "./data.csv", "overwrite": True}})
    return Case(write_spec(folder, document), (1,), r"output path is a file this spec reads")


def disk_full(what: str) -> Builder:
    """ENOSPC as the libraries really raise it (checked on a full tmpfs): Python file writes raise
    OSError(ENOSPC); Polars' CSV writer an OSError without errno; its Parquet writer and sinks a
    ComputeError, except its partitioned Arrow sink (the sorted path's shards), an OSError without
    errno. The writer first writes part of the file, as a real full disk does."""
    full = "No space left on device (os error 28)"

    def partial_then_fail(error: BaseException, original: Callable[..., Any] | None = None) -> Callable[..., Any]:
        def write(self: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(target, (str, Path)) and not str(target).startswith(str(os.environ["DPRUN_TMPDIR"])):
                Path(target).write_bytes(PRE_EXISTING[:10])
            raise error
        return write

    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        output = "out/q.csv" if what == "csv output" else "out/q.parquet"
        path = write_spec(folder, spec_document(query={"output": {"path": output}}))
        if what == "csv output":
            mp.setattr(pl.DataFrame, "write_csv", partial_then_fail(OSError(full)))
        elif what == "parquet output":
            mp.setattr(pl.DataFrame, "write_parquet",
                       partial_then_fail(pl.exceptions.ComputeError(f"parquet: underlying IO error: {full}")))
        elif what == "report":
            real_write_text = Path.write_text

            def write_text(self: Path, *args: Any, **kwargs: Any) -> int:
                if self.name.startswith(".report.json"):
                    real_write_text(self, "{")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real_write_text(self, *args, **kwargs)

            mp.setattr(Path, "write_text", write_text)
        elif what == "scratch":
            mp.setattr(pl.LazyFrame, "sink_parquet",
                       partial_then_fail(pl.exceptions.ComputeError(f"parquet: underlying IO error: {full}")))
        elif what == "sorted scratch":
            integers = pl.DataFrame({"uid": rng.integers(0, 200, 600), "shop": rng.integers(0, 2, 600),
                                     "v": rng.uniform(0, 50, 600)})
            integers.write_parquet(folder / "data.parquet")
            path = write_spec(folder, spec_document(query={"output": {"path": output}, "partitions": {"public": [0, 1]}}))
            mp.setattr(sorted_bounding, "SHARD_ROWS", 64)
            mp.setattr(pl.LazyFrame, "sink_ipc", partial_then_fail(OSError(full)))
        return Case(path, (6,), r"No space left on device")

    return build


def disk_full_while_moving_outputs_into_place(folder: Path, rng: np.random.Generator,
                                              mp: pytest.MonkeyPatch) -> Case:
    """rename(2) can fail with ENOSPC (no room for a directory entry): here the second rename."""
    good_parquet(folder, rng)
    real_replace = os.replace
    calls: list[str] = []

    def replace(source: Any, target: Any) -> None:
        calls.append(str(target))
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(source, target)

    mp.setattr(publish.os, "replace", replace)
    return Case(write_spec(folder, spec_document()), (6,), r"No space left on device")


def public_key_of_another_type(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    planted(rng).with_columns(shop=pl.int_range(pl.len()) % 3).write_parquet(folder / "data.parquet")
    return Case(write_spec(folder, spec_document(query={"partitions": {"public": [0, 1, "two"]}})), (1,),
                r"partitions\.public")


def overwrites_a_file_it_reads(which: str) -> Builder:
    """The run would replace a file it reads; dprun says it never overwrites its inputs."""
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        if which == "report is the input":
            planted(rng).write_ndjson(folder / "data.json")
            document = spec_document({"path": "data.json", "format": "ndjson"}, report="data.json")
        elif which == "markdown report is the input":
            (folder / "out").mkdir()
            planted(rng).write_csv(folder / "out" / "report.md")
            document = spec_document({"path": "out/report.md", "format": "csv"})
        elif which == "output matched by the input glob":
            (folder / "parts").mkdir()
            planted(rng).write_csv(folder / "parts" / "a.csv")
            planted(rng).write_csv(folder / "parts" / "b.csv")
            document = spec_document("parts/*.csv", query={"output": {"path": "parts/b.csv", "overwrite": True}})
        elif which == "output is the public_file":
            good_parquet(folder, rng)
            pl.DataFrame({"shop": ["a", "b"]}).write_csv(folder / "keys.csv")
            document = spec_document(query={"partitions": {"public_file": "keys.csv"},
                                            "output": {"path": "keys.csv", "overwrite": True}})
        else:  # the spec file itself
            good_parquet(folder, rng)
            document = spec_document(query={"output": {"path": "spec.yaml", "format": "csv", "overwrite": True}})
        return Case(write_spec(folder, document), (1,), r"input|spec|report|public")
    return build


def out_of_range(kind: str) -> Builder:
    """Finite values the schema accepts; the planner should plan them or refuse them in words."""
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        if kind == "tiny epsilon":
            document = spec_document(**budget(1e-300))
        elif kind == "huge epsilon":
            document = spec_document(**budget(1e300))
        else:
            bounds = [0, 1e308] if kind == "huge bounds" else [1e-300, 2e-300]
            document = spec_document(query={"metrics": [{"name": "s", "kind": "sum", "column": "v",
                                                         "bounds": bounds}]})
        return Case(write_spec(folder, document), (0, 1), r"budget|bounds|epsilon")
    return build


def xfail(reason: str) -> Any:
    return pytest.mark.xfail(strict=True, reason=f"dprun bug: {reason}")


CASES: list[Any] = [
    pytest.param(missing_input_file, id="missing input file"),
    pytest.param(empty_csv, id="empty csv (0 bytes)"),
    pytest.param(glob_matching_nothing, id="glob matching nothing"),
    pytest.param(corrupt_parquet, id="corrupt parquet"),
    pytest.param(corrupt_parquet_pages, id="corrupt parquet pages behind a valid footer"),
    pytest.param(ragged_csv, id="csv with a ragged row"),
    pytest.param(strings_in_the_schema_sample, id="strings in a metric column, in the schema sample"),
    pytest.param(strings_beyond_the_schema_sample, id="strings in a metric column, after row 1000"),
    pytest.param(all_null_privacy_units, id="all-null privacy unit column"),
    pytest.param(nan_inf_and_huge_values, id="nan, inf and 1e308 values"),
    pytest.param(a_million_public_partitions, id="a million public partitions"),
    pytest.param(unicode_and_empty_string_keys, id="unicode and empty-string keys"),
    pytest.param(metric_bounds([5, 5]), id="bounds lower = upper"),
    pytest.param(metric_bounds([10, 0]), id="bounds lower > upper"),
    pytest.param(budget_of(0, 1e-6, "epsilon"), id="epsilon 0"),
    pytest.param(budget_of(-1.0, 1e-6, "epsilon"), id="epsilon negative"),
    pytest.param(budget_of(float("nan"), 1e-6, "epsilon"), id="epsilon nan"),
    pytest.param(budget_of(1.0, 1.0, "delta"), id="delta 1"),
    pytest.param(budget_of(1.0, 1.5, "delta"), id="delta above 1"),
    pytest.param(read_only_output_folder, id="output in a read-only folder"),
    pytest.param(output_folder_is_a_file, id="output folder is a file"),
    pytest.param(output_is_the_input, id="output path is the input path"),
    pytest.param(disk_full("report"), id="disk full writing the report"),
    pytest.param(disk_full("csv output"), id="disk full writing a csv output"),
    pytest.param(disk_full("parquet output"), id="disk full writing a parquet output"),
    pytest.param(disk_full("scratch"), id="disk full writing intermediate files"),
    pytest.param(disk_full("sorted scratch"), id="disk full writing the sorted path's shards"),
    pytest.param(disk_full_while_moving_outputs_into_place, id="disk full while moving outputs into place"),
    pytest.param(public_key_of_another_type, id="public key that does not fit the column type"),
    pytest.param(overwrites_a_file_it_reads("report is the input"), id="report path is the input path"),
    pytest.param(overwrites_a_file_it_reads("markdown report is the input"), id="markdown report path is the input"),
    pytest.param(overwrites_a_file_it_reads("output matched by the input glob"),
                 id="output path matched by the input glob"),
    pytest.param(overwrites_a_file_it_reads("output is the public_file"), id="output path is the public_file"),
    pytest.param(overwrites_a_file_it_reads("output is the spec"), id="output path is the spec file"),
    pytest.param(out_of_range("tiny epsilon"), id="epsilon 1e-300"),
    pytest.param(out_of_range("huge epsilon"), id="epsilon 1e300"),
    pytest.param(out_of_range("huge bounds"), id="bounds [0, 1e308]"),
    pytest.param(out_of_range("tiny bounds"), id="bounds [1e-300, 2e-300]"),
]


# --- the checks -----------------------------------------------------------------------------


def snapshot(folder: Path, skip: Path) -> dict[str, str]:
    """Every file below `folder` (hidden ones too, not below `skip`) with the sha256 of its bytes."""
    found = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and skip not in path.parents:
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def temporaries(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.name.endswith(".tmp") or ".dprun-" in p.name
            or p.name.startswith("dprun-")]


def leaks(text: str) -> list[str]:
    return sorted({m.group(0) for m in SECRET_TEXT.finditer(text)})


def file_leaks(path: Path) -> list[str]:
    """Planted secrets in a file: in its bytes, and in a Parquet file's decoded (decompressed) values."""
    data = path.read_bytes()
    found = [repr(s) for s in SECRET_BYTES if s in data]
    found += leaks(data.decode("utf-8", errors="replace"))
    if data[:4] == b"PAR1":
        table = pl.read_parquet(path)
        for name, column in table.to_dict().items():
            if column.dtype.is_float() and bool((column - SECRET_VALUE).abs().lt(1e-3).any()):
                found.append(f"{name} holds {SECRET_VALUE}")
            text = column.cast(pl.String, strict=False)
            if bool(text.str.contains(f"(?i){SECRET_TEXT.pattern}").any()):
                found.append(f"{name} holds a planted text")
    return found


def test_the_leak_detector_finds_the_planted_secrets(tmp_path: Path) -> None:
    frame = planted(np.random.default_rng(fresh_seed()))
    for name, write in (("a.parquet", frame.write_parquet), ("b.csv", frame.write_csv)):
        write(tmp_path / name)
        assert file_leaks(tmp_path / name), name
    frame.select("v").write_parquet(tmp_path / "v.parquet")
    assert "v holds 987654.321" in file_leaks(tmp_path / "v.parquet")
    assert leaks(f"x {SECRET_VALUE:,} y") and leaks(f"{SECRET_VALUE:e}") and not leaks("987654")


def check_streams(stdout: str, stderr: str, what: str) -> None:
    text = stdout + stderr
    assert "Traceback" not in text and 'File "' not in text, f"{what}: a traceback was printed:\n{text}"
    assert not leaks(text), f"{what}: the output shows data values {leaks(text)}:\n{text}"


def check_failed_run(what: str, exit_code: int, stderr: str, message: str, before: dict[str, str],
                     after: dict[str, str]) -> None:
    assert stderr.startswith("error: "), f"{what}: no error message on stderr: {stderr!r}"
    assert re.search(message, stderr, re.IGNORECASE | re.DOTALL), f"{what}: unclear message {stderr!r} (/{message}/)"
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    assert not changed, f"{what}: exit {exit_code} but these files changed: {changed}"
    published, removed = sorted(after.keys() - before.keys()), sorted(before.keys() - after.keys())
    assert not published, f"{what}: exit {exit_code} but published {published}"
    assert not removed, f"{what}: exit {exit_code} but removed {removed}"


@pytest.mark.parametrize("build", CASES)
def test_adversarial_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, build: Builder) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("DPRUN_TMPDIR", str(scratch))
    monkeypatch.delenv("DPRUN_LEDGER", raising=False)
    monkeypatch.delenv("DPRUN_DEBUG", raising=False)
    case = build(work, rng, monkeypatch)
    failing = 0 not in case.exit_codes
    if failing:
        (work / "out").mkdir(exist_ok=True)
        for name in OUTPUTS:
            if not (work / name).exists():
                (work / name).write_bytes(PRE_EXISTING)
    before = snapshot(work, scratch)

    result = invoke("run", str(case.spec), "--overwrite", "--seed", str(seed), *case.extra_args)
    monkeypatch.undo()  # the writers patched for disk-full cases, before reading anything back
    what = f"seed={seed}"
    after = snapshot(work, scratch)

    assert result.exception is None or isinstance(result.exception, SystemExit), f"{what}: {result.exception!r}"
    check_streams(result.stdout, result.stderr, what)
    assert result.exit_code in case.exit_codes, (
        f"{what}: exit {result.exit_code}, documented {case.exit_codes}: {result.stdout[-500:]}{result.stderr}")
    assert not temporaries(work), f"{what}: temporary files left: {temporaries(work)}"
    assert not list(scratch.iterdir()), f"{what}: DPRUN_TMPDIR not emptied: {list(scratch.iterdir())}"
    if result.exit_code != 0:
        check_failed_run(what, result.exit_code, result.stderr, case.message, before, after)
        return
    assert not [k for k in before if after.get(k) != before[k]], f"{what}: a successful run changed an input"
    written = sorted(after.keys() - before.keys())
    assert {"out/report.json", "out/report.md"} <= set(written), f"{what}: {written}"
    for name in written:
        assert not file_leaks(work / name), f"{what}: {name} holds data values {file_leaks(work / name)}"
    if case.check is not None:
        case.check(work)


# --- signals ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_input(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~800,000 rows (with planted secrets): a run on them keeps intermediate files for ~0.5 s."""
    path = tmp_path_factory.mktemp("long") / "data.parquet"
    rng = np.random.default_rng(5)
    rows = 800_000
    uid = np.char.add(SECRET_ID + "-", rng.integers(0, rows // 3, rows).astype(str))
    pl.DataFrame({"uid": uid, "shop": rng.integers(0, 5000, rows),
                  "v": np.where(rng.random(rows) < 0.01, SECRET_VALUE, rng.uniform(0, 50, rows))}).write_parquet(path)
    return path


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_the_middle_of_a_run_publishes_nothing(tmp_path: Path, long_input: Path, signum: int) -> None:
    work = tmp_path / "work"
    work.mkdir()
    spec = write_spec(work, spec_document(str(long_input), query={
        "partitions": {"selection": "auto"},
        "contribution_bounds": {"max_partitions_contributed": 3, "max_contributions_per_partition": 2}}))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (work / "out").mkdir()
    for name in OUTPUTS:
        (work / name).write_bytes(PRE_EXISTING)
    before = snapshot(work, scratch)
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "DPRUN_DEBUG")}
    env.update(DPRUN_TMPDIR=str(scratch), PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "dprun", "run", str(spec), "--overwrite"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = []
        assert process.stdout is not None
        for line in process.stdout:  # wait until the handlers are in place and the query runs
            lines.append(line)
            if "running query" in line:
                break
        # The query is provably under way (not yet publishing) while it has intermediate files.
        while process.poll() is None and not any(p.is_file() for p in scratch.rglob("*")):
            time.sleep(0.001)
        assert process.poll() is None, "the run ended before it wrote intermediate files; give it more data"
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    stdout = "".join(lines) + stdout
    what = signal.Signals(signum).name
    check_streams(stdout, stderr, what)
    assert process.returncode == 130, f"{what}: exit {process.returncode}: {stderr}"
    assert re.search(rf"interrupted by {what}; nothing was published", stderr), f"{what}: {stderr!r}"
    check_failed_run(what, 130, stderr, "interrupted", before, snapshot(work, scratch))
    assert not temporaries(work), f"{what}: temporary files left: {temporaries(work)}"
    assert not list(scratch.iterdir()), f"{what}: DPRUN_TMPDIR not emptied: {list(scratch.iterdir())}"

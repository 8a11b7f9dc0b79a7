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
import json
import os
import re
import signal
import sqlite3
import stat
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
from dprun_testing import fresh_seed, invoke
from planted_secrets import (
    METRICS,
    OUTPUTS,
    PRE_EXISTING,
    SECRET_ID,
    SECRET_VALUE,
    check_failed_run,
    check_streams,
    file_leaks,
    leaks,
    planted,
    snapshot,
    spec_document,
    start_run,
    temporaries,
    wait_until_it_catches_signals,
    write_long_input,
    write_spec,
)

from dprun import publish
from dprun.engines import polars_engine, polars_steps, shards

# --- data and specs -------------------------------------------------------------------------


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
    return Case(write_spec(folder, spec_document()), (3,), r"data\.parquet: the Parquet file.s data pages cannot be decoded")


def ragged_csv(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    lines = ["uid,shop,v"] + [f"u{i},a,{i % 50}" for i in range(200)]
    lines.insert(50, f"{SECRET_ID},b,1,{SECRET_VALUE}")  # one field too many
    (folder / "data.csv").write_text("\n".join(lines) + "\n")
    # Within the rows the schema is inferred from, so `validate`'s sample check finds it (exit 1).
    return Case(write_spec(folder, spec_document("data.csv")), (1,), r"line 51 has 4 fields, the header has 3")


def strings_in_the_schema_sample(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    frame = planted(rng).with_columns(pl.col("v").cast(pl.String))
    frame = frame.with_columns(v=pl.when(pl.int_range(pl.len()) == 7).then(pl.lit(f"{SECRET_VALUE}€"))
                               .otherwise(pl.col("v")))
    frame.write_csv(folder / "data.csv")
    return Case(write_spec(folder, spec_document("data.csv")), (1,),
                r"data\.csv: line 9: column 'v' does not parse as float64 \(a metric takes its values")


def strings_beyond_the_schema_sample(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    frame = planted(rng, rows=3000).with_columns(pl.col("v").cast(pl.String))
    frame = frame.with_columns(v=pl.when(pl.int_range(pl.len()) == 2500).then(pl.lit(f"{SECRET_ID}"))
                               .otherwise(pl.col("v")))
    frame.write_csv(folder / "data.csv")
    # Polars stops without saying where; dprun then finds the row (the header is line 1).
    return Case(write_spec(folder, spec_document("data.csv")), (3,),
                r"data\.csv: line 2502: column 'v' does not parse as float64")


def a_value_that_reads_like_an_os_error(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """Polars quotes the unparsable cell in its message; a message that mentions "os error" was
    once passed on as a scratch-disk failure, secret and all (exit 6)."""
    frame = planted(rng, rows=3000).with_columns(pl.col("v").cast(pl.String))
    frame = frame.with_columns(v=pl.when(pl.int_range(pl.len()) == 2500)
                               .then(pl.lit(f"os error {SECRET_ID} (os error 28)")).otherwise(pl.col("v")))
    frame.write_csv(folder / "data.csv")
    return Case(write_spec(folder, spec_document("data.csv")), (3,),
                r"data\.csv: line 2502: column 'v' does not parse as float64")


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


def scratch_disk_full(mp: pytest.MonkeyPatch) -> None:
    """The scratch folder's state on a full disk: the engine's probe write fails with ENOSPC
    (`test_the_scratch_probe_reports_the_operating_systems_refusal` checks the probe itself)."""
    mp.setattr(polars_steps, "scratch_write_problem", lambda folder: os.strerror(errno.ENOSPC))


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
                if self.name.endswith("report.json") and publish.STORE in self.parts:
                    real_write_text(self, "{")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                return real_write_text(self, *args, **kwargs)

            mp.setattr(Path, "write_text", write_text)
        elif what == "scratch":
            mp.setattr(pl.LazyFrame, "sink_parquet",
                       partial_then_fail(pl.exceptions.ComputeError(f"parquet: underlying IO error: {full}")))
            scratch_disk_full(mp)
        elif what == "sorted scratch":
            integers = pl.DataFrame({"uid": rng.integers(0, 200, 600), "shop": rng.integers(0, 2, 600),
                                     "v": rng.uniform(0, 50, 600)})
            integers.write_parquet(folder / "data.parquet")
            path = write_spec(folder, spec_document(query={"output": {"path": output}, "partitions": {"public": [0, 1]}}))
            # One row group, where the hash gives several shards: through the partitioned sink.
            mp.setattr(shards, "SHARD_ROWS", 64)
            mp.setattr(pl.LazyFrame, "sink_ipc", partial_then_fail(OSError(full)))
            scratch_disk_full(mp)
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
        elif kind == "epsilon 5e35":  # found by tests/test_fuzz_run.py: the grid overflowed Int128
            document = spec_document(**budget(5.192296858539551e35))
        else:
            bounds = [0, 1e308] if kind == "huge bounds" else [1e-300, 2e-300]
            document = spec_document(query={"metrics": [{"name": "s", "kind": "sum", "column": "v",
                                                         "bounds": bounds}]})
        return Case(write_spec(folder, document), (0, 1), r"budget|bounds|epsilon")
    return build


# --- the hardening issue's defects, one case each (the number is the issue's) -----------------


def csv_with(edit: Callable[[list[str]], None], at_line: int = 1502) -> Builder:
    """A CSV of 2000 good rows (past Polars' 1000-row schema sample), edited; `at_line` is where the
    bad row ends up (line 1 is the header)."""
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        lines = ["uid,shop,v"] + [f"u{i % 300},{'ab'[i % 2]},{i % 50}" for i in range(2000)]
        edit(lines)
        (folder / "data.csv").write_text("\n".join(lines) + "\n")
        return Case(write_spec(folder, spec_document("data.csv")), (3,), rf"data\.csv: line {at_line} ")
    return build


def ndjson_id_that_is_an_object(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#7: an object where the schema has a string was read as its JSON text and counted."""
    rows = [json.dumps({"uid": f"u{i % 300}", "shop": "ab"[i % 2], "v": i % 50}) for i in range(1500)]
    rows.insert(1200, json.dumps({"uid": {"id": SECRET_ID}, "shop": "a", "v": SECRET_VALUE}))
    (folder / "data.ndjson").write_text("\n".join(rows) + "\n")
    return Case(write_spec(folder, spec_document("data.ndjson")), (3,),
                r"line 1201: column 'uid' holds a JSON object or list")


def duplicate_csv_header(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    (folder / "data.csv").write_text("uid,shop,v,v\n" + "".join(f"u{i},a,{i},{i}\n" for i in range(50)))
    return Case(write_spec(folder, spec_document("data.csv")), (1,), r"header names column\(s\) v more than once")


def target_that_is_not_a_file(what: str) -> Builder:
    """#2, #3: a folder, a FIFO or a dangling symbolic link where an output or the report goes."""
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        (folder / "out").mkdir()
        target = folder / ("out/report.json" if what == "report is a folder" else "out/q.parquet")
        if what.endswith("is a folder"):
            target.mkdir()
            (target / "keep.txt").write_text("the user's own file\n")
            message = r"it is a folder"
        else:
            os.mkfifo(target)
            message = r"special file"
        return Case(write_spec(folder, spec_document()), (6,), message)
    return build


def dangling_symlink_output(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """The output path is a symbolic link to a file that does not exist: publication makes the path
    dprun's own link into its release store (docs/ci.md) and writes nothing where the old link pointed."""
    good_parquet(folder, rng)
    (folder / "out").mkdir()
    (folder / "out" / "q.parquet").symlink_to(folder / "elsewhere" / "q.parquet")

    def check(out_folder: Path) -> None:
        assert pl.read_parquet(out_folder / "out" / "q.parquet")["shop"].to_list() == ["a", "b"]
        assert not (out_folder / "elsewhere").exists()

    return Case(write_spec(folder, spec_document()), (0,), check=check)


def ledger_at(where: str) -> Builder:
    """#5: the ledger at an output or the report, in the spec or on the command line."""
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        if where == "spec ledger is the output":
            return Case(write_spec(folder, spec_document(ledger="out/q.parquet")), (1,), r"ledger.*publishes")
        return Case(write_spec(folder, spec_document()), (1,), r"ledger.*publishes",
                    extra_args=("--ledger", str(folder / "out" / "report.json")))
    return build


def spec_change(field_value: dict[str, Any], message: str, code: int = 1, data: str = "data.parquet",
                query: dict[str, Any] | None = None) -> Builder:
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        changes = dict(field_value)
        if query is not None:
            changes["query"] = query
        return Case(write_spec(folder, spec_document(data, **changes)), (code,), message)
    return build


def metric_share(share: float) -> dict[str, Any]:
    return {"metrics": [{"name": "visits", "kind": "count", "budget_share": share}, METRICS[1]]}


def input_symlink_loop(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#13."""
    (folder / "loop.parquet").symlink_to(folder / "loop.parquet")
    return Case(write_spec(folder, spec_document("loop.parquet")), (1,), r"symbolic link loop")


def alias_bomb(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#8: nine lines that expand to 10^9 values."""
    good_parquet(folder, rng)
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"{c}: &{c} [{', '.join([f'*{p}'] * 10)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    spec = folder / "spec.yaml"
    spec.write_text("\n".join(lines) + "\n")
    return Case(spec, (1,), r"expands to more than")


def scratch_folder(what: str) -> Builder:
    """#14: DPRUN_TMPDIR missing, or a file."""
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        target = folder / "no-such-folder"
        if what == "a file":
            target = folder / "a-file"
            target.write_text("not a folder\n")
        mp.setenv("DPRUN_TMPDIR", str(target))
        return Case(write_spec(folder, spec_document()), (6,), r"intermediate files in DPRUN_TMPDIR=")
    return build


def input_deleted_before_the_scan(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#15: the input disappears after validation (say, while waiting for the ledger lock)."""
    good_parquet(folder, rng)
    real_run_query = polars_engine.run_query

    def run_query(*args: Any, **kwargs: Any) -> Any:
        away = folder.parent / "moved-away.parquet"
        (folder / "data.parquet").rename(away)
        try:
            return real_run_query(*args, **kwargs)
        finally:
            away.rename(folder / "data.parquet")  # the folder must look as before the run

    mp.setattr(polars_engine, "run_query", run_query)
    return Case(write_spec(folder, spec_document()), (3,), r"input file could not be read")


# --- round 3 (issue #41): each case is a defect a third fuzz round found ------------------------


def csv_file(folder: Path, rng: np.random.Generator, rows: int = 600, **columns: list[str]) -> None:
    """The planted visits as CSV, with extra text columns."""
    frame = planted(rng, rows=rows).with_columns(**{name: pl.Series(values) for name, values in columns.items()})
    frame.write_csv(folder / "data.csv")


def a_field_longer_than_python_s_csv_limit(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#4: free text of 200,000 characters in one field (Python's csv refused over 131,072)."""
    csv_file(folder, rng, note=["x" * 200_000 if i == 3 else "short" for i in range(600)])
    return Case(write_spec(folder, spec_document("data.csv")), (0,))


def a_count_of_a_text_column(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#5: `count` of a text column counts its non-null values, the texts `NaN` and `1.5` among them."""
    csv_file(folder, rng, note=[["hello", "NaN", None, "1.5"][i % 4] for i in range(600)])
    query = {"metrics": [{"name": "notes", "kind": "count", "column": "note"}, {"name": "rows", "kind": "count"}],
             "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 600}}

    def counted(work: Path) -> None:
        released = pl.read_parquet(work / "out" / "q.parquet")
        ratio = released["notes"].sum() / released["rows"].sum()
        assert abs(ratio - 0.75) < 0.05, released  # a missing note does not count; any text does
    return Case(write_spec(folder, spec_document("data.csv", budget={"epsilon": 10_000.0}, query=query)), (0,),
                check=counted)


def non_ascii_digits_in_an_integer_column(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#6: Python's \\d takes Arabic-Indic digits, Polars does not: the check and the run now agree."""
    csv_file(folder, rng, n=["\u0663" if i == 20 else str(i) for i in range(600)])
    data = {"path": "data.csv", "columns": {"n": "int64"}}
    return Case(write_spec(folder, spec_document(data)), (1,), r"data\.csv: line 22: column 'n' does not parse as int64")


def a_date_format_chrono_cannot_read(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#6: an invalid format (%Q) was blamed on the data."""
    csv_file(folder, rng, day=["2024-01-05"] * 600)
    data = {"path": "data.csv", "columns": {"day": {"type": "date", "format": "%Q"}}}
    return Case(write_spec(folder, spec_document(data)), (1,), r"inputs\.data\.columns\.day: the format '%Q' cannot "
                r"read back a date it writes")


def public_date_keys(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    """#7: public keys of a date column, written as the column's format writes them."""
    csv_file(folder, rng, day=[["05/01/2024", "06/01/2024"][i % 2] for i in range(600)])
    data = {"path": "data.csv", "columns": {"day": {"type": "date", "format": "%d/%m/%Y"}}}
    query = {"group_by": ["day"], "partitions": {"public": ["05/01/2024", "06/01/2024", "07/01/2024"]}}

    def three_days(work: Path) -> None:
        released = pl.read_parquet(work / "out" / "q.parquet")
        assert released["day"].cast(pl.String).to_list() == ["2024-01-05", "2024-01-06", "2024-01-07"], released
    return Case(write_spec(folder, spec_document(data, query=query)), (0,), check=three_days)


def filter_of(text: str, message: str, code: int = 1) -> Builder:
    """#8, #9, smaller: filters that crashed the parser, exhausted memory or stopped the run."""
    return spec_change({}, message, code, query={"filter": text})


def quote_equal_to_separator(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    csv_file(folder, rng)
    data = {"path": "data.csv", "separator": ";", "quote_char": ";"}
    return Case(write_spec(folder, spec_document(data)), (1,), r"`quote_char` and `separator` are the same")


def invalid_utf8(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
    csv_file(folder, rng)
    lines = (folder / "data.csv").read_bytes().split(b"\n")
    lines[40] = lines[40].replace(b"u", b"\xff\xfeu", 1)
    (folder / "data.csv").write_bytes(b"\n".join(lines))
    return Case(write_spec(folder, spec_document("data.csv")), (1,),
                r"data\.csv: line 41 is not valid UTF-8; .*`encoding: utf8-lossy`")


def ledger_location(kind: str) -> Builder:
    """#11, #17: ledger paths that hung, crashed or were taken for a corrupt ledger."""
    def build(folder: Path, rng: np.random.Generator, mp: pytest.MonkeyPatch) -> Case:
        good_parquet(folder, rng)
        spec = write_spec(folder, spec_document())
        where, code, message = {
            "a FIFO": (folder / "fifo", 6, r"is a special file \(device, FIFO or socket\)"),
            "a symbolic link loop": (folder / "loop.db", 6, r"Too many levels of symbolic links"),
            "a 300-byte name": (folder / ("x" * 300), 6, r"longer than 255 bytes"),
            "an unparsable URL": ("postgresql://[::1/x", 6, r"not a valid URL"),
            "/dev/null": (Path("/dev/null"), 6, r"is a special file"),
            "the report.md of a release": (folder / "out" / "report.md", 1, r"ledger.*publishes"),
        }[kind]
        if kind == "a FIFO":
            os.mkfifo(folder / "fifo")
        if kind == "a symbolic link loop":
            (folder / "loop.db").symlink_to(folder / "loop.db")
        return Case(spec, (code,), message, extra_args=("--ledger", str(where)))
    return build


def xfail(reason: str) -> Any:
    return pytest.mark.xfail(strict=True, reason=f"dprun bug: {reason}")


CASES: list[Any] = [
    pytest.param(a_field_longer_than_python_s_csv_limit, id="#41.4 a csv field of 200,000 characters"),
    pytest.param(a_count_of_a_text_column, id="#41.5 count of a text column"),
    pytest.param(non_ascii_digits_in_an_integer_column, id="#41.6 non-ascii digits in an int64 column"),
    pytest.param(a_date_format_chrono_cannot_read, id="#41.6 an invalid date format"),
    pytest.param(public_date_keys, id="#41.7 public keys of a date column"),
    pytest.param(filter_of(" or ".join(f"v = {i}" for i in range(3000)), r"has 5,999 operators, more than the 500"),
                 id="#41.8 a filter of 3,000 OR terms"),
    pytest.param(filter_of(" or ".join(f"v = {i}" for i in range(200)), "", 0), id="#41.8 a filter of 200 OR terms"),
    pytest.param(filter_of("LPAD(shop, 1000000000, 'x') = 'a'", r"pads to a length that is not"),
                 id="#41.9 LPAD to a billion characters"),
    # ε_c = 1e-9 · 0.15 · 2/3, below the permute-and-flip's smallest step 2^-30.
    pytest.param(spec_change({"budget": {"epsilon": 1e-9}}, r"for choosing the auto bounds is too small",
                             query={"contribution_bounds": {"max_partitions_contributed": "auto",
                                                            "max_contributions_per_partition": "auto"}}),
                 id="#41.10 auto bounds at epsilon 1e-9"),
    pytest.param(ledger_location("a FIFO"), id="#41.11 ledger at a FIFO"),
    pytest.param(ledger_location("a symbolic link loop"), id="#41.11 ledger at a symbolic link loop"),
    pytest.param(ledger_location("a 300-byte name"), id="#41.11 ledger with a 300-byte name"),
    pytest.param(ledger_location("an unparsable URL"), id="#41.11 ledger at an unparsable URL"),
    pytest.param(ledger_location("/dev/null"), id="#41.11 ledger at /dev/null"),
    pytest.param(ledger_location("the report.md of a release"), id="#41.17 ledger at a release's report.md"),
    pytest.param(quote_equal_to_separator, id="#41 quote_char equal to separator"),
    pytest.param(filter_of("shop ~ '['", r"queries\[0\]\.filter: the filter does not apply.*regex"),
                 id="#41 an invalid regex in a filter"),
    pytest.param(filter_of("1", r"filter predicate must be of type `Boolean`"), id="#41 a filter that is a number"),
    pytest.param(invalid_utf8, id="#41 invalid utf-8 under encoding utf8"),
    pytest.param(spec_change({}, r"inside a `\.dprun` folder", query={"output": {"path": "out/.dprun/q.parquet"}}),
                 id="#41 an output inside dprun's store"),
    pytest.param(missing_input_file, id="missing input file"),
    pytest.param(empty_csv, id="empty csv (0 bytes)"),
    pytest.param(glob_matching_nothing, id="glob matching nothing"),
    pytest.param(corrupt_parquet, id="corrupt parquet"),
    pytest.param(corrupt_parquet_pages, id="corrupt parquet pages behind a valid footer"),
    pytest.param(ragged_csv, id="csv with a ragged row"),
    pytest.param(strings_in_the_schema_sample, id="strings in a metric column, in the schema sample"),
    pytest.param(strings_beyond_the_schema_sample, id="strings in a metric column, after row 1000"),
    pytest.param(a_value_that_reads_like_an_os_error, id="a value reading 'os error', after row 1000"),
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
    pytest.param(out_of_range("epsilon 5e35"), id="epsilon 5e35, noise far below the aggregate's unit"),
    pytest.param(out_of_range("huge bounds"), id="bounds [0, 1e308]"),
    pytest.param(target_that_is_not_a_file("output is a folder"), id="#2 output path is an existing folder"),
    pytest.param(target_that_is_not_a_file("report is a folder"), id="#2 report path is an existing folder"),
    pytest.param(target_that_is_not_a_file("output is a FIFO"), id="#3 output path is a FIFO"),
    pytest.param(dangling_symlink_output, id="output path is a dangling symlink"),
    pytest.param(ledger_at("spec ledger is the output"), id="#5 spec's ledger is the output"),
    pytest.param(ledger_at("--ledger is the report"), id="#5 --ledger is the report"),
    pytest.param(csv_with(lambda lines: lines.insert(1501, "u1,a")), id="#6 csv row with a missing field"),
    pytest.param(csv_with(lambda lines: lines.insert(1501, "u1")), id="#6 csv row with one field"),
    pytest.param(csv_with(lambda lines: lines.insert(1501, f"{SECRET_ID},a,1,{SECRET_VALUE}")),
                 id="#6 csv row with an extra field after row 1000"),
    pytest.param(csv_with(lambda lines: lines.insert(1501, f'"{SECRET_ID},a,1'), at_line=2002),
                 id="csv row with an unterminated quote"),
    pytest.param(ndjson_id_that_is_an_object, id="#7 ndjson privacy id that is an object"),
    pytest.param(duplicate_csv_header, id="csv header naming a column twice"),
    pytest.param(alias_bomb, id="#8 yaml alias bomb"),
    pytest.param(spec_change({"budget": {"epsilon": 1e6, "delta": 1e-6, "accounting": "pld"}}, r"pld.*epsilon up to"),
                 id="#9 pld with epsilon 1e6"),
    pytest.param(spec_change({}, r"out of the samplers' range", query=metric_share(1e-300)),
                 id="#11 budget_share 1e-300"),
    pytest.param(spec_change({}, r"out of the samplers' range|out of range", query=metric_share(1e308)),
                 id="#11 budget_share 1e308"),
    pytest.param(spec_change({"report": "out/re\x00port.json"}, r"NUL"), id="#12 report path with a NUL byte"),
    pytest.param(spec_change({"report": "/"}, r"report path must end in \.json"),
                 id="report path / (found by the fuzz test: an internal error)"),
    pytest.param(spec_change({"ledger": "/"}, r"ledger path is a folder"),
                 id="ledger path / (found by the fuzz test: an internal error)"),
    pytest.param(spec_change({}, r"NUL", query={"output": {"path": "out/q\x00.parquet"}}),
                 id="#12 output path with a NUL byte"),
    pytest.param(spec_change({}, r"NUL", data="da\x00ta.parquet"), id="#12 input path with a NUL byte"),
    pytest.param(spec_change({}, r"NUL", query={"partitions": {"public_file": "k\x00.csv"}}),
                 id="#12 public_file with a NUL byte"),
    pytest.param(spec_change({}, r"longer than 255", query={"output": {"path": "out/" + "q" * 300 + ".parquet"}}),
                 id="#12 output name too long"),
    pytest.param(spec_change({}, r"longer than 255", data="x" * 300 + ".parquet"), id="#12 input name too long"),
    pytest.param(input_symlink_loop, id="#13 input is a symlink loop"),
    pytest.param(scratch_folder("missing"), id="#14 DPRUN_TMPDIR missing"),
    pytest.param(scratch_folder("a file"), id="#14 DPRUN_TMPDIR is a file"),
    pytest.param(input_deleted_before_the_scan, id="#15 input deleted between validation and the scan"),
    pytest.param(spec_change({}, r"is the privacy unit", query={"group_by": ["uid"], "partitions": None}),
                 id="#16 privacy unit as a group_by column"),
    pytest.param(out_of_range("tiny bounds"), id="bounds [1e-300, 2e-300]"),
]


# --- the checks -----------------------------------------------------------------------------


def test_the_leak_detector_finds_the_planted_secrets(tmp_path: Path) -> None:
    frame = planted(np.random.default_rng(fresh_seed()))
    for name, write in (("a.parquet", frame.write_parquet), ("b.csv", frame.write_csv)):
        write(tmp_path / name)
        assert file_leaks(tmp_path / name), name
    frame.select("v").write_parquet(tmp_path / "v.parquet")
    assert "v holds 987654.321" in file_leaks(tmp_path / "v.parquet")
    assert leaks(f"x {SECRET_VALUE:,} y") and leaks(f"{SECRET_VALUE:e}") and not leaks("987654")


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
            if not os.path.lexists(work / name):
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
    write_long_input(path)
    return path


@pytest.mark.parametrize("burst", [1, 6], ids=["one signal", "a burst of six"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_the_middle_of_a_run_publishes_nothing(tmp_path: Path, long_input: Path, signum: int,
                                                           burst: int) -> None:
    """A burst is what CI cancellations often send: the later signals must not cut short the
    removal of the scratch files (privacy ids in them) that the first one started."""
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
    process = start_run(spec, scratch)
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
        for index in range(burst):
            process.send_signal(signum)
            time.sleep(0.001 * 2**index)  # 1 ms to 32 ms apart: some land during the cleanup
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


def test_a_signal_while_dprun_starts_exits_130_with_one_line(tmp_path: Path, long_input: Path) -> None:
    """#10: SIGINT or SIGTERM while Polars and numpy import (the first ~0.5 s), at random instants."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    work = tmp_path / "work"
    work.mkdir()
    spec = write_spec(work, spec_document(str(long_input), query={"partitions": {"selection": "auto"}}))
    for signum in (signal.SIGINT, signal.SIGTERM) * 3:
        # From when the launcher catches signals (before that the interpreter itself is starting),
        # at a random instant of the imports that follow.
        delay = float(rng.uniform(0.0, 0.45))
        process = start_run(spec, tmp_path)
        wait_until_it_catches_signals(process)
        time.sleep(delay)
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
        what = f"seed={seed} {signal.Signals(signum).name} {delay:.3f} s after the handlers"
        check_streams(stdout, stderr, what)
        assert process.returncode == 130, f"{what}: exit {process.returncode}: {stderr!r}"
        assert re.fullmatch(r"error: interrupted[^\n]*nothing was published\n", stderr), f"{what}: {stderr!r}"
        assert not (work / "out").exists(), f"{what}: published something"


# --- round 3 (issue #41): the commands besides `run` -------------------------------------------


def dprun_process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m dprun ARGS` as a real process with a time limit: a hang fails the test."""
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "DPRUN_DEBUG")}
    return subprocess.run([sys.executable, "-m", "dprun", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture
def a_ledger(tmp_path: Path) -> Path:
    """A ledger holding one release of the planted data."""
    planted(np.random.default_rng(fresh_seed())).write_parquet(tmp_path / "data.parquet")
    spec = write_spec(tmp_path, spec_document())
    result = invoke("run", str(spec), "--ledger", str(tmp_path / "ledger.db"))
    assert result.exit_code == 0, result.output
    return tmp_path / "ledger.db"


def test_a_ledger_at_a_release_s_report_md_is_refused_as_a_published_file(tmp_path: Path) -> None:
    """#17: out/report.md is a link into the release store once published; it was taken for a corrupt ledger."""
    planted(np.random.default_rng(fresh_seed())).write_parquet(tmp_path / "data.parquet")
    spec = write_spec(tmp_path, spec_document())
    assert invoke("run", str(spec)).exit_code == 0
    assert (tmp_path / "out" / "report.md").is_symlink()
    result = invoke("run", str(spec), "--overwrite", "--ledger", str(tmp_path / "out" / "report.md"))
    assert result.exit_code == 1 and "publishes" in result.stderr and "corrupt" not in result.stderr, result.output


@pytest.mark.parametrize("command", [("ledger", "show"), ("ledger", "export"), ("explain-budget",)])
def test_ledger_locations_that_hung_or_crashed_are_refused(tmp_path: Path, a_ledger: Path,
                                                           command: tuple[str, ...]) -> None:
    """#11: a FIFO hung every ledger command; a loop, a long name or a bad URL crashed them."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "loop.db").symlink_to(tmp_path / "loop.db")
    spec = tmp_path / "spec.yaml"
    for where, message in ((tmp_path / "fifo", "special file"), (tmp_path / "loop.db", "symbolic links"),
                           (tmp_path / ("x" * 300), "longer than 255 bytes"),
                           ("postgresql://[::1/x", "not a valid URL"), (Path("/dev/null"), "special file")):
        args = [*command, str(spec), "--ledger", str(where)] if command == ("explain-budget",) else \
            [*command, str(where)]
        done = dprun_process(*args)
        assert done.returncode == 6 and message in done.stderr, f"{where!s:.60}: {done.returncode} {done.stderr}"
        assert "Traceback" not in done.stderr
    assert not Path("/dev/null-journal").exists()


def test_an_empty_ledger_option_is_a_usage_error(tmp_path: Path) -> None:
    """#11: `--ledger "$UNSET"` published with no ledger at all."""
    planted(np.random.default_rng(fresh_seed())).write_parquet(tmp_path / "data.parquet")
    result = invoke("run", str(write_spec(tmp_path, spec_document())), "--ledger", "")
    assert result.exit_code == 2 and "'--ledger': is empty" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("garbage", ["release_id = X'00ff'", "entry = 'not json'", "entry = '" + "[" * 100_000 + "'",
                                     "entry = replace(entry, '\"epsilon\": \"', '\"epsilon\": \"1e999999999')",
                                     "entry = '{}'", "entry = 7"])
def test_a_ledger_whose_rows_hold_garbage_is_corrupt_exit_6(a_ledger: Path, garbage: str) -> None:
    connection = sqlite3.connect(a_ledger)
    connection.execute(f"UPDATE dprun_releases SET {garbage}")
    connection.commit()
    connection.close()
    done = dprun_process("ledger", "show", str(a_ledger))
    assert done.returncode == 6 and "is corrupt" in done.stderr, f"{garbage[:60]}: {done.returncode} {done.stderr}"


def test_a_sqlite_database_of_something_else_is_not_adopted(tmp_path: Path) -> None:
    """#11: any SQLite file got dprun's tables added."""
    other = tmp_path / "app.db"
    connection = sqlite3.connect(other)
    connection.execute("CREATE TABLE users (name TEXT)")
    connection.commit()
    connection.close()
    planted(np.random.default_rng(fresh_seed())).write_parquet(tmp_path / "data.parquet")
    result = invoke("run", str(write_spec(tmp_path, spec_document())), "--ledger", str(other))
    assert result.exit_code == 6 and "an SQLite database of something else" in result.stderr, result.output
    tables = sqlite3.connect(other).execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    assert tables == [("users",)]


def test_ledger_export_writes_through_devices_and_never_replaces_them(tmp_path: Path, a_ledger: Path) -> None:
    """#12: -o /dev/full, /dev/stdout, a FIFO or a link was replaced by a regular file."""
    full = dprun_process("ledger", "export", str(a_ledger), "-o", "/dev/full")
    assert full.returncode == 6 and "No space left on device" in full.stderr, full.stderr
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    out = dprun_process("ledger", "export", str(a_ledger), "-o", "/dev/stdout")
    assert out.returncode == 0 and json.loads(out.stdout.splitlines()[0])["release"] == 1, out.stderr
    os.mkfifo(tmp_path / "fifo")
    lonely = dprun_process("ledger", "export", str(a_ledger), "-o", str(tmp_path / "fifo"))
    assert lonely.returncode == 6 and "a FIFO nobody reads" in lonely.stderr and stat.S_ISFIFO(
        os.stat(tmp_path / "fifo").st_mode)
    (tmp_path / "kept.jsonl").write_text("mine\n")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "kept.jsonl")
    refused = dprun_process("ledger", "export", str(a_ledger), "-o", str(tmp_path / "link.jsonl"))
    assert refused.returncode == 6 and "use --force" in refused.stderr
    assert (tmp_path / "kept.jsonl").read_text() == "mine\n"
    forced = dprun_process("ledger", "export", str(a_ledger), "-o", str(tmp_path / "link.jsonl"), "--force")
    assert forced.returncode == 0 and (tmp_path / "link.jsonl").is_symlink()
    assert json.loads((tmp_path / "kept.jsonl").read_text().splitlines()[0])["release"] == 1


def test_init_never_writes_over_the_file_it_reads_or_a_device(tmp_path: Path) -> None:
    """#12, #15: `init d.csv -o d.csv --force` replaced the data with the scaffold."""
    planted(np.random.default_rng(fresh_seed())).write_csv(tmp_path / "d.csv")
    data = (tmp_path / "d.csv").read_bytes()
    same = invoke("init", str(tmp_path / "d.csv"), "-o", str(tmp_path / "d.csv"), "--force")
    assert same.exit_code == 6 and "is the data file init reads" in same.stderr, same.output
    assert (tmp_path / "d.csv").read_bytes() == data
    full = dprun_process("init", str(tmp_path / "d.csv"), "-o", "/dev/full", "--force")
    assert full.returncode == 6 and stat.S_ISCHR(os.stat("/dev/full").st_mode), full.stderr


@pytest.mark.parametrize("kind", ["deeply nested", "a FIFO", "/dev/zero", "a 5,000-character output path",
                                  "no queries"])
def test_verify_and_ledger_import_read_only_small_regular_files(tmp_path: Path, kind: str) -> None:
    """#13: RecursionError, a hang, unbounded memory, an OSError, or exit 0 for a report of nothing."""
    report = tmp_path / "report.json"
    release = {"release_id": "r1", "spec_folder": ".", "queries": [{"output": "q.csv", "output_sha256": "0" * 64}]}
    if kind == "deeply nested":
        report.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "a FIFO":
        os.mkfifo(report)
    elif kind == "/dev/zero":
        report = Path("/dev/zero")
    elif kind == "a 5,000-character output path":
        report.write_text(json.dumps({**release, "queries": [{"output": "q" * 5000, "output_sha256": "0" * 64}]}))
    else:
        report.write_text(json.dumps({**release, "queries": []}))
    verified = dprun_process("verify", str(report))
    assert verified.returncode == 7 and "Traceback" not in verified.stderr, verified.stderr
    imported = dprun_process("ledger", "import", str(report), str(tmp_path / "new.db"))
    assert imported.returncode == 6 and "Traceback" not in imported.stderr, imported.stderr
    assert not (tmp_path / "new.db").exists()


def test_ledger_import_of_an_empty_file_makes_no_ledger(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    result = invoke("ledger", "import", str(tmp_path / "empty.jsonl"), str(tmp_path / "new.db"))
    assert result.exit_code == 6 and "holds no release" in result.stderr and not (tmp_path / "new.db").exists()


def test_ledger_abandon_takes_a_release_number_in_range_and_answers_in_json(a_ledger: Path) -> None:
    """#13, smaller: 2^70 raised OverflowError; --format json was missing."""
    huge = invoke("ledger", "abandon", str(2**70), str(a_ledger), "--confirm-not-published")
    assert huge.exit_code == 2 and "is not in the range" in huge.output, huge.output
    connection = sqlite3.connect(a_ledger)
    connection.execute("UPDATE dprun_releases SET state = 'pending'")
    connection.commit()
    connection.close()
    (a_ledger.parent / "out" / "report.json").unlink()  # the run died before publishing, as far as it shows
    answer = invoke("ledger", "abandon", "1", str(a_ledger), "--confirm-not-published", "--format", "json")
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.stdout) | {"ledger": ""} == {"ok": True, "ledger": "", "release": 1,
                                                           "state": "abandoned", **{k: json.loads(answer.stdout)[k]
                                                                                    for k in ("epsilon", "delta")}}


@pytest.mark.parametrize("kind", ["/dev/zero", "a FIFO", "2 MB", "60,000 unknown fields"])
def test_validate_reads_a_spec_only_if_it_is_a_small_regular_file(tmp_path: Path, kind: str) -> None:
    """#14: /dev/zero grew without bound, a FIFO hung, a huge spec or 300,000 unknown keys took minutes."""
    spec = tmp_path / "spec.yaml"
    if kind == "/dev/zero":
        spec = Path("/dev/zero")
    elif kind == "a FIFO":
        os.mkfifo(spec)
    elif kind == "2 MB":
        spec.write_text("# " + "x" * 2_000_000 + "\n")
    else:
        spec.write_text(json.dumps({**spec_document(), **{f"k{i}": 1 for i in range(60_000)}}))
    done = dprun_process("validate", str(spec), timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) <= 101, len(lines)
    if kind == "60,000 unknown fields":
        assert lines[-1].endswith("and 59,900 more problem(s) like these"), lines[-1]
    else:
        assert "cannot read the spec file" in done.stderr, done.stderr


def test_a_signal_while_starting_answers_in_json_under_format_json(tmp_path: Path, long_input: Path) -> None:
    """#16: SIGINT at 0.1 s gave exit 130 and one line of text, no JSON."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    work = tmp_path / "work"
    work.mkdir()
    spec = write_spec(work, spec_document(str(long_input)))
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "DPRUN_DEBUG")}
    for signum in (signal.SIGINT, signal.SIGTERM):
        process = subprocess.Popen([sys.executable, "-m", "dprun", "run", str(spec), "--format", "json"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        wait_until_it_catches_signals(process)
        time.sleep(float(rng.uniform(0.0, 0.3)))
        process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=120)
        answer = json.loads(stdout)
        assert process.returncode == 130 and answer["exit_code"] == 130 and answer["ok"] is False, \
            f"seed={seed}: {stdout} {stderr}"
        assert "nothing was published" in answer["problems"][0]["message"]


def test_truncated_geometric_says_what_to_change_when_no_delta_can_cover_its_rounding() -> None:
    from dprun.mechanisms.selection import TruncatedGeometric, _exact_partition_budget

    with pytest.raises(ValueError, match=r"cannot cover its float rounding with any δ at ε = 800 per partition"):
        _exact_partition_budget(TruncatedGeometric(epsilon=800.0, delta=0.5, max_partitions=1))

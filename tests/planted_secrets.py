"""Planted secrets and the checks that they never leak: shared by the adversarial and fuzz tests.

Every input the tests build holds planted secrets -- privacy ids `SECRET-ID-9e1f…` and the value
987654.321 -- which must not appear in stdout, stderr or any file a run writes. Failing runs
must leave pre-existing outputs byte for byte as they were, and no temporary file behind.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

SECRET_ID = "SECRET-ID-9e1f"
SECRET_VALUE = 987654.321
# How a planted secret could show up in text: the id, the value in any usual notation.
SECRET_TEXT = re.compile(r"SECRET-ID|987[,_ ]?654[.,]321|9\.876543\d*e\+?0*5", re.IGNORECASE)
SECRET_BYTES = (SECRET_ID.encode(), struct.pack("<d", SECRET_VALUE), struct.pack(">d", SECRET_VALUE))
PRE_EXISTING = b"pre-existing output: a failed run must leave these bytes alone\n"
OUTPUTS = ("out/q.parquet", "out/report.json", "out/report.md", "out/report.html")


def planted(rng: np.random.Generator, rows: int = 600, shops: tuple[str, ...] = ("a", "b")) -> pl.DataFrame:
    """Visits with secret-looking privacy ids and values among ordinary ones."""
    uid = [f"u{i}" for i in rng.integers(0, rows // 3, rows)]
    v = rng.uniform(0, 50, rows)
    for i in range(0, rows, 50):
        uid[i] = f"{SECRET_ID}-{i}" if i else SECRET_ID
        v[i + 1] = SECRET_VALUE
    return pl.DataFrame({"uid": uid, "shop": [shops[i] for i in rng.integers(0, len(shops), rows)], "v": v})


METRICS = [{"name": "visits", "kind": "count"}, {"name": "spend", "kind": "sum", "column": "v", "bounds": [0, 50]}]
# An NDJSON input's columns are the ones its spec declares.
NDJSON_COLUMNS = {"uid": "string", "shop": "string", "v": "float64"}


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
        "inputs": {"data": _with_ndjson_columns(data if isinstance(data, dict) else {"path": data})},
        "queries": [query], "report": "out/report.json",
    }
    document.update(changes)
    return document


def _with_ndjson_columns(data: dict[str, Any]) -> dict[str, Any]:
    ndjson = data.get("format") == "ndjson" or str(data["path"]).endswith(".ndjson")
    return {"columns": NDJSON_COLUMNS, **data} if ndjson else data


def write_spec(folder: Path, document: dict[str, Any]) -> Path:
    path = folder / "spec.yaml"
    # JSON is YAML 1.2; literal non-ASCII text (YAML's \u escapes cannot pair UTF-16 surrogates).
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False), encoding="utf-8")
    return path


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
        table = pl.read_parquet(io.BytesIO(data))  # not the path: a name like '*.parquet' would be a glob
        for name, column in table.to_dict().items():
            if column.dtype.is_float() and bool((column - SECRET_VALUE).abs().lt(1e-3).any()):
                found.append(f"{name} holds {SECRET_VALUE}")
            text = column.cast(pl.String, strict=False)
            if bool(text.str.contains(f"(?i){SECRET_TEXT.pattern}").any()):
                found.append(f"{name} holds a planted text")
    return found


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


def write_long_input(path: Path) -> None:
    """~800,000 rows with planted secrets: a run on them keeps intermediate files for ~0.5 s."""
    rng = np.random.default_rng(5)
    rows = 800_000
    uid = np.char.add(SECRET_ID + "-", rng.integers(0, rows // 3, rows).astype(str))
    pl.DataFrame({"uid": uid, "shop": rng.integers(0, 5000, rows),
                  "v": np.where(rng.random(rows) < 0.01, SECRET_VALUE, rng.uniform(0, 50, rows))}).write_parquet(path)


def wait_until_it_catches_signals(process: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """Until the process has installed its SIGINT and SIGTERM handlers (the kernel's `SigCgt` mask
    in /proc): the event a signal test starts its delays from, whatever the machine's load. Before
    it, the interpreter itself is starting and a signal ends it as Python's defaults say."""
    wanted = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
    status = Path(f"/proc/{process.pid}/status")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        caught = next((line.split()[1] for line in status.read_text().splitlines() if line.startswith("SigCgt:")), "0")
        if int(caught, 16) & wanted == wanted:
            return
        time.sleep(0.001)
    raise AssertionError(f"the process did not install its signal handlers (exit {process.poll()})")


def start_run(spec: Path, scratch: Path) -> subprocess.Popen[str]:
    """`python -m dprun run SPEC --overwrite` as a real process (for signals), scratch files in `scratch`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "DPRUN_DEBUG")}
    env.update(DPRUN_TMPDIR=str(scratch), PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "dprun", "run", str(spec), "--overwrite"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

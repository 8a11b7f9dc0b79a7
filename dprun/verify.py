"""`dprun verify REPORT`: are the files at a release's output paths the ones its report names?

For consumers and CI: each output must exist at the path the report gives (relative to the
spec's folder, found from the report's `spec_folder`) and have the sha256 the report gives.
A Parquet output also names its release in its key-value metadata (`dprun.release_id`), for
readers who hold the file without the report; its sha256 covers that too.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dprun.errors import NotVerified
from dprun.small_files import UnreadableFile, loads_json, path_problem, read_small_file

# A release report lists its queries and their outputs, never rows: a few kilobytes.
MAX_REPORT_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Verified:
    release_id: str
    outputs: tuple[Path, ...]


def verify_release(report_path: Path) -> Verified:
    """The release `report_path` describes, if every output matches it; else NotVerified (exit 7)."""
    report = _read_report(report_path)
    release_id = report["release_id"]
    base = report_path.parent / report["spec_folder"]
    problems, outputs = [], []
    for query in report["queries"]:
        path = Path(os.path.abspath(base / query["output"]))
        outputs.append(path)
        problem = path_problem(str(path)) or _output_problem(path, query["output_sha256"])
        if problem is not None:
            problems.append(f"{path}: {problem}")
    if problems:
        raise NotVerified(f"{report_path}: the files at the output paths are not release {release_id}: "
                          + "; ".join(problems))
    return Verified(release_id, tuple(outputs))


def _read_report(report_path: Path) -> dict[str, Any]:
    try:
        report = loads_json(read_small_file(report_path, MAX_REPORT_BYTES))
    except UnreadableFile as exc:
        raise NotVerified(f"{report_path!s:.300}: cannot read the report ({exc})") from None
    except ValueError:
        report = None
    if not _is_release_report(report):
        raise NotVerified(f"{report_path}: not a dprun release report (no release_id, spec_folder or "
                          "outputs with their sha256)")
    return report


def _is_release_report(report: Any) -> bool:
    return (isinstance(report, dict) and isinstance(report.get("release_id"), str)
            and isinstance(report.get("spec_folder"), str) and isinstance(report.get("queries"), list)
            and len(report["queries"]) > 0 and all(isinstance(q, dict) and isinstance(q.get("output"), str) and isinstance(q.get("output_sha256"), str)
                    for q in report["queries"]))


def _output_problem(path: Path, sha256: str) -> str | None:
    if not path.is_file():
        return "missing"
    try:
        found = sha256_of(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    return None if found == sha256 else "its sha256 differs from the report's"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

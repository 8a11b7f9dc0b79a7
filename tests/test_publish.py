"""Crash-safe publication (dprun/publish.py) and `dprun verify`.

Every output path is a link through one `current` pointer, switched by one rename: a run
killed with SIGKILL at any instant leaves the whole previous release or the whole new one,
which `dprun verify` checks against the report's sha256s.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dprun_testing import chartless_dprun, everything, fresh_seed, invoke
from planted_secrets import planted, spec_document, write_spec

from dprun import publish

# Seconds the test hook pauses between publication steps: with five targets, publication
# then lasts about 0.7 s on an idle machine; the kills below are spread over the window one
# unkilled run measures, so that a loaded machine's slower publication is still covered.
PAUSE = 0.1
KILLS = 8


def three_folder_spec(folder: Path, rng: np.random.Generator, report: str = "out/report.json") -> Path:
    """Outputs in three folders (one outside the report's), so a mixed release would show."""
    planted(rng).write_parquet(folder / "data.parquet")
    base = spec_document()["queries"][0]
    queries = [dict(base, name=name, output={"path": path})
               for name, path in (("q1", "out/q1.parquet"), ("q2", "out/sub/q2.csv"), ("q3", "elsewhere/q3.parquet"))]
    return write_spec(folder, spec_document(queries=queries, report=report))


def verified_release(report: Path, seed: int) -> str:
    result = invoke("verify", str(report), "--format", "json")
    assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    return str(json.loads(result.stdout)["release_id"])


def dprun_process(spec: Path, pause: float) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "DPRUN_DEBUG")}
    env[publish.PAUSE_VARIABLE] = str(pause)
    return subprocess.Popen(chartless_dprun("run", str(spec), "--overwrite"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, env=env)


def release_folders(store: Path) -> set[Path]:
    releases = store / publish.RELEASES
    return set(releases.iterdir()) if releases.is_dir() else set()


def wait_for_a_new_release_folder(store: Path, earlier: set[Path], process: subprocess.Popen[str], seed: int) -> None:
    """Until the run starts writing its release (publication begins), polling every 2 ms."""
    while not release_folders(store) - earlier:
        assert process.poll() is None, f"seed={seed}: the run ended (exit {process.returncode}) before publishing"
        time.sleep(0.002)


def publication_window(spec: Path, store: Path, seed: int) -> float:
    """Seconds from a run's first release file to its exit, measured on one run left alone."""
    earlier = release_folders(store)
    process = dprun_process(spec, PAUSE)
    wait_for_a_new_release_folder(store, earlier, process, seed)
    started = time.monotonic()
    assert process.wait() == 0, f"seed={seed}: an unkilled run failed"
    return time.monotonic() - started


def as_regular_files(folder: Path) -> None:
    """What an earlier dprun left: regular files at the output paths, no release store."""
    for link in [p for p in folder.rglob("*") if p.is_symlink() and publish.STORE not in p.parts]:
        data = link.read_bytes()
        link.unlink()
        link.write_bytes(data)
    shutil.rmtree(folder / "out" / publish.STORE)


@pytest.mark.parametrize("start", ["links", "regular files"])
def test_a_run_killed_at_any_instant_of_publication_leaves_one_whole_release(tmp_path: Path, start: str) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    spec = three_folder_spec(tmp_path, rng)
    report = tmp_path / "out" / "report.json"
    store = publish.store_of(report)
    assert invoke("run", str(spec)).exit_code == 0, f"seed={seed}"
    window = 1.2 * publication_window(spec, store, seed)
    if start == "regular files":
        as_regular_files(tmp_path)
    outcomes = []
    for k in range(KILLS):
        before = verified_release(report, seed)
        earlier = release_folders(store)
        process = dprun_process(spec, PAUSE)
        wait_for_a_new_release_folder(store, earlier, process, seed)
        # Stratified instants: every part of the publication window is hit.
        time.sleep((k + rng.uniform()) * window / KILLS)
        process.send_signal(signal.SIGKILL)
        process.wait()
        after = verified_release(report, seed)
        outcomes.append("previous" if after == before else "new")
    assert {"previous", "new"} <= set(outcomes), \
        f"seed={seed}: every kill within {window:.2f} s left the {outcomes[0]} release"

    finished = invoke("run", str(spec), "--overwrite")
    assert finished.exit_code == 0, f"seed={seed}: {everything(finished)}"
    verified_release(report, seed)
    leftovers = [str(p) for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, f"seed={seed}: a finished run left {leftovers}"
    assert [p.name for p in (store / publish.RELEASES).iterdir()] == [(store / publish.CURRENT).resolve().name]


def test_outputs_are_links_through_one_pointer_named_by_the_release(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = three_folder_spec(tmp_path, np.random.default_rng(seed))
    assert invoke("run", str(spec), "--seed", str(seed)).exit_code == 0
    report = tmp_path / "out" / "report.json"
    release_id = json.loads(report.read_text())["release_id"]
    store = publish.store_of(report)
    assert (store / publish.CURRENT).resolve() == (store / publish.RELEASES / release_id).resolve()
    for target in ("out/q1.parquet", "out/sub/q2.csv", "elsewhere/q3.parquet", "out/report.json", "out/report.md"):
        path = tmp_path / target
        assert path.is_symlink() and publish.CURRENT in Path(os.readlink(path)).parts, f"seed={seed}: {target}"
        assert path.resolve().parent == (store / publish.RELEASES / release_id).resolve(), f"seed={seed}: {target}"
    assert pl.read_parquet_metadata(tmp_path / "out" / "q1.parquet")["dprun.release_id"] == release_id


def test_specs_publishing_into_one_folder_keep_their_releases_apart(tmp_path: Path) -> None:
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    first = three_folder_spec(tmp_path, rng, report="out/first.json").rename(tmp_path / "first.yaml")
    second = write_spec(tmp_path, spec_document(report="out/second.json",
                                                query={"output": {"path": "out/other.parquet"}}))
    for spec, flags in ((first, ()), (second, ()), (second, ("--overwrite",))):
        result = invoke("run", str(spec), *flags)
        assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    verified_release(tmp_path / "out" / "first.json", seed)
    verified_release(tmp_path / "out" / "second.json", seed)


def dangling(folder: Path) -> list[str]:
    """Every link below `folder` (outside the stores) that names nothing."""
    return [str(p) for p in folder.rglob("*") if p.is_symlink() and not p.exists() and publish.STORE not in p.parts]


def test_two_runs_publishing_to_one_report_at_once_leave_one_whole_release(tmp_path: Path) -> None:
    """Both publish, one after the other (the store's lock): `current` names a folder that exists,
    every output resolves, and the report verifies."""
    seed = fresh_seed()
    spec = three_folder_spec(tmp_path, np.random.default_rng(seed))
    assert invoke("run", str(spec)).exit_code == 0, f"seed={seed}"
    store = publish.store_of(tmp_path / "out" / "report.json")
    for _ in range(3):
        racers = [dprun_process(spec, 0.05) for _ in range(2)]
        assert [racer.wait(timeout=300) for racer in racers] == [0, 0], f"seed={seed}"
        assert (store / publish.CURRENT).resolve().is_dir(), f"seed={seed}: current names a removed release"
        assert not dangling(tmp_path), f"seed={seed}: {dangling(tmp_path)}"
        verified_release(tmp_path / "out" / "report.json", seed)
        assert [p.name for p in (store / publish.RELEASES).iterdir()] == [(store / publish.CURRENT).resolve().name]


def test_a_release_keeps_the_files_of_the_one_before_that_it_does_not_write(tmp_path: Path) -> None:
    """A second spec in the same folder with the same (default) report path, or a query dropped from
    a spec: the earlier outputs stay readable, never dangling links."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    first = three_folder_spec(tmp_path, rng).rename(tmp_path / "first.yaml")
    second = write_spec(tmp_path, spec_document(query={"output": {"path": "out/other.parquet"}}))
    assert invoke("run", str(first)).exit_code == 0, f"seed={seed}"
    before = {p: p.read_bytes() for p in (tmp_path / "out" / "q1.parquet", tmp_path / "elsewhere" / "q3.parquet")}
    result = invoke("run", str(second), "--overwrite")
    assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    assert not dangling(tmp_path), f"seed={seed}: {dangling(tmp_path)}"
    assert all(path.read_bytes() == data for path, data in before.items()), f"seed={seed}"
    assert pl.read_parquet(tmp_path / "out" / "other.parquet").height == 2
    verified_release(tmp_path / "out" / "report.json", seed)


def test_verify_names_each_output_that_is_missing_or_changed_and_exits_7(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = three_folder_spec(tmp_path, np.random.default_rng(seed))
    assert invoke("run", str(spec)).exit_code == 0, f"seed={seed}"
    changed = tmp_path / "out" / "sub" / "q2.csv"
    text = changed.read_text()
    changed.unlink()
    changed.write_text(text.replace("\n", "\r\n"))
    (tmp_path / "elsewhere" / "q3.parquet").unlink()
    result = invoke("verify", str(tmp_path / "out" / "report.json"))
    assert result.exit_code == 7, f"seed={seed}: {everything(result)}"
    assert f"{changed}: its sha256 differs" in result.stderr, f"seed={seed}: {result.stderr}"
    assert f"{tmp_path / 'elsewhere' / 'q3.parquet'}: missing" in result.stderr, f"seed={seed}: {result.stderr}"
    assert "q1.parquet" not in result.stderr, f"seed={seed}: {result.stderr}"


def test_verify_follows_the_release_when_the_folder_is_copied_elsewhere(tmp_path: Path) -> None:
    seed = fresh_seed()
    made = tmp_path / "made"
    made.mkdir()
    assert invoke("run", str(three_folder_spec(made, np.random.default_rng(seed)))).exit_code == 0, f"seed={seed}"
    shutil.copytree(made, tmp_path / "copy", symlinks=False)
    shutil.rmtree(made)
    verified_release(tmp_path / "copy" / "out" / "report.json", seed)


@pytest.mark.parametrize("content", ["", "{}", "[1]", '{"release_id": "x", "spec_folder": ".", "queries": [{}]}',
                                     "\x00\xff not json"])
def test_verify_refuses_a_file_that_is_not_a_release_report(tmp_path: Path, content: str) -> None:
    report = tmp_path / "report.json"
    report.write_bytes(content.encode("utf-8", "surrogateescape"))
    result = invoke("verify", str(report), "--format", "json")
    assert result.exit_code == 7, everything(result)
    assert "not a dprun release report" in everything(result)
    assert "Traceback" not in everything(result)

"""Only dprun's own messages reach stderr: what Polars' Rust code (a panic) or the JVM write to file
descriptor 2 is kept out of it (dprun.launcher.keep_native_stderr_private), since it can quote data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from dprun_testing import fresh_seed
from planted_secrets import SECRET_ID, leaks, planted, spec_document, write_spec

# Runs the real entry point with the Polars engine replaced by one that panics as Rust does:
# the panic message, with a data value in it, is written to descriptor 2, then PanicException.
PANICKING_DPRUN = f"""
import os, sys
import polars as pl
from dprun.engines import polars_engine

def panicking(*args, **kwargs):
    os.write(2, b"thread '<unnamed>' panicked at crates/polars-core/src/frame.rs:1:1: {SECRET_ID}\\n")
    raise pl.exceptions.PanicException("{SECRET_ID}")

polars_engine.run_query = panicking
from dprun.launcher import main
main()
"""


def run_dprun(program: list[str], *args: str, debug: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "DPRUN_DEBUG")}
    if debug:
        env["DPRUN_DEBUG"] = "1"
    return subprocess.run([sys.executable, *program, *args], capture_output=True, text=True, env=env, timeout=120)


def test_a_polars_panic_shows_dprun_s_message_only(tmp_path: Path) -> None:
    seed = fresh_seed()
    planted(np.random.default_rng(seed)).write_parquet(tmp_path / "data.parquet")
    spec = write_spec(tmp_path, spec_document())
    done = run_dprun(["-c", PANICKING_DPRUN], "run", str(spec))
    assert done.returncode == 2, f"seed={seed}: exit {done.returncode}: {done.stderr}"
    assert done.stderr.startswith("error: query q: Polars failed internally"), f"seed={seed}: {done.stderr!r}"
    assert len(done.stderr.splitlines()) == 1 and not leaks(done.stderr), f"seed={seed}: {done.stderr!r}"
    assert not (tmp_path / "out").exists(), f"seed={seed}: something was published"


def test_with_dprun_debug_the_native_message_is_shown(tmp_path: Path) -> None:
    seed = fresh_seed()
    planted(np.random.default_rng(seed)).write_parquet(tmp_path / "data.parquet")
    spec = write_spec(tmp_path, spec_document())
    done = run_dprun(["-c", PANICKING_DPRUN], "run", str(spec), debug=True)
    assert done.returncode == 2, f"seed={seed}: exit {done.returncode}: {done.stderr}"
    assert "panicked at" in done.stderr, f"seed={seed}: the redirect is not what hid it: {done.stderr!r}"


def write_corrupt_parquet(path: Path, rng: np.random.Generator) -> None:
    planted(rng, rows=20_000).write_parquet(path, compression="uncompressed", statistics=False)
    data = bytearray(path.read_bytes())
    # Garbage over the data pages; the magic bytes and the footer (the schema) stay intact.
    middle = slice(len(data) // 4, len(data) // 2)
    data[middle] = rng.integers(0, 256, middle.stop - middle.start, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


def assert_names_the_corrupt_file(done: subprocess.CompletedProcess[str], path: Path, seed: int) -> None:
    assert done.returncode == 3, f"seed={seed}: exit {done.returncode}: {done.stderr}"
    # The file as the spec names it (its path relative to the spec's folder).
    assert done.stderr == f"error: {path.name}: the Parquet file's data pages cannot be decoded (a corrupt or " \
        "truncated file?); write the file again (nothing was counted)\n", f"seed={seed}: {done.stderr!r}"
    assert not leaks(done.stderr), f"seed={seed}: {done.stderr!r}"
    assert not (path.parent / "out").exists(), f"seed={seed}: something was published"


def test_a_corrupt_parquet_file_shows_dprun_s_message_only(tmp_path: Path) -> None:
    # Polars raises an error on most such files and panics on a few (for seed 10949488114696611
    # among others): either way the file is named as the culprit.
    seed = fresh_seed()
    write_corrupt_parquet(tmp_path / "data.parquet", np.random.default_rng(seed))
    spec = write_spec(tmp_path, spec_document())
    assert_names_the_corrupt_file(run_dprun(["-m", "dprun"], "run", str(spec)), tmp_path / "data.parquet", seed)


def test_a_polars_panic_on_a_corrupt_file_blames_the_file(tmp_path: Path) -> None:
    seed = fresh_seed()
    write_corrupt_parquet(tmp_path / "data.parquet", np.random.default_rng(seed))
    spec = write_spec(tmp_path, spec_document())
    assert_names_the_corrupt_file(run_dprun(["-c", PANICKING_DPRUN], "run", str(spec)), tmp_path / "data.parquet", seed)

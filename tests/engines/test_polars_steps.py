"""How the Polars engine classifies a failure: by its type and the scratch folder's state, never by
Polars' message (which can quote data values)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from dprun.engines import polars_steps
from dprun.errors import DataError, OutputError

SECRET = "SECRET-7d1c"


def failing_sink(error: BaseException) -> Any:
    def sink_parquet(self: Any, *args: Any, **kwargs: Any) -> None:
        raise error
    return sink_parquet


@pytest.mark.parametrize("error", [
    pl.exceptions.ComputeError(f"could not parse `os error {SECRET}` as dtype f64 (os error 28)"),
    pl.exceptions.InvalidOperationError(f"No space left on device {SECRET}"),
])
def test_a_polars_error_is_a_data_error_while_the_scratch_folder_takes_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", failing_sink(error))
    with pytest.raises(DataError) as caught:
        polars_steps.sink(pl.LazyFrame({"a": [1]}), tmp_path / "x.parquet", tmp_path)
    assert caught.value.exit_code == 3 and SECRET not in caught.value.message
    assert type(error).__name__ in caught.value.message


def test_an_os_error_reading_an_input_is_a_data_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", failing_sink(FileNotFoundError(2, f"gone {SECRET}")))
    with pytest.raises(DataError, match="an input file could not be read") as caught:
        polars_steps.sink(pl.LazyFrame({"a": [1]}), tmp_path / "x.parquet", tmp_path)
    assert SECRET not in caught.value.message


def test_any_failure_is_the_scratch_disks_when_the_folder_cannot_take_a_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pl.LazyFrame, "sink_parquet", failing_sink(pl.exceptions.ComputeError(SECRET)))
    monkeypatch.setattr(polars_steps, "scratch_write_problem", lambda folder: "No space left on device")
    with pytest.raises(OutputError) as caught:
        polars_steps.sink(pl.LazyFrame({"a": [1]}), tmp_path / "x.parquet", tmp_path)
    assert caught.value.exit_code == 6 and SECRET not in caught.value.message
    assert caught.value.message.endswith("No space left on device")


def test_the_scratch_probe_reports_the_operating_systems_refusal(tmp_path: Path) -> None:
    """A real refusal: a file size limit of 1000 bytes makes the probe's 1 MiB write fail (EFBIG)."""
    code = ("import resource, signal, sys; from pathlib import Path; "
            "from dprun.engines.polars_steps import scratch_write_problem; "
            "print(scratch_write_problem(Path(sys.argv[1]))); "
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
            "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)); "
            "print(scratch_write_problem(Path(sys.argv[1])))")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == ["None", "File too large"], result.stdout + result.stderr
    assert not list(tmp_path.iterdir()), "the probe left a file behind"

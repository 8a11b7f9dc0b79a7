"""The Python API example in docs/ci.md runs as written, on a copy of the shipped specs and data."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest
from dprun_testing import example_copy

ROOT = Path(__file__).resolve().parents[1]


def test_the_documented_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    text = (ROOT / "docs" / "ci.md").read_text()
    section = text[text.index("## Python API"):]
    [code] = re.findall(r"```python\n(.*?)```", section, re.DOTALL)[:1]
    monkeypatch.chdir(example_copy(tmp_path))
    monkeypatch.delenv("DPRUN_LEDGER", raising=False)
    namespace: dict[str, object] = {}
    exec(compile(code, "docs/ci.md", "exec"), namespace)
    assert isinstance(namespace["table"], pl.DataFrame) and namespace["table"].height > 0
    assert "visits_per_restaurant" in capsys.readouterr().out
    assert (tmp_path / "out" / "public" / "report.json").exists()

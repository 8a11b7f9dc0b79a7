"""Helpers shared by the test files: running `dprun` in-process and drawing seeds.

Importable as `dprun_testing` because pyproject's `[tool.pytest.ini_options]` puts `tests` on
`pythonpath`; the test folders have no `__init__.py`.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner, Result

from dprun import cli as dprun_cli
from dprun.engines import sorted_bounding

REPOSITORY = Path(__file__).resolve().parents[1]

# What a chart that is not looked at is drawn as, by the functions of `dprun.card` that call
# matplotlib (each given what its chart shows: the card's own code decides which charts there are).
PLACEHOLDER_SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"></svg>'
CHART_DRAWINGS = ("_budget_chart", "_keep_curve", "_errorbar_chart")

# `dprun` as a process, through its entry point (`launcher.main`), with placeholder charts (no card
# helper, no matplotlib): for the tests of publication and the ledger, which start dozens of runs and
# read their releases, never their charts. The helper's imports and drawing were half of such a run's
# CPU time (1.1 of 2.0 s). The launcher's signal handlers come a few imports later than under
# `python -m dprun`: tests of the start-up window run the real command.
CHARTLESS_DPRUN = f"""
import sys
from dprun import card_helper

def release_card(plan, tables, release):
    from dprun import card
    for drawing in {CHART_DRAWINGS!r}:
        setattr(card, drawing, lambda *arguments: {PLACEHOLDER_SVG!r})
    return card.release_card(plan, tables, release)

card_helper.start_for_this_run = lambda: None
card_helper.release_card = release_card
sys.argv = ["dprun", *sys.argv[1:]]
from dprun.launcher import main
main()
"""


def chartless_dprun(*args: str) -> list[str]:
    """The command line of `dprun ARGS` as a process whose card's charts are placeholders (`CHARTLESS_DPRUN`)."""
    return [sys.executable, "-c", CHARTLESS_DPRUN, *args]


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def _dprun(args: tuple[str, ...]) -> None:
    dprun_cli.main(list(args))


def invoke(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    """`dprun ARGS` in-process through the script's entry point, `dprun.cli.main`, which maps
    errors to exit codes; pytest's SIGINT/SIGTERM handlers are restored afterwards.

    `env` overrides environment variables for the call (a value of None unsets the variable)."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return CliRunner().invoke(_dprun, list(args), env=env)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def invoke_clean(*args: str) -> Result:
    """`invoke`, and assert that the run printed no traceback and raised nothing but SystemExit."""
    result = invoke(*args)
    text = everything(result)
    assert "Traceback" not in text, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result


def everything(result: Result) -> str:
    """Everything the run printed: stdout then stderr."""
    return result.stdout + result.stderr


def released_column(spec: Path, metric: str) -> dict[Any, Any]:
    """`dprun run SPEC` through the CLI, then its output `out/q.csv` read back with Polars: the
    first column (the partition key) → the `metric` column."""
    result = invoke("run", str(spec), "--overwrite")
    assert result.exit_code == 0, everything(result)
    table = pl.read_csv(spec.parent / "out" / "q.csv")
    return dict(zip(table[table.columns[0]].to_list(), table[metric].to_list(), strict=True))


def fresh_seed(nbytes: int = 7) -> int:
    """A new random seed of `nbytes` bytes (tests print it in their failure messages)."""
    return int.from_bytes(os.urandom(nbytes), "big")


@pytest.fixture
def no_ambient_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a ledger or CI step summary configured in the caller's environment out of the tests.

    Use with `pytestmark = pytest.mark.usefixtures("no_ambient_ledger")` after importing it."""
    monkeypatch.delenv("DPRUN_LEDGER", raising=False)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


def example_copy(tmp_path: Path) -> Path:
    """`tmp_path` holding a copy of specs/ and a link to sample_data/: the examples run there,
    their outputs beside them, the repository untouched."""
    shutil.copytree(REPOSITORY / "specs", tmp_path / "specs")
    (tmp_path / "sample_data").symlink_to(REPOSITORY / "sample_data")
    return tmp_path


def every_sum(sums: sorted_bounding._ExactSums) -> pl.Series:
    """Every key code's exact sum, in code order."""
    return sums.total_of(np.arange(sums.small.size))

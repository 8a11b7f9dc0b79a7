"""The release card drawn by `dprun run`'s helper process (dprun/card_helper.py): the same
bytes as the run would draw, the run's own drawing where the helper is gone, and a helper
asked for nothing ends with its input."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dprun_testing import no_ambient_ledger  # noqa: F401 (a fixture)

from dprun import api, card, card_helper
from dprun.card_helper import CardHelper
from dprun.plan import Plan

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")

Release = tuple[Plan, dict[str, pl.DataFrame], dict[str, Any]]


@pytest.fixture
def release(tmp_path: Path) -> Release:
    """A release of restaurants_private.yaml (a private selection: every kind of chart)."""
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    result = api.run(tmp_path / "specs" / "restaurants_private.yaml", seed=7)
    return result.plan, result.tables, {"release_id": "0" * 16, "released_on": "2026-01-01",
                                        "non_private_test_seed": True}


def test_the_helper_draws_the_card_the_run_would(release: Release) -> None:
    helper = CardHelper.start()
    assert helper is not None
    try:
        drawn = helper.draw(*release)
    finally:
        helper.stop()
    assert drawn == card.release_card(*release)


def test_where_the_helper_is_gone_the_run_draws_the_card(release: Release, monkeypatch: pytest.MonkeyPatch) -> None:
    helper = CardHelper.start()
    assert helper is not None
    helper._process.kill()
    helper._process.wait()
    monkeypatch.setattr(card_helper, "_started", helper)
    assert card_helper.release_card(*release) == card.release_card(*release)
    assert card_helper._started is None  # taken once


def test_a_helper_asked_for_nothing_ends_with_its_input() -> None:
    helper = CardHelper.start()
    assert helper is not None
    process = helper._process
    assert process.stdin is not None and process.stdout is not None
    process.stdin.close()
    assert process.wait(timeout=120) == 0
    assert process.stdout.read() == b""
    helper.stop()

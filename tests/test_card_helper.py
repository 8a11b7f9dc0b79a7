"""The release card drawn by `dprun run`'s helper process (dprun/card_helper.py): the same
bytes as the run would draw, with the plan's charts drawn ahead or not; charts drawn ahead
taken only for the plan they show; the run's own drawing where the helper is gone; a helper
asked for nothing ends with its input; reading a plan imports none of the spec's checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from dprun_testing import example_copy, no_ambient_ledger  # noqa: F401 (a fixture)

from dprun import api, card, card_helper
from dprun.card_helper import CardHelper
from dprun.plan import Plan

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")

Release = tuple[Plan, dict[str, pl.DataFrame], dict[str, Any]]


def released(tmp_path: Path, spec: str) -> Release:
    result = api.run(example_copy(tmp_path) / "specs" / spec, seed=7)
    return result.plan, result.tables, {"release_id": "0" * 16, "released_on": "2026-01-01",
                                        "non_private_test_seed": True}


@pytest.fixture
def release(tmp_path: Path) -> Release:
    """A release of restaurants_private.yaml (a private selection: every kind of chart)."""
    return released(tmp_path, "restaurants_private.yaml")


@pytest.fixture
def sql_release(tmp_path: Path) -> Release:
    """A release of restaurants_sql.yaml: its plan holds the spec's HAVING, ORDER BY and LIMIT."""
    return released(tmp_path, "restaurants_sql.yaml")


@pytest.mark.parametrize(("a_release", "ahead"), [("release", True), ("release", False), ("sql_release", True)],
                         ids=["plan sent ahead", "no plan ahead", "SQL, plan sent ahead"])
def test_the_helper_draws_the_card_the_run_would(a_release: str, ahead: bool, request: pytest.FixtureRequest) -> None:
    release = request.getfixturevalue(a_release)
    helper = CardHelper.start()
    assert helper is not None
    try:
        assert not ahead or helper.draw_ahead(release[0])
        drawn = helper.draw(*release)
    finally:
        helper.stop()
    assert drawn == card.release_card(*release)


def test_charts_drawn_ahead_are_taken_where_the_card_s_plan_shows_the_same(release: Release,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    plan, tables, facts = release
    charts = card.Charts()
    charts.draw_ahead(plan)

    expected = card.release_card(plan, tables, facts)

    def drawn_again(*_: Any) -> str:
        raise AssertionError("a chart drawn ahead was drawn again")
    monkeypatch.setattr(card, "_budget_chart", drawn_again)
    monkeypatch.setattr(card, "_keep_chart", drawn_again)
    assert card.release_card(plan, tables, facts, charts) == expected


def test_charts_drawn_ahead_from_another_plan_are_not_taken(release: Release, tmp_path: Path) -> None:
    # As where the run's plan changes after it was sent (auto bounds chosen from the data).
    plan, tables, facts = release
    spec = tmp_path / "specs" / "restaurants_private.yaml"
    spec.write_text(spec.read_text().replace("epsilon: 1.0", "epsilon: 2.0"))
    other = api.plan(api.validate(spec))
    assert other.queries[0].selection.detail != plan.queries[0].selection.detail
    charts = card.Charts()
    charts.draw_ahead(other)
    assert card.release_card(plan, tables, facts, charts) == card.release_card(plan, tables, facts)


def test_where_the_helper_is_gone_the_plan_is_not_sent_and_the_run_draws_the_card(
        release: Release, monkeypatch: pytest.MonkeyPatch) -> None:
    helper = CardHelper.start()
    assert helper is not None
    helper._process.kill()
    helper._process.wait()
    monkeypatch.setattr(card_helper, "_started", helper)
    card_helper.draw_ahead(release[0])
    assert card_helper._started is None  # stopped and reaped
    assert card_helper.release_card(*release) == card.release_card(*release)


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


def test_what_the_helper_imports_to_read_a_plan_leaves_out_the_spec_s_checks() -> None:
    # The helper's start is on the run's path: the spec's models (pydantic), its SQL parser
    # and its schema readers took 0.15 s of it. A plan that holds a model imports it as it is unpickled.
    code = ("import sys, polars, dprun.plan, dprun.report, dprun.card; "
            "print(sorted(m for m in ('pydantic', 'sqlglot', 'ruamel', 'pyarrow', 'scipy', 'dp_accounting', "
            "'dprun.spec.models', 'dprun.spec.validation') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout

"""The long audits are marked `slow`; pyproject's addopts ("-ra") does not deselect them, so this
folder skips them unless the run selects them with `-m` (e.g. `pytest -m slow tests/audit`)."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "slow" in (config.getoption("markexpr", default="") or ""):
        return
    skip = pytest.mark.skip(reason="slow DP audit: run with `pytest -m slow tests/audit`")
    for item in items:
        if "slow" in item.keywords and HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)

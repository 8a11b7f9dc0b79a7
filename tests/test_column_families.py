"""Units and keys of every column family, end to end through the CLI on real files: text ids,
a compound unit, a two-column key, a date key, a key with nulls.

Every account has at most 3 cities and 5 visits per (account, city), and the specs' bounds
are at least that, so bounding clips nothing: with ε = 10^4 per query the released numbers
are the exact ones up to noise: counts within ±1 and sums within ±25 (Laplace scales below
1) except with probability below 1e-9.
"""

from __future__ import annotations

import json
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import everything, invoke, no_ambient_ledger

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")
assert no_ambient_ledger  # the fixture is used by name above

CITIES = ["Lille", "Lyon", "Nantes", None]


def visits() -> pl.DataFrame:
    """300 accounts, each with 1–3 cities (one of them null for some) and 1–5 visits per city."""
    rng = np.random.default_rng(7)
    rows: list[dict[str, Any]] = []
    for account in range(300):
        for city in rng.choice(len(CITIES), rng.integers(1, 4), replace=False):
            for _ in range(rng.integers(1, 6)):
                rows.append({"account": f"acct-{account:05d}", "city": CITIES[city],
                             "device": ["ios", "android"][int(rng.integers(2))],
                             "day": date(2026, 3, 1) + timedelta(days=int(rng.integers(3))),
                             "amount": round(float(rng.uniform(0, 40)), 2)})
    return pl.DataFrame(rows).sample(fraction=1.0, shuffle=True, seed=3)


def run(folder: Path, unit: str | list[str], group_by: list[str], l0: int, m: int) -> tuple[pl.DataFrame, str]:
    """`dprun run` of one query with count, privacy_id_count and sum: its output and its report's text.

    The input is CSV, or Parquet for a date key (CSV dates are read as text)."""
    data = "visits.parquet" if "day" in group_by else "visits.csv"
    getattr(visits(), f"write_{data.split('.')[1]}")(folder / data)
    spec = {
        "version": 1, "privacy_unit": unit, "budget": {"epsilon": 10_000.0, "delta": 1e-6},
        "inputs": {"visits": {"path": data}},
        "queries": [{
            "name": "q", "input": "visits", "group_by": group_by,
            "contribution_bounds": {"max_partitions_contributed": l0, "max_contributions_per_partition": m},
            "metrics": [{"name": "visits", "kind": "count"}, {"name": "people", "kind": "privacy_id_count"},
                        {"name": "spent", "kind": "sum", "column": "amount", "bounds": [0, 40]}],
            "partitions": {"selection": "gaussian_threshold"},
            "output": {"path": "out/q.parquet"},
        }],
        "report": "out/report.json",
    }
    (folder / "spec.yaml").write_text(json.dumps(spec))
    result = invoke("run", str(folder / "spec.yaml"))
    assert result.exit_code == 0, everything(result)
    return pl.read_parquet(folder / "out" / "q.parquet"), (folder / "out" / "report.json").read_text()


def truth(unit: str | list[str], group_by: list[str]) -> pl.DataFrame:
    data = visits()
    return data.group_by(group_by).agg(pl.len().alias("visits"), pl.struct(unit).n_unique().alias("people"),
                                       pl.col("amount").sum().alias("spent"))


@pytest.mark.parametrize(("unit", "group_by", "l0", "m"), [
    ("account", ["city"], 3, 5),  # text unit, text key with nulls
    (["account", "day"], ["device"], 2, 15),  # compound unit
    ("account", ["city", "device"], 6, 5),  # two-column key
    ("account", ["day"], 3, 15),  # date key
], ids=["text_and_null_key", "compound_unit", "two_column_key", "date_key"])
def test_every_column_family_releases_its_exact_numbers(tmp_path: Path, unit: str | list[str], group_by: list[str],
                                                       l0: int, m: int) -> None:
    released, report = run(tmp_path, unit, group_by, l0, m)
    expected = truth(unit, group_by)
    assert released.select(group_by).schema == expected.select(group_by).schema, "keys keep their types"
    both = expected.join(released, on=group_by, how="left", nulls_equal=True, suffix="_released")
    assert both["visits_released"].null_count() == 0, f"a partition of 40+ accounts is missing:\n{both}"
    for metric, tolerance in [("visits", 1), ("people", 1), ("spent", 25.0)]:
        error = (both[f"{metric}_released"] - both[metric]).abs().max()
        assert error <= tolerance, f"{metric}: off by {error}:\n{both}"
    if group_by == ["city"]:
        assert released["city"].null_count() == 1, "the null city is a partition of its own"
    assert "__dprun" not in report and "acct-" not in report, "codes and ids stay out of the report"
    assert json.loads(report)["queries"][0]["partitions_released"] == released.height


def test_a_compound_unit_is_bounded_per_account_and_day(tmp_path: Path) -> None:
    """One account on 3 days is 3 units: with L0 = 1 each (account, day) keeps one device, so
    the people counted per device are (account, day) pairs, not accounts."""
    released, _ = run(tmp_path, ["account", "day"], ["device"], 1, 5)
    pairs = visits().select("account", "day").n_unique()
    total_people = round(float(released["people"].sum()))
    assert abs(total_people - pairs) <= 2, f"{total_people} units released across devices, {pairs} (account, day) pairs"

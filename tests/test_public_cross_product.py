"""`partitions.public` as a mapping from each group_by column to its values: every combination (issue #19)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import everything, fresh_seed, invoke
from planted_secrets import write_spec

CARRIERS = ["AA", "B6", "UA", "WN"]
AIRPORTS = ["EWR", "JFK", "LGA"]


def spec_with(folder: Path, public: Any, rng: np.random.Generator) -> Path:
    rows = 2000
    pl.DataFrame({
        "tailnum": rng.integers(0, 400, rows),
        "carrier": [CARRIERS[i] for i in rng.integers(0, 3, rows)],  # WN never flies here
        "origin": [AIRPORTS[i] for i in rng.integers(0, 3, rows)],
    }).write_parquet(folder / "flights.parquet")
    pl.DataFrame({"faa": AIRPORTS, "name": ["Newark", "Kennedy", "LaGuardia"]}).write_csv(folder / "airports.csv")
    return write_spec(folder, {
        "version": 1, "privacy_unit": "tailnum", "budget": {"epsilon": 1.0},
        "inputs": {"flights": {"path": "flights.parquet"}},
        "queries": [{
            "name": "routes", "input": "flights", "group_by": ["carrier", "origin"],
            "partitions": {"public": public},
            "contribution_bounds": {"max_partitions_contributed": 2, "max_contributions_per_partition": 3},
            "metrics": [{"name": "flights", "kind": "count"}], "output": {"path": "out/routes.parquet"},
        }],
        "report": "out/report.json",
    })


def test_every_combination_of_listed_and_file_values_is_released(tmp_path: Path) -> None:
    seed = fresh_seed()
    spec = spec_with(tmp_path, {"carrier": CARRIERS, "origin": {"file": "airports.csv", "column": "faa"}},
                     np.random.default_rng(seed))
    result = invoke("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 0, f"seed={seed}: {everything(result)}"
    released = pl.read_parquet(tmp_path / "out" / "routes.parquet")
    keys = sorted(zip(released["carrier"].to_list(), released["origin"].to_list()))
    assert keys == sorted((c, a) for c in CARRIERS for a in AIRPORTS), f"seed={seed}: {keys}"
    assert json.loads((tmp_path / "out" / "report.json").read_text())["queries"][0]["partitions_released"] == 12


@pytest.mark.parametrize(("public", "field", "message"), [
    ({"carrier": CARRIERS}, "queries[0].partitions.public", "names each group_by column once (carrier, origin)"),
    ({"carrier": CARRIERS, "origin": []}, "queries[0].partitions.public.origin", "no values"),
    ({"carrier": CARRIERS, "origin": {"file": "airports.csv", "column": "iata"}},
     "queries[0].partitions.public.origin.file", "lacks column iata"),
    ({"carrier": CARRIERS, "origin": {"file": "flights.parquet", "column": "origin"}},
     "queries[0].partitions.public.origin.file", "the public partition file is a private input of this spec"),
    ({"carrier": [f"c{i}" for i in range(4000)], "origin": [f"o{i}" for i in range(4000)]},
     "queries[0].partitions.public", "more than 10,000,000 keys"),
])
def test_a_mapping_that_does_not_fit_is_refused_where_it_is(tmp_path: Path, public: Any, field: str,
                                                           message: str) -> None:
    spec = spec_with(tmp_path, public, np.random.default_rng(fresh_seed()))
    result = invoke("validate", str(spec), "--format", "json")
    assert result.exit_code == 1, everything(result)
    problems = [(p["field"], p["message"]) for p in json.loads(result.stdout)["problems"]]
    assert any(f == field and message in m for f, m in problems), problems

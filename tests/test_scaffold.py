"""`dprun init DATAFILE`: a commented spec from a file's column names and types, never its values.

The scaffold must fail validation, saying its FILL_IN placeholders need filling, until the user
fills them; then it validates and runs. Data files plant distinctive values that must never
appear in the scaffold or in any message. A Parquet file whose data pages are overwritten
with garbage still scaffolds: only its footer is read.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dprun import api
from dprun.scaffold import PLACEHOLDER, placeholder_lines
from dprun_testing import invoke_clean, no_ambient_ledger  # noqa: F401 (a fixture)

PLANTED_TEXT = "ZEBRA-SECRET-7731"
PLANTED_NUMBER = "918273.645"


pytestmark = pytest.mark.usefixtures("no_ambient_ledger")


def frame(seed: int, rows: int = 3000, names: tuple[str, str, str, str] = ("user_id", "shop", "spend", "day")
          ) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    shops = [f"s{k}" for k in rng.integers(0, 5, rows)]
    spend = rng.uniform(0, 50, rows).round(2)
    shops[7], spend[11] = PLANTED_TEXT, float(PLANTED_NUMBER)
    uid, shop, amount, day = names
    return pl.DataFrame({uid: rng.integers(0, rows // 3, rows), shop: shops, amount: spend,
                         day: rng.integers(1, 8, rows).astype(np.int16)})


def no_values(text: str) -> None:
    assert PLANTED_TEXT not in text, text
    assert PLANTED_NUMBER not in text and "918273" not in text, text


def fill(text: str, unit: str, values: list[str]) -> str:
    """What a user does: name the privacy unit and write bounds from domain knowledge."""
    text = text.replace(f"privacy_unit: {PLACEHOLDER}", f"privacy_unit: {json.dumps(unit)}")
    text = text.replace(f"max_partitions_contributed: {PLACEHOLDER}", "max_partitions_contributed: 1")
    text = text.replace(f"max_contributions_per_partition: {PLACEHOLDER}", "max_contributions_per_partition: 3")
    text = text.replace(f"[{PLACEHOLDER}, {PLACEHOLDER}]", "[0, 50]")
    assert not placeholder_lines(text), text
    return text


def test_init_scaffolds_a_csv_spec_that_validates_once_filled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = int.from_bytes(os.urandom(6), "big")
    frame(seed).write_csv(tmp_path / "visits.csv")
    monkeypatch.chdir(tmp_path)

    printed = invoke_clean("init", "visits.csv")
    assert printed.exit_code == 0, printed.output
    text = printed.stdout
    no_values(text + printed.stderr)
    for column, dtype in (("user_id", "Int64"), ("shop", "String"), ("spend", "Float64"), ("day", "Int64")):
        assert f'"{column}": {dtype}' in text, text
    assert '"spend", bounds: [FILL_IN, FILL_IN]' in text
    # The spec declares the types init saw: a run reads CSV types from the spec, never from rows.
    for column, kind in (("user_id", "int64"), ("shop", "string"), ("spend", "float64"), ("day", "int64")):
        assert f'\n      "{column}": {kind}\n' in text, text
    assert api.scaffold("visits.csv") == text

    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    refused = invoke_clean("validate", "spec.yaml")
    assert refused.exit_code == 1, refused.output
    no_values(refused.output)
    errors = refused.stderr.strip().splitlines()
    assert len(errors) == 4, refused.stderr  # privacy unit, 2 contribution bounds, 1 value bounds pair
    lines = list(dict.fromkeys(line for line, _ in placeholder_lines(text)))
    for error, line in zip(errors, lines, strict=True):
        assert error.startswith(f"error: spec.yaml:{line}:"), error
        assert "placeholder" in error and "dprun init" in error and "domain knowledge" in error, error
    assert "privacy_unit" in errors[0] and "max_partitions_contributed" in errors[1] and "bounds" in errors[3]
    as_json = json.loads(invoke_clean("validate", "spec.yaml", "--format", "json").stdout)
    assert as_json["ok"] is False and all("placeholder" in p["message"] for p in as_json["problems"])

    spec.write_text(fill(text, "user_id", ["0", "50"]))
    validated = invoke_clean("validate", "spec.yaml")
    assert validated.exit_code == 0, validated.output
    ran = invoke_clean("run", "spec.yaml", "--seed", str(seed))
    assert ran.exit_code == 0, ran.output
    released = pl.read_parquet(tmp_path / "out" / "visits.parquet")
    assert released.columns == ["rows", "people", "spend_sum"] and released.height == 1
    assert len(api.read_ledger(tmp_path / "dprun-ledger.db")) == 1  # the scaffold names a ledger
    assert invoke_clean("run", "spec.yaml", "--seed", str(seed)).exit_code == 5


def test_init_partially_filled_still_names_the_rest(tmp_path: Path) -> None:
    frame(1).write_csv(tmp_path / "visits.csv")
    spec = tmp_path / "spec.yaml"
    text = api.scaffold(tmp_path / "visits.csv", spec)
    spec.write_text(text.replace(f"privacy_unit: {PLACEHOLDER}", "privacy_unit: user_id")
                    .replace(f"[{PLACEHOLDER}, {PLACEHOLDER}]", "[0, 50]"))
    result = invoke_clean("validate", str(spec))
    assert result.exit_code == 1
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 2 and all("contribution_bounds" in e and "placeholder" in e for e in errors), errors


def test_init_reads_only_the_parquet_footer(tmp_path: Path) -> None:
    data = tmp_path / "data" / "visits.parquet"
    data.parent.mkdir()
    frame(2, rows=50_000).write_parquet(data, compression="uncompressed", statistics=False)
    raw = bytearray(data.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little") + 8
    assert len(raw) > footer + 200_000
    raw[4:len(raw) - footer - 16] = b"\xff" * (len(raw) - footer - 20)  # every data page is now garbage
    data.write_bytes(bytes(raw))
    with pytest.raises(pl.exceptions.PolarsError):
        pl.read_parquet(data)

    (tmp_path / "specs").mkdir()
    result = invoke_clean("init", str(data), "-o", str(tmp_path / "specs" / "visits.yaml"))
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stderr and "5 FILL_IN" in result.stderr, result.stderr
    text = (tmp_path / "specs" / "visits.yaml").read_text()
    no_values(text)
    assert 'path: "../data/visits.parquet"' in text and "types from the file footer" in text


def test_init_parquet_scaffold_runs_once_filled(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(6), "big")
    data = tmp_path / "data" / "visits.parquet"
    data.parent.mkdir()
    frame(seed).write_parquet(data)
    spec = tmp_path / "specs" / "visits.yaml"
    spec.parent.mkdir()
    assert invoke_clean("init", str(data), "--output", str(spec)).exit_code == 0
    spec.write_text(fill(spec.read_text(), "user_id", ["0", "50"]))
    result = invoke_clean("run", str(spec), "--seed", str(seed))
    assert result.exit_code == 0, result.output
    no_values(result.output)
    assert pl.read_parquet(tmp_path / "specs" / "out" / "visits.parquet").height == 1


def test_init_ndjson_and_awkward_column_names(tmp_path: Path) -> None:
    names = ("person #1", 'shop "name"', "spend: eur", "day")
    data = tmp_path / "events.jsonl"
    frame(3, rows=500, names=names).write_ndjson(data)
    spec = tmp_path / "events.yaml"
    assert invoke_clean("init", str(data), "-o", str(spec)).exit_code == 0
    text = spec.read_text()
    no_values(text)
    assert "format: ndjson" in text and '"spend: eur"' in text
    assert "spend_eur_sum" in text
    spec.write_text(fill(text, "person #1", ["0", "50"]))
    result = invoke_clean("validate", str(spec))
    assert result.exit_code == 0, result.output


def test_init_refuses_to_overwrite_and_unknown_formats(tmp_path: Path) -> None:
    frame(4, rows=100).write_csv(tmp_path / "visits.txt")
    unknown = invoke_clean("init", str(tmp_path / "visits.txt"))
    assert unknown.exit_code == 1 and "--format" in unknown.stderr, unknown.output
    spec = tmp_path / "spec.yaml"
    spec.write_text("mine\n")
    assert invoke_clean("init", str(tmp_path / "visits.txt"), "--format", "csv", "-o", str(spec)).exit_code == 6
    assert spec.read_text() == "mine\n"
    forced = invoke_clean("init", str(tmp_path / "visits.txt"), "--format", "csv", "-o", str(spec), "--force")
    assert forced.exit_code == 0 and "format: csv" in spec.read_text()
    missing = invoke_clean("init", str(tmp_path / "nope.csv"))
    assert missing.exit_code == 1 and "not found" in missing.stderr


def test_init_without_numeric_columns(tmp_path: Path) -> None:
    pl.DataFrame({"uid": ["a", "b"], "colour": ["red", "blue"]}).write_csv(tmp_path / "c.csv")
    text = api.scaffold(tmp_path / "c.csv", tmp_path / "c.yaml")
    assert "kind: sum" not in text
    spec = tmp_path / "c.yaml"
    spec.write_text(fill(text, "uid", []))
    assert invoke_clean("validate", str(spec)).exit_code == 0
    assert re.search(r"# group_by: \[\"colour\"\]", text)

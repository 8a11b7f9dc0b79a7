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


def fill(text: str, unit: str) -> str:
    """What a user does: name the privacy unit (the bounds are `auto`)."""
    text = text.replace(f"privacy_unit: {PLACEHOLDER}", f"privacy_unit: {json.dumps(unit)}")
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
    assert '"spend", bounds: auto}' in text and "max_partitions_contributed: auto" in text
    # The spec declares the types init saw: a run reads CSV types from the spec, never from rows.
    for column, kind in (("user_id", "int64"), ("shop", "string"), ("spend", "float64"), ("day", "int64")):
        assert f'\n      "{column}": {kind}\n' in text, text
    assert api.scaffold("visits.csv") == text

    spec = tmp_path / "spec.yaml"
    spec.write_text(text)
    refused = invoke_clean("validate", "spec.yaml")
    assert refused.exit_code == 1, refused.output
    no_values(refused.output)
    (error,) = refused.stderr.strip().splitlines()  # the privacy unit only
    (line,) = {line for line, _ in placeholder_lines(text)}
    assert error.startswith(f"error: spec.yaml:{line}:") and "privacy_unit" in error, error
    assert "placeholder" in error and "dprun init" in error and "domain knowledge" in error, error
    as_json = json.loads(invoke_clean("validate", "spec.yaml", "--format", "json").stdout)
    assert as_json["ok"] is False and all("placeholder" in p["message"] for p in as_json["problems"])

    spec.write_text(fill(text, "user_id"))
    validated = invoke_clean("validate", "spec.yaml")
    assert validated.exit_code == 0, validated.output
    ran = invoke_clean("run", "spec.yaml", "--seed", str(seed))
    assert ran.exit_code == 0, ran.output
    released = pl.read_parquet(tmp_path / "out" / "visits.parquet")
    assert released.columns == ["rows", "people", "spend_sum"] and released.height == 1
    assert len(api.read_ledger(tmp_path / "dprun-ledger.db")) == 1  # the scaffold names a ledger
    assert invoke_clean("run", "spec.yaml", "--seed", str(seed)).exit_code == 5


def r_style_flights(path: Path, seed: int, rows: int = 2000) -> None:
    """Flights as R writes them: NA for a missing delay, ISO times with a Z, identifiers and calendar
    fields as whole numbers beside the delays."""
    rng = np.random.default_rng(seed)
    delay = rng.integers(-30, 300, rows).astype(str)
    delay[rng.random(rows) < 0.05] = "NA"
    delay[3] = "NA"  # within any sample
    frame = pl.DataFrame({
        "year": [2013] * rows, "month": rng.integers(1, 13, rows), "flight": rng.integers(1, 3000, rows),
        "tailnum": [f"N{n}" for n in rng.integers(100, 999, rows)],
        "carrier": rng.choice(["AA", "B6", "UA"], rows), "arr_delay": delay,
        "distance": rng.integers(100, 4000, rows),
        "time_hour": [f"2013-01-{d:02d}T{h:02d}:00:00Z" for d, h in zip(rng.integers(1, 29, rows),
                                                                        rng.integers(5, 23, rows))],
    })
    frame.write_csv(path)


def test_init_on_an_r_style_csv_proposes_null_values_types_and_measures_first(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(6), "big")
    r_style_flights(tmp_path / "flights.csv", seed)
    spec = tmp_path / "flights.yaml"
    result = invoke_clean("init", str(tmp_path / "flights.csv"), "-o", str(spec))
    assert result.exit_code == 0 and "fill its 1 FILL_IN placeholder(s) (the privacy unit)" in result.stderr, \
        result.output
    text = spec.read_text()
    assert '    null_values: ["NA"]' in text, f"seed={seed}: {text}"
    assert '      "arr_delay": int64  # "NA" read as missing (`null_values`)' in text, text
    assert '      "time_hour": {type: datetime, format: "%Y-%m-%dT%H:%M:%S%.fZ"}' in text, text
    assert '      "carrier": string\n' in text and '      "tailnum": string\n' in text
    metrics = re.findall(r'column: "(\w+)", bounds: auto', text)
    assert metrics[:2] == ["arr_delay", "distance"], metrics  # measures before year, month, flight
    assert set(metrics[2:]) == {"year", "month", "flight"}, metrics

    spec.write_text(fill(text, "tailnum"))
    validated = invoke_clean("validate", str(spec))
    assert validated.exit_code == 0, f"seed={seed}: {validated.output}"
    ran = invoke_clean("run", str(spec), "--seed", str(seed % 2**32))
    assert ran.exit_code == 0, f"seed={seed}: {ran.output}"


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
    assert "wrote" in result.stderr and "1 FILL_IN" in result.stderr, result.stderr
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
    spec.write_text(fill(spec.read_text(), "user_id"))
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
    spec.write_text(fill(text, "person #1"))
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
    spec.write_text(fill(text, "uid"))
    assert invoke_clean("validate", str(spec)).exit_code == 0
    assert re.search(r"# group_by: \[\"colour\"\]", text)


def test_init_writes_the_query_in_sql_when_asked(tmp_path: Path) -> None:
    seed = int.from_bytes(os.urandom(6), "big")
    r_style_flights(tmp_path / "flights.csv", seed)
    spec = tmp_path / "flights.yaml"
    assert invoke_clean("init", str(tmp_path / "flights.csv"), "-o", str(spec), "--sql").exit_code == 0
    text = spec.read_text()
    assert "    sql: |\n      SELECT COUNT(*) AS rows, SUM(arr_delay) AS arr_delay_sum\n      -- , COUNT(DISTINCT" in text
    assert "    bounds: {\"arr_delay\": auto}" in text and "    metrics:" not in text
    spec.write_text(fill(text, "tailnum"))
    ran = invoke_clean("run", str(spec), "--seed", str(seed % 2**32))
    assert ran.exit_code == 0, f"seed={seed}: {ran.output}"
    assert pl.read_parquet(tmp_path / "out" / "flights.parquet").columns == ["rows", "arr_delay_sum"]

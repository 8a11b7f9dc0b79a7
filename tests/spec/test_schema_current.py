"""docs/dprun.schema.json is what `dprun schema` prints, so editors validate specs against the real contract."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from dprun.cli import cli

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "dprun.schema.json"
REGENERATE = "regenerate it with: dprun schema > docs/dprun.schema.json  (from the repository root)"


def test_schema_file_is_current() -> None:
    result = CliRunner().invoke(cli, ["schema"])
    assert result.exit_code == 0, result.output
    generated = json.loads(result.stdout)
    assert SCHEMA_FILE.is_file(), f"{SCHEMA_FILE} is missing; {REGENERATE}"
    committed = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert committed == generated, f"docs/dprun.schema.json is out of date with dprun/spec/models.py; {REGENERATE}"


def test_schema_describes_the_spec() -> None:
    document = json.loads(CliRunner().invoke(cli, ["schema"]).stdout)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["title"] == "dprun spec, version 1"
    assert set(document["required"]) == {"version", "privacy_unit", "budget", "inputs", "queries"}
    assert document["additionalProperties"] is False

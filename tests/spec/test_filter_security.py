"""Filters are row expressions: nothing in a spec's filter may read a file."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from dprun.errors import SpecError
from dprun.spec import validate_spec

SPEC = """version: 1
privacy_unit: uid
budget: {{epsilon: 1.0}}
inputs: {{rows: {{path: rows.csv}}}}
queries:
  - name: q
    input: rows
    filter: "{filter}"
    contribution_bounds: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
    metrics: [{{name: n, kind: count}}]
    output: {{path: out/q.csv}}
"""


@pytest.mark.parametrize("text", [
    "(SELECT nope FROM read_csv('SECRET_FILE')) = 1",
    "x IN (select x from read_parquet('SECRET_FILE'))",
    "x > (SeLeCt 1)",
])
def test_a_filter_with_a_subquery_is_refused_without_touching_the_file(tmp_path: Path, text: str) -> None:
    pl.DataFrame({"uid": [1], "x": [2]}).write_csv(tmp_path / "rows.csv")
    secret = tmp_path / "SECRET_FILE"
    secret.write_text("top-secret-line\n")
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(filter=text.replace("SECRET_FILE", str(secret))))
    with pytest.raises(SpecError) as caught:
        validate_spec(path)
    assert "sub-queries (SELECT) are not allowed" in str(caught.value)
    assert "top-secret-line" not in str(caught.value)
    assert ":8:" in str(caught.value)


def test_yaml_merge_keys_load_like_plain_keys(tmp_path: Path) -> None:
    from dprun.spec.yaml_loader import parse_text

    data, marks = parse_text("base: &b {epsilon: 1.0}\nbudget:\n  <<: *b\n  delta: 0.1\n", "m.yaml")
    assert data["budget"] == {"delta": 0.1, "epsilon": 1.0}
    assert marks[("budget", "epsilon")][0] in (1, 3)


def test_a_mapping_made_only_of_a_merge_loads(tmp_path: Path) -> None:
    from dprun.spec.yaml_loader import parse_text

    data, _ = parse_text("base: &b {epsilon: 1.0}\nbudget:\n  <<: *b\n", "m.yaml")
    assert data["budget"] == {"epsilon": 1.0}

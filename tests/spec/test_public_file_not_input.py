"""A `partitions.public_file` must not be one of the spec's inputs: its keys would be the private data's."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from dprun.errors import SpecError
from dprun.spec.validation import validate_spec

SPEC = """version: 1
privacy_unit: uid
budget: {{epsilon: 1.0}}
inputs: {{rows: {{path: {input}}}}}
queries:
  - name: q
    input: rows
    group_by: [k]
    partitions: {{public_file: {public}}}
    contribution_bounds: {{max_partitions_contributed: 1, max_contributions_per_partition: 1}}
    metrics: [{{name: n, kind: count}}]
    output: {{path: out/q.csv}}
"""


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    pl.DataFrame({"uid": [1, 2, 3], "k": ["a", "b", "c"]}).write_csv(tmp_path / "data" / "rows.csv")
    pl.DataFrame({"k": ["a", "b"]}).write_csv(tmp_path / "keys.csv")
    (tmp_path / "link.csv").symlink_to(tmp_path / "data" / "rows.csv")
    return tmp_path


def validate(folder: Path, input_path: str, public: str) -> None:
    path = folder / "spec.yaml"
    # FOLDER stands for the test's folder, in the file:// URLs.
    path.write_text(SPEC.format(input=input_path.replace("FOLDER", str(folder)),
                                public=public.replace("FOLDER", str(folder))))
    validate_spec(path)


@pytest.mark.parametrize(("input_path", "public"), [
    ("data/rows.csv", "data/rows.csv"),  # the same path
    ("data/rows.csv", "./data/../data/rows.csv"),  # another relative path to it
    ("data/rows.csv", "link.csv"),  # a symlink to it
    ("link.csv", "data/rows.csv"),  # the input is the symlink
    ("data/*.csv", "data/rows.csv"),  # a file an input glob matches
    ("data/rows.csv", '"file://FOLDER/data/rows.csv"'),  # the public file as a file:// URL
    ('"file://FOLDER/data/*.csv"', "data/rows.csv"),  # the input as a file:// URL
])
def test_a_public_file_that_is_an_input_is_refused(folder: Path, input_path: str, public: str) -> None:
    with pytest.raises(SpecError) as caught:
        validate(folder, input_path, public)
    (problem,) = caught.value.problems()
    assert (problem.line, problem.field) == (9, "queries[0].partitions.public_file")
    assert "the public partition file is a private input of this spec" in problem.message


def test_a_public_file_beside_the_input_is_accepted(folder: Path) -> None:
    validate(folder, "data/rows.csv", "keys.csv")
    validate(folder, "data/rows.csv", '"file://FOLDER/keys.csv"')


def test_a_public_input_may_also_be_the_public_file(folder: Path) -> None:
    """A lookup table declared `public: true` is a public source: its keys may be the partitions."""
    path = folder / "spec.yaml"
    text = SPEC.format(input="data/rows.csv", public="keys.csv").replace(
        "inputs: {rows: {path: data/rows.csv}}", "inputs: {rows: {path: data/rows.csv}, names: {path: keys.csv, public: true}}")
    path.write_text(text)
    assert "names:" in text
    validated = validate_spec(path)
    assert validated.inputs["names"].reading.public

"""The documentation against the code: what the docs point to exists, what they cite is in the
References, and the spec examples in docs/spec.md are specs dprun accepts.

A rename in the code that leaves a doc pointing at a name that is gone fails here, not in a
reader's hands.
"""

from __future__ import annotations

import importlib
import io
import re
from pathlib import Path
from typing import Any

import pytest
from ruamel.yaml import YAML

from dprun import api
from dprun.spec.models import Spec
from dprun.spec.sql_query import compile_sql_queries

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CITATION = re.compile(r"\[(D20 §[0-9.]+|DPP21|Plume22)\]")
# A file of the repository named in backticks, then optionally the names in it: `tests/x.py::test_y`,
# or `tests/x.py` (`test_a`, `test_b`).
TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+))?`(?: \(([^)]*)\))?")


def markdown_files() -> list[Path]:
    return [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def source_texts() -> dict[Path, str]:
    files = [*markdown_files(), *sorted((ROOT / "dprun").rglob("*.py"))]
    return {path: path.read_text() for path in files}


def section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def table_rows(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith("|") and not line.startswith("|---")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[1:]]


# --- references ------------------------------------------------------------------------------


def test_every_citation_is_in_the_references() -> None:
    references = section((DOCS / "mechanisms.md").read_text(), "## References")
    listed = {row[0] for row in table_rows(references)}
    cited = {f"[{key}]" for text in source_texts().values() for key in CITATION.findall(text)}
    assert cited, "no citation found: the pattern is wrong"
    assert cited <= listed, f"cited but not in docs/mechanisms.md#references: {sorted(cited - listed)}"


def test_no_citation_points_outside_the_repository() -> None:
    outside = re.compile(r"\bseeds? 00\d|\b00\d_[0-9a-f]{16}\.txt|shared/seeds")
    found = [f"{path.relative_to(ROOT)}: {match.group(0)}" for path, text in source_texts().items()
             for match in outside.finditer(text)]
    assert not found, "citations of files a user of the repository does not have:\n" + "\n".join(found)


# --- names the docs point to ---------------------------------------------------------------------


def module_of(path_text: str) -> Any:
    return importlib.import_module(path_text.removesuffix(".py").replace("/", "."))


def dprun_module_named(short: str) -> Any:
    matches = [p for p in (ROOT / "dprun").rglob(f"{short}.py")]
    assert len(matches) == 1, f"`{short}` names {len(matches)} modules of dprun"
    return module_of(str(matches[0].relative_to(ROOT)))


def test_where_each_formula_lives_names_what_exists() -> None:
    table = section((DOCS / "mechanisms.md").read_text(), "## Where each formula lives")
    missing = []
    rows = table_rows(table)
    assert len(rows) > 10, "the table was not found"
    for _, where, names in rows:
        modules = [module_of(path) for path in re.findall(r"`(dprun/[\w/]+\.py)`", where)]
        assert modules, f"no module in {where!r}"
        for qualified in re.findall(r"`(\w+)\.(\w+)`", where):
            owner, name = qualified
            if not hasattr(dprun_module_named(owner), name):
                missing.append(f"{owner}.{name}")
        for name in re.findall(r"`(\w+)`", names) + re.findall(r"`(\w+)`", re.sub(r"`dprun/[^`]*`", "", where)):
            if not any(hasattr(module, name) for module in modules) and not any(
                    hasattr(dprun_module_named(owner), name) for owner, _ in re.findall(r"`(\w+)\.(\w+)`", where)):
                missing.append(f"{name} (in {', '.join(m.__name__ for m in modules)})")
    assert not missing, "docs/mechanisms.md, 'Where each formula lives', names what is gone: " + ", ".join(missing)


def test_the_tests_the_docs_name_exist() -> None:
    missing = []
    for doc in markdown_files():
        for path_text, one, listed in TEST_REFERENCE.findall(doc.read_text()):
            path = ROOT / path_text
            if not path.exists():
                missing.append(f"{doc.name}: {path_text}")
                continue
            defined = set(re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE))
            named = {one} if one else set(re.findall(r"`(test_\w+)`", listed or ""))
            missing += [f"{doc.name}: {path_text}::{name}" for name in sorted(named - defined)]
    assert not missing, "tests the docs name that do not exist:\n" + "\n".join(missing)


def test_the_checks_catch_a_renamed_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from dprun.mechanisms import noise

    test_where_each_formula_lives_names_what_exists()  # every module named is imported now, whole
    monkeypatch.delattr(noise, "add_noise")
    with pytest.raises(AssertionError, match="add_noise"):
        test_where_each_formula_lives_names_what_exists()


# --- spec examples ---------------------------------------------------------------------------------

SPEC_LEVEL = set(Spec.model_fields)


def yaml_blocks() -> list[str]:
    return re.findall(r"```ya?ml\n(.*?)```", (DOCS / "spec.md").read_text(), re.DOTALL)


def load(text: str) -> Any:
    """A block's YAML; a line `...` stands for parts left out and is dropped."""
    kept = "\n".join(line for line in text.splitlines() if line.strip() != "...")
    return YAML(typ="safe").load(io.StringIO(kept))


def full_example() -> str:
    [full] = [block for block in yaml_blocks() if re.search(r"^version: ", block, re.MULTILINE)]
    return full


def test_the_full_example_validates_on_the_sample_data(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    spec = tmp_path / "specs" / "example.yaml"
    spec.write_text(full_example())
    validated = api.validate(spec)
    assert api.plan(validated).queries


@pytest.mark.parametrize("block", [b for b in yaml_blocks() if not re.search(r"^version: ", b, re.MULTILINE)
                                   and load(b) is not None])
def test_every_fragment_fits_the_spec_language(block: str) -> None:
    """A fragment is put into the full example (a spec-level key into the spec, any other into
    its first query; a fragment's first query over the example's) and the result must pass the
    spec model's checks."""
    document = load(full_example())
    for key, value in load(block).items():
        if key == "queries" and "sql" in value[0]:
            document["queries"][0] = value[0]  # a query written in SQL stands alone
        elif key == "queries":
            document["queries"][0].update(value[0])
        elif key in SPEC_LEVEL:
            document[key] = value
        else:
            document["queries"][0][key] = value
    compile_sql_queries(document, {}, "docs/spec.md", "")
    Spec.model_validate(document)


def test_the_example_spec_is_a_shipped_one() -> None:
    """The full example is specs/restaurants_public.yaml, so it runs as shown."""
    assert load(full_example()) == load((ROOT / "specs" / "restaurants_public.yaml").read_text())

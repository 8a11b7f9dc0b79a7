"""Import boundaries of the `dprun` package, checked by reading its source with `ast`.

Two rules:
1. No module uses another module's private name (`from dprun.x import _y`, or `x._y` on an
   imported dprun module): a helper two modules share is a public name of a shared module.
2. Layers: a module imports only from its own layer or the layers below it. The math
   (mechanisms) never reaches up to the engines, the planner, the API or the CLI, and
   no engine imports the CLI. Imports under `if TYPE_CHECKING:` count too: a type from a
   higher layer is a sign the code is in the wrong place.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dprun"

# Lowest first. A module belongs to the first layer with a prefix of its name (a package
# prefix covers its modules); "dprun" itself is the package's __init__ (its version).
LAYERS: list[tuple[str, ...]] = [
    ("dprun", "dprun.errors", "dprun.malloc_tuning"),
    ("dprun.mechanisms", "dprun.spec", "dprun.ledger", "dprun.publish", "dprun.verify"),
    ("dprun.plan", "dprun.quantile_choice", "dprun.planner", "dprun.scaffold", "dprun.scaffold_columns"),
    ("dprun.postprocess", "dprun.report", "dprun.render", "dprun.card", "dprun.card_helper"),
    ("dprun.engines",),
    ("dprun.api",),
    ("dprun.cli",),
    ("dprun.launcher", "dprun.__main__"),
]


@dataclass(frozen=True)
class Use:
    module: str  # the importing module
    line: int
    target: str  # the dprun module used
    name: str | None  # the name taken from it, if any


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[1]


def uses(path: Path) -> Iterator[Use]:
    module = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases: dict[str, str] = {}  # a local name bound to a dprun module
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("dprun"):
                    aliases[alias.asname or alias.name.split(".")[0]] = alias.name
                    yield Use(module, node.lineno, alias.name, None)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dprun") and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if (PACKAGE.parent / Path(*submodule.split("."))).with_suffix(".py").exists() or \
                        (PACKAGE.parent / Path(*submodule.split("."))).is_dir():
                    aliases[alias.asname or alias.name] = submodule
                    yield Use(module, node.lineno, submodule, None)
                else:
                    yield Use(module, node.lineno, node.module, alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield Use(module, node.lineno, aliases[node.value.id], node.attr)


def all_uses() -> list[Use]:
    return [use for path in sorted(PACKAGE.rglob("*.py")) for use in uses(path)]


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_module_uses_another_module_s_private_names() -> None:
    found = [f"dprun/{u.module.replace('.', '/')}: line {u.line} uses {u.target}.{u.name}"
             for u in all_uses() if u.name is not None and is_private(u.name) and u.target != u.module]
    assert not found, "private names used across modules (make them public in a shared module):\n" + "\n".join(found)


def test_no_module_imports_from_a_higher_layer() -> None:
    found = [f"{u.module} (layer {layer_of(u.module)}) imports {u.target} (layer {layer_of(u.target)}), line {u.line}"
             for u in all_uses() if layer_of(u.target) > layer_of(u.module)]
    assert not found, "imports against the layers (tests/test_boundaries.py, LAYERS):\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "rule"), [
    ("from dprun.engines.polars_engine import _public_keys\n", "private"),
    ("from dprun.engines import polars_engine\npolars_engine._shape(None)\n", "private"),
    ("from dprun.engines import polars_engine\n", "layer"),
    ("import dprun.cli\n", "layer"),
])
def test_the_checks_catch_a_violation(source: str, rule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mechanisms module with a bad import is caught (so that the checks above can fail)."""
    offender = PACKAGE / "mechanisms" / "offender.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == offender else
                        Path.read_bytes(self).decode())
    found = list(uses(offender))
    if rule == "private":
        assert any(u.name is not None and is_private(u.name) for u in found), found
    else:
        assert any(layer_of(u.target) > layer_of(u.module) for u in found), found


# The CLI shows what the API computes: besides the API it only formats (render) and maps errors.
CLI_IMPORTS = {"dprun.api", "dprun.errors", "dprun.render"}


def test_the_cli_goes_through_the_api() -> None:
    found = {u.target for u in uses(PACKAGE / "cli.py")}
    assert found <= CLI_IMPORTS, f"dprun/cli.py imports {sorted(found - CLI_IMPORTS)}: go through dprun.api"


def test_the_api_s_public_face_exists() -> None:
    from dprun import api

    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert not missing, f"api.__all__ names what api does not have: {missing}"
    assert {"RunResult", "ValidatedSpec", "Plan", "Status", "Verified", "run", "validate"} <= set(api.__all__)


def test_the_cli_names_the_ledger_variable_the_ledger_reads() -> None:
    from dprun import cli
    from dprun.ledger import location

    assert cli.LEDGER_VARIABLE == location.ENVIRONMENT_VARIABLE

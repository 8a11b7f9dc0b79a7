"""The `dprun` command line: its commands, `python -m dprun`, and the example specs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dprun import cli as dprun_cli
from dprun.errors import Interrupted
from dprun_testing import invoke

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "specs").glob("*.yaml"))
COMMANDS = ("validate", "explain-budget", "run", "schema")


def test_help_lists_the_commands() -> None:
    result = CliRunner().invoke(dprun_cli.cli, ["--help"])
    assert result.exit_code == 0, result.output
    for command in COMMANDS:
        assert command in result.stdout, f"`dprun --help` does not list `{command}`"
    assert set(COMMANDS) <= set(dprun_cli.cli.commands)


def test_main_help_exits_0() -> None:
    result = invoke("--help")
    assert result.exit_code == 0, result.output
    assert "validate" in result.stdout


def test_python_dash_m_dprun() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "dprun", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    for command in COMMANDS:
        assert command in completed.stdout
    assert "Traceback" not in completed.stderr


def test_there_are_seven_examples() -> None:
    assert [p.name for p in EXAMPLES] == [
        "restaurants_by_cuisine.yaml", "restaurants_multi.yaml", "restaurants_private.yaml",
        "restaurants_public.yaml", "restaurants_spend_quantiles.yaml", "restaurants_sql.yaml",
        "visits_by_home_city.yaml",
    ]


@pytest.mark.parametrize("spec", EXAMPLES, ids=lambda p: p.stem)
def test_examples_validate(spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = invoke("validate", f"specs/{spec.name}")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"specs/{spec.name}: ok"
    assert result.stderr == ""


def test_unknown_command_is_a_usage_error() -> None:
    result = invoke("frobnicate")
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_after_the_first_signal_later_ones_are_ignored_so_cleanup_completes() -> None:
    """A second SIGTERM (CI cancellations send several) must not interrupt the cleanup the first began."""
    handler = dprun_cli._Interruption()
    with pytest.raises(dprun_cli.Stop) as stopped:
        handler(signal.SIGTERM, None)
    assert isinstance(stopped.value.as_error(), Interrupted)
    assert stopped.value.as_error().message == "interrupted by SIGTERM; nothing was published"
    handler(signal.SIGTERM, None)
    handler(signal.SIGINT, None)


def test_a_signal_lost_where_it_landed_is_raised_at_the_next_checkpoint_and_reported_as_the_signal() -> None:
    """An import lock's callback drops the handler's exception (Python calls it unraisable),
    Polars turns it into a SchemaError or a PanicException: the signal must still end the run."""
    handler = dprun_cli._Interruption()
    try:
        handler(signal.SIGTERM, None)
    except BaseException:  # noqa: BLE001 - what Python's import machinery does with it
        pass
    with pytest.raises(dprun_cli.Stop):
        handler.checkpoint()
    reported = handler.reported(ValueError("what Polars made of it"))
    assert isinstance(reported, Interrupted) and reported.message == "interrupted by SIGTERM; nothing was published"
    handler.publish()
    handler.checkpoint()  # once published, the release stands: nothing to stop
    assert isinstance(handler.reported(ValueError("x")), ValueError)


def test_a_signal_cannot_be_swallowed_by_code_that_catches_exception() -> None:
    """Lazily imported libraries run while the handler is live; their `except Exception` must not
    eat the stop (a run once finished with exit 0 after a SIGTERM that way)."""
    handler = dprun_cli._Interruption()
    with pytest.raises(dprun_cli.Stop):
        try:
            handler(signal.SIGINT, None)
        except Exception:  # noqa: BLE001 - what a library might do
            pass


# What each command may import (docs/ci.md, "Start-up time"): checked in a fresh interpreter.
IMPORT_PROBE = """
import sys
from dprun.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(" ".join(sorted(sys.modules)), file=sys.__stdout__)
"""


@pytest.mark.parametrize(("arguments", "absent"), [
    (["--help"], ("polars", "numpy", "pydantic", "rich", "scipy", "dprun.spec", "dprun.api")),
    (["validate", "specs/restaurants_public.yaml"], ("numpy", "scipy", "dp_accounting", "pyarrow",
                                                     "dprun.engines", "dprun.planner")),
    (["explain-budget", "specs/restaurants_public.yaml"], ("scipy", "dp_accounting", "pyarrow", "dprun.engines")),
])
def test_commands_that_read_no_data_import_no_more_than_they_need(arguments: list[str], absent: tuple[str, ...]) -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_PROBE, *arguments], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    modules = set(done.stdout.splitlines()[-1].split())
    assert "dprun.cli" in modules, done.stdout + done.stderr
    loaded = sorted(name for name in absent if name in modules)
    assert not loaded, f"dprun {' '.join(arguments)} imported {loaded}"

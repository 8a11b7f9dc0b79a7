"""The `dprun` command line. Errors become messages and exit codes here, and only here."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
from rich.console import Console

from dprun import api
from dprun.errors import DprunError, ExitCode, Interrupted
from dprun.render import explanation_markdown, print_explanation, print_summary
from dprun.report import explain
from dprun.spec.models import Spec

FORMATS = click.Choice(["text", "json"])
spec_argument = click.argument("spec", type=click.Path(path_type=Path, dir_okay=False))


def _console() -> Console:
    return Console(soft_wrap=True, highlight=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dprun")
def cli() -> None:
    """Publish statistics with user-level differential privacy from a declarative spec.

    Exit codes: 0 ok, 1 spec or input check failed, 2 usage or internal error,
    3 data could not be processed, 4 budget refused, 5 already released,
    6 output could not be written, 130 interrupted.
    """


@cli.command()
@spec_argument
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
def validate(spec: Path, fmt: str) -> None:
    """Check the spec and the input schemas, without reading data rows."""
    api.validate(spec)
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "problems": []}))
    else:
        click.echo(f"{spec}: ok")


@cli.command("explain-budget")
@spec_argument
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]), default="text", show_default=True)
def explain_budget(spec: Path, fmt: str) -> None:
    """Show how the budget is spent and how accurate each number will be; reads no data rows."""
    explanation = explain(api.plan(api.validate(spec)))
    if fmt == "json":
        click.echo(json.dumps(explanation, indent=2))
    elif fmt == "markdown":
        click.echo(explanation_markdown(explanation), nl=False)
    else:
        print_explanation(explanation, _console())


@cli.command()
@spec_argument
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--seed", type=int, default=None,
              help="TESTS ONLY: deterministic noise. The release is then NOT private and the report says so.")
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
def run(spec: Path, overwrite: bool, seed: int | None, fmt: str) -> None:
    """Execute the spec and publish the DP outputs and the report (all or nothing)."""
    console = _console()
    plain = fmt == "json" or not sys.stdout.isatty() or bool(os.environ.get("CI"))

    def progress(message: str) -> None:
        if fmt != "json":
            console.print(message) if plain else console.log(message)

    if plain:
        result = api.run(spec, seed=seed, overwrite=overwrite, progress=progress)
    else:
        with console.status("running the plan"):
            result = api.run(spec, seed=seed, overwrite=overwrite, progress=progress)
    if fmt == "json":
        click.echo(json.dumps(_summary(result.report, result.report_path), indent=2))
    else:
        print_summary(result.report, console)
        console.print(f"report: {result.report_path}")


def _summary(report: dict[str, Any], report_path: Path) -> dict[str, Any]:
    return {
        "ok": True,
        "report": str(report_path),
        "total": report["total"],
        "non_private_test_seed": report["non_private_test_seed"],
        "queries": [
            {"name": q["name"], "partitions_released": q["partitions_released"], "output": q["output"]}
            for q in report["queries"]
        ],
    }


@cli.command()
def schema() -> None:
    """Print the spec's JSON Schema."""
    click.echo(json.dumps(spec_json_schema(), indent=2))


def spec_json_schema() -> dict[str, Any]:
    document = Spec.model_json_schema()
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "dprun spec, version 1"
    return document


def _raise_interrupted(signum: int, frame: FrameType | None) -> NoReturn:
    raise Interrupted(f"interrupted by {signal.Signals(signum).name}; nothing was published")


def _wants_json(args: list[str]) -> bool:
    return any(a == "--format=json" or (a == "json" and i > 0 and args[i - 1] == "--format")
               for i, a in enumerate(args))


def _report_error(error: DprunError, as_json: bool) -> None:
    if as_json:
        problems = [p.as_dict() for p in error.problems()]
        click.echo(json.dumps({"ok": False, "exit_code": int(error.exit_code), "problems": problems}, indent=2))
    else:
        for problem in error.problems():
            click.echo(f"error: {problem}".replace("error: : ", "error: "), err=True)


def main(args: list[str] | None = None) -> NoReturn:
    """Entry point: run the CLI and turn every failure into a message and an exit code."""
    arguments = list(sys.argv[1:] if args is None else args)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    signal.signal(signal.SIGINT, _raise_interrupted)
    as_json = _wants_json(arguments)
    try:
        cli.main(args=arguments, prog_name="dprun", standalone_mode=False)
    except DprunError as error:
        _report_error(error, as_json)
        sys.exit(int(error.exit_code))
    except click.exceptions.Abort:
        click.echo("error: interrupted; nothing was published", err=True)
        sys.exit(int(ExitCode.INTERRUPTED))
    except click.ClickException as error:
        error.show()
        sys.exit(int(ExitCode.USAGE_OR_INTERNAL))
    except BaseException as error:  # noqa: BLE001 - last line of defence, incl. Rust panics from Polars
        if isinstance(error, (SystemExit, GeneratorExit)) or os.environ.get("DPRUN_DEBUG"):
            raise
        click.echo(
            f"error: internal error ({type(error).__name__}); please report it. "
            "Set DPRUN_DEBUG=1 to see the traceback (it may contain data values).",
            err=True,
        )
        sys.exit(int(ExitCode.USAGE_OR_INTERNAL))
    sys.exit(int(ExitCode.OK))

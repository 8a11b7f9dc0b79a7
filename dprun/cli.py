"""The `dprun` command line. Errors become messages and exit codes here, and only here."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import click

from dprun.errors import DprunError, ExitCode, Interrupted, OutputError

if TYPE_CHECKING:
    from rich.console import Console

    from dprun import api
    from dprun.api import Status

# Each command imports what it needs (Polars, pydantic, numpy, rich): `dprun --help` loads
# none of them, `validate` no numpy (docs/ci.md, "Start-up time").

FORMATS = click.Choice(["text", "json"])
spec_argument = click.argument("spec", type=click.Path(path_type=Path, dir_okay=False))
# The name `dprun.ledger.location` reads; written out here so that `--help` imports nothing more
# (tests/test_boundaries.py checks the two agree).
LEDGER_VARIABLE = "DPRUN_LEDGER"
LEDGER_HELP = ("Release ledger: a file (SQLite) or a postgresql:// URL; overrides "
               f"${LEDGER_VARIABLE} and the spec's `ledger:`.")
def _given_ledger(context: click.Context, parameter: click.Parameter, value: str | None) -> str | None:
    """An empty --ledger is an unset variable in a script, never a wish to publish unrecorded."""
    if value is not None and not value.strip():
        raise click.BadParameter("is empty: give a ledger file or URL, or leave the option out", context, parameter)
    return value


ledger_option = click.option("--ledger", "ledger", default=None, help=LEDGER_HELP, callback=_given_ledger)
STEP_SUMMARY = "GITHUB_STEP_SUMMARY"


# Without a terminal (a CI log, a pipe) no width needs fitting: tables take the width of their
# content, so that paths and names are never cut.
WIDTH_WITHOUT_A_TERMINAL = 10_000


def engine_options(what: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """--engine and the Spark options of a command that reads data (`what`: where what happens)."""
    options = [
        click.option("--engine", type=click.Choice(["polars", "spark"]), default="polars", show_default=True,
                     help=f"Where {what}: Polars on this machine, or Spark (docs/scale.md)."),
        click.option("--spark-master", default=None, help="Spark master URL for --engine spark  [default: local[*]]"),
        click.option("--spark-remote", default=None, help="Spark Connect URL (sc://host:15002) for --engine spark."),
        click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE",
                     help="Spark configuration for --engine spark; repeatable."),
    ]

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _console() -> Console:
    from rich.console import Console

    console = Console(soft_wrap=True, highlight=False)
    if console.is_terminal:
        return console
    return Console(soft_wrap=True, highlight=False, width=WIDTH_WITHOUT_A_TERMINAL)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dprun")
def cli() -> None:
    """Publish statistics with user-level differential privacy from a declarative spec.

    Exit codes: 0 ok, 1 spec or input check failed, 2 usage or internal error,
    3 data could not be processed, 4 lifetime budget refused, 5 already released,
    6 output or ledger could not be written (or the ledger is corrupt), 7 verify found
    outputs that are not the report's release, 130 interrupted.
    """


@cli.command()
@spec_argument
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@engine_options("inputs named by a URL are listed and their schemas read")
def validate(spec: Path, fmt: str, engine: str, spark_master: str | None, spark_remote: str | None,
             spark_conf: tuple[str, ...]) -> None:
    """Check the spec and the input schemas, without reading data rows."""
    from dprun import api

    api.validate(spec, engine, _spark_options(engine, spark_master, spark_remote, spark_conf))
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "problems": []}))
    else:
        click.echo(f"{spec}: ok")


@cli.command("explain-budget")
@spec_argument
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown", "html"]), default="text", show_default=True)
@ledger_option
@engine_options("inputs named by a URL are listed and their schemas read")
def explain_budget(spec: Path, fmt: str, ledger: str | None, engine: str, spark_master: str | None,
                   spark_remote: str | None, spark_conf: tuple[str, ...]) -> None:
    """Show how the budget is spent and how accurate each number will be; reads no data rows.

    With a ledger, also what the spec's dataset has spent so far and what remains.
    `--format html` prints the release card (report.html) without released values.
    """
    from dprun import api
    from dprun.render import explanation_markdown, ledger_status_lines, print_explanation

    validated = api.validate(spec, engine, _spark_options(engine, spark_master, spark_remote, spark_conf))
    if fmt == "html":
        click.echo(api.explain_card(validated), nl=False)
        return
    explanation = api.explain(validated)
    status = api.ledger_status(validated, ledger)
    explanation["ledger"] = None if status is None else status.as_dict()
    lines = ledger_status_lines(status, validated.spec.budget.lifetime is not None)
    if fmt == "json":
        click.echo(json.dumps(explanation, indent=2))
    elif fmt == "markdown":
        click.echo(explanation_markdown(explanation), nl=False)
        click.echo("\n## Ledger\n\n" + "".join(f"- {line}\n" for line in lines), nl=False)
    else:
        console = _console()
        print_explanation(explanation, console)
        for line in lines:
            console.print(line, markup=False)


@cli.command()
@spec_argument
@click.option("--overwrite", is_flag=True, help="Replace existing outputs.")
@click.option("--seed", type=int, default=None,
              help="TESTS ONLY: deterministic noise. The release is then NOT private and the report says so.")
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@ledger_option
@click.option("--new-release", is_flag=True,
              help="Release again although the ledger holds this spec on this data: spends the budget again.")
@engine_options("the plan runs")
def run(spec: Path, overwrite: bool, seed: int | None, fmt: str, ledger: str | None, new_release: bool,
        engine: str, spark_master: str | None, spark_remote: str | None, spark_conf: tuple[str, ...]) -> None:
    """Execute the spec and publish the DP outputs and the report (all or nothing).

    With a ledger, a re-run of the same spec on the same data is refused (exit 5) and a
    spend past the lifetime budget is refused (exit 4), before any data row is read.
    """
    from dprun import api
    from dprun.render import explanation_markdown, print_summary

    spark_options = _spark_options(engine, spark_master, spark_remote, spark_conf)
    console = _console()
    plain = fmt == "json" or not sys.stdout.isatty() or bool(os.environ.get("CI"))

    def progress(message: str) -> None:
        if fmt != "json":
            console.print(message, markup=False) if plain else console.log(message, markup=False)

    try:
        if plain:
            result = api.run(spec, seed=seed, overwrite=overwrite, progress=progress, ledger=ledger,
                             new_release=new_release, engine=engine, spark_options=spark_options,
                             on_published=_interruption.publish, checkpoint=_interruption.checkpoint)
        else:
            with console.status("running the plan"):
                result = api.run(spec, seed=seed, overwrite=overwrite, progress=progress, ledger=ledger,
                                 new_release=new_release, engine=engine, spark_options=spark_options,
                                 on_published=_interruption.publish, checkpoint=_interruption.checkpoint)
    except (DprunError, Stop) as raised:
        error = _interruption.reported(raised)
        assert isinstance(error, DprunError)  # a DprunError or a Stop is reported as a DprunError
        _step_summary(f"## dprun run {spec}: not released (exit {int(error.exit_code)})\n\n"
                      + "".join(f"> {problem}\n" for problem in error.problems()) + "\n")
        raise
    ledger_line = _ledger_line(result.ledger_status)
    if fmt == "json":
        click.echo(json.dumps(_summary(result.report, result.report_path, result), indent=2))
    else:
        print_summary(result.report, console)
        console.print(f"report: {result.report_path}", markup=False)
        console.print(ledger_line, markup=False)
    _step_summary(explanation_markdown(result.report, "DP release") + f"\n{ledger_line}\n\n")


@cli.command()
@spec_argument
@click.option("--epsilon", type=click.FloatRange(min=0, min_open=True), required=True,
              help="The ε the profile spends (δ = 0), split evenly over the spec's queries.")
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
@ledger_option
@click.option("--new-release", is_flag=True,
              help="Profile again although the ledger holds this profile on this data: spends ε again.")
@click.option("--seed", type=int, default=None, help="TESTS ONLY: deterministic noise; the profile is NOT private.")
@engine_options("the histograms are computed")
def profile(spec: Path, epsilon: float, fmt: str, ledger: str | None, new_release: bool, seed: int | None,
            engine: str, spark_master: str | None, spark_remote: str | None, spark_conf: tuple[str, ...]) -> None:
    """A DP profile of how the privacy units contribute, per query, and the bounds `auto` would choose.

    Spends --epsilon of the data's budget (recorded in the ledger, if one is configured),
    for users who set contribution bounds by hand (docs/spec.md, "auto bounds").
    """
    from dprun import api
    from dprun.render import print_profile

    console = _console()

    def progress(message: str) -> None:
        if fmt != "json":
            console.print(message, markup=False)

    found = api.profile(spec, epsilon, seed=seed, progress=progress, ledger=ledger, new_release=new_release,
                        engine=engine, spark_options=_spark_options(engine, spark_master, spark_remote, spark_conf))
    if fmt == "json":
        click.echo(json.dumps(found, indent=2))
    else:
        print_profile(found, console)


def _spark_options(engine: str, master: str | None, remote: str | None,
                   conf: tuple[str, ...]) -> dict[str, Any] | None:
    if engine != "spark":
        if master is not None or remote is not None or conf:
            raise click.UsageError("--spark-master, --spark-remote and --conf need --engine spark")
        return None
    if master is not None and remote is not None:
        raise click.UsageError("give --spark-master or --spark-remote, not both")
    for item in conf:
        if "=" not in item or not item.partition("=")[0].strip():
            raise click.UsageError(f"--conf takes KEY=VALUE, got '{item}'")
    return {"master": master, "remote": remote, "conf": list(conf)}


# Said once per run, in its summary.
NO_LEDGER = "ledger: none configured; this release was not recorded, and a re-run would not be refused"


def _ledger_line(status: Status | None) -> str:
    if status is None:
        return NO_LEDGER
    line = f"ledger: recorded in {status.ledger}; dataset spent {status.spent} in {status.releases} release(s)"
    if status.remaining is not None:
        line += f"; remaining {status.remaining}"
    return line


def _step_summary(markdown: str) -> None:
    """Append to the GitHub Actions job summary when $GITHUB_STEP_SUMMARY is set; never fails the run."""
    target = os.environ.get(STEP_SUMMARY)
    if not target:
        return
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(markdown)
    except OSError as exc:
        click.echo(f"warning: cannot append to ${STEP_SUMMARY} ({exc.strerror})", err=True)


def _summary(report: dict[str, Any], report_path: Path, result: api.RunResult | None = None) -> dict[str, Any]:
    from dprun.render import auto_bounds_warnings

    # The report holds paths relative to the spec's folder; the command's own output shows them whole.
    paths = {q["name"]: q["output"] for q in report["queries"]} if result is None else {
        q.name: q.output_path for q in result.plan.queries}
    status = None if result is None else result.ledger_status
    entry = None if result is None else result.ledger_entry
    return {
        "ok": True,
        "report": str(report_path),
        "release_id": report["release_id"],
        "total": report["total"],
        "non_private_test_seed": report["non_private_test_seed"],
        "queries": [
            {"name": q["name"], "partitions_released": q["partitions_released"], "output": str(paths[q["name"]]),
             "sha256": q["output_sha256"], "warnings": auto_bounds_warnings(q)}
            for q in report["queries"]
        ],
        "ledger": None if status is None or entry is None else {
            "path": status.ledger,
            "release": entry["release"],
            "dataset": status.release.dataset,
            "spent": status.spent.as_dict(),
            "releases": status.releases,
            "lifetime": None if status.release.lifetime is None else status.release.lifetime.as_dict(),
            "remaining": None if status.remaining is None else status.remaining.as_dict(),
        },
    }


@cli.command()
@click.argument("report", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
def verify(report: Path, fmt: str) -> None:
    """Check that the files at a release's output paths are the ones REPORT names.

    Exit 0 if every output exists with the report's sha256; exit 7 naming each output
    that does not.
    """
    from dprun import api

    verified = api.verify(report)
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "release_id": verified.release_id,
                               "outputs": [str(p) for p in verified.outputs]}, indent=2))
    else:
        click.echo(f"{report}: release {verified.release_id}: {len(verified.outputs)} output(s) match")


@cli.group()
def ledger() -> None:
    """Inspect, move and mend the release ledger (docs/ledger.md)."""


ledger_argument = click.argument("where", metavar="[LEDGER]", required=False)
spec_ledger_option = click.option("--spec", "spec", type=click.Path(path_type=Path, dir_okay=False), default=None,
                                  help="Use the ledger this spec names (its `ledger:`).")


def _which_ledger(where: str | None, spec: Path | None) -> api.Location:
    """LEDGER, else $DPRUN_LEDGER, else the ledger --spec names."""
    from dprun import api

    location = api.find_ledger(where, spec)
    if location is None:
        raise click.UsageError(f"which ledger? give LEDGER, set ${LEDGER_VARIABLE}, or --spec SPEC")
    return location


def _existing_ledger(where: str | None, spec: Path | None) -> api.Location:
    location = _which_ledger(where, spec)
    # lexists: a symbolic link loop is there, and the ledger's own check says what it is.
    if isinstance(location, Path) and not os.path.lexists(location):
        raise OutputError(f"no ledger at {location}")
    return location


@ledger.command("show")
@ledger_argument
@spec_ledger_option
@click.option("--dataset", default=None, help="Only the releases of this dataset id.")
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
def ledger_show(where: str | None, spec: Path | None, dataset: str | None, fmt: str) -> None:
    """List the releases in a ledger: LEDGER, else $DPRUN_LEDGER, else the one --spec names.

    A pending release is one whose run reserved its spend and has not finished, or died:
    it counts as spent.
    """
    from dprun import api
    from dprun.render import short_dataset

    location = _existing_ledger(where, spec)
    shown = api.ledger_name(location)
    entries = [e for e in api.read_ledger(location) if dataset is None or e["dataset"] == dataset]
    totals = api.ledger_totals(entries)
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "ledger": shown, "releases": entries, "datasets": totals}, indent=2))
        return
    lines = [f"ledger {shown}: {len(entries)} release(s)"]
    for entry in entries:
        flags = "" if entry["state"] == "published" else f" [{entry['state'].upper()}]"
        flags += " [new release]" if entry.get("new_release") else ""
        flags += " [TEST SEED, not private]" if entry.get("non_private_test_seed") else ""
        spec_name = entry.get("spec") or Path(str(entry.get("spec_path", "?"))).name
        lines += [
            f"#{entry['release']}  {entry['time']}  spec {spec_name} ({entry['spec_sha256'][:12]})  "
            f"ε={entry['epsilon']} δ={entry['delta']} ({entry['accounting']}){flags}",
            f"    dataset {short_dataset(entry['dataset'])}",
            *[f"    output  {o['path']}" for o in entry["outputs"]],
            f"    report  {(entry.get('report') or {}).get('path', '?')}",
        ]
    for key, total in totals.items():
        spent = total["spent"]
        pending = f" ({total['pending']} pending)" if total["pending"] else ""
        lines.append(f"dataset {short_dataset(key)}: {total['releases']} release(s){pending}, "
                     f"spent ε={spent['epsilon']}, δ={spent['delta']}")
    click.echo("\n".join(lines))


@ledger.command("import")
@click.argument("jsonl", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@ledger_argument
@spec_ledger_option
def ledger_import(jsonl: Path, where: str | None, spec: Path | None) -> None:
    """Move the releases of a JSON-lines ledger (JSONL) into a new, empty ledger, exactly.

    JSONL is a ledger file written by an earlier dprun, or the output of `ledger export`.
    The ledger is LEDGER, else $DPRUN_LEDGER, else the one --spec names.
    """
    from dprun import api

    location = _which_ledger(where, spec)
    count = api.import_ledger(jsonl, location)
    click.echo(f"imported {count} release(s) from {jsonl} into {api.ledger_name(location)}")


@ledger.command("export")
@ledger_argument
@spec_ledger_option
@click.option("-o", "--output", "output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the JSON lines here (replaced whole, never half-written); default: print them.")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
def ledger_export(where: str | None, spec: Path | None, output: Path | None, force: bool) -> None:
    """Write every release of a ledger as JSON lines, exact, for audit or `ledger import`."""
    from dprun import api

    text = api.export_ledger(_existing_ledger(where, spec), output, force)
    if output is None:
        click.echo(text, nl=False)


@ledger.command("abandon")
@click.argument("release", type=click.IntRange(1, 2**63 - 1))
@ledger_argument
@spec_ledger_option
@click.option("--confirm-not-published", is_flag=True,
              help="Required: you checked that the run holding this reservation died and published nothing.")
@click.option("--format", "fmt", type=FORMATS, default="text", show_default=True)
def ledger_abandon(release: int, where: str | None, spec: Path | None, confirm_not_published: bool,
                   fmt: str) -> None:
    """Stop counting the spend of pending RELEASE, whose run died before publishing.

    A pending release counts as spent because its run may have published, or drawn noise
    someone saw, before it died. Abandon it only once you know that its outputs never
    left the machine it ran on (docs/ledger.md). Refused without --confirm-not-published,
    and when the release's report on this machine names it.
    """
    from dprun import api

    if not confirm_not_published:
        raise click.UsageError("abandoning a release frees its budget: pass --confirm-not-published once you know "
                               "its run died and none of its outputs was published")
    location = _existing_ledger(where, spec)
    entry = api.abandon_release(release, location)
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "ledger": api.ledger_name(location), "release": entry["release"],
                               "state": entry["state"], "epsilon": entry["epsilon"], "delta": entry["delta"]},
                              indent=2))
        return
    click.echo(f"release {entry['release']} abandoned in {api.ledger_name(location)}: its spend "
               f"(ε={entry['epsilon']}, δ={entry['delta']}) no longer counts")


@cli.command()
@click.argument("datafile", type=click.Path(path_type=Path, dir_okay=False))
@click.option("-o", "--output", "output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write the spec here (paths in it become relative to it); default: print it.")
@click.option("--format", "fmt", type=click.Choice(["csv", "parquet", "ndjson"]), default=None,
              help="The data file's format, if its suffix does not tell.")
@click.option("--force", is_flag=True, help="Replace an existing output file.")
@click.option("--sql", "sql", is_flag=True, help="Write the query as a SQL SELECT statement.")
def init(datafile: Path, output: Path | None, fmt: str | None, force: bool, sql: bool) -> None:
    """Scaffold a commented spec from DATAFILE's column names and types (never its values).

    The privacy unit is left as a FILL_IN placeholder to fill from domain knowledge (the
    spec fails validation until it is filled); bounds are `auto`; a CSV file's column types
    and missing-value tokens are proposed from its first rows, for you to check.
    """
    from dprun import api

    if output is None:
        click.echo(api.scaffold(datafile, None, fmt, sql), nl=False)
        return
    text = api.write_scaffold(datafile, output, fmt, force, sql)
    count = api.scaffold_placeholders(text)
    click.echo(f"wrote {output}: fill its {count} FILL_IN placeholder(s) (the privacy unit), check the "
               f"proposed column types, then run `dprun validate {output}`", err=True)


@cli.command()
def schema() -> None:
    """Print the spec's JSON Schema."""
    from dprun import api

    click.echo(json.dumps(api.spec_json_schema(), indent=2))


class Stop(BaseException):  # noqa: N818 - named for what it does, like KeyboardInterrupt
    """What the signal handler raises: a BaseException, as KeyboardInterrupt is, so that no
    `except Exception` in a library being imported or run at that instant can swallow it;
    it becomes `Interrupted` (exit 130) where the CLI reports it."""

    def as_error(self) -> Interrupted:
        return Interrupted(f"interrupted by {self.args[0]}; nothing was published")


class _Interruption:
    """The CLI's SIGINT/SIGTERM handler: stop the command, unless its outcome is already settled.

    Once `dprun run` has put every output in place and recorded it, once the command's
    error is being reported, or once a first signal is stopping it, stopping again would
    claim that nothing was published, cut the message short, or leave scratch files
    behind, so a signal is then ignored.

    The handler raises `Stop` wherever the main thread is, and some places cannot pass it
    on: an import lock's callback drops it, Polars turns it into its own error. So the
    signal is also recorded: `checkpoint` raises it again at safe points (before each query
    and before publication), and `main` reports any failure after a signal as the signal.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.settled = False
        self.published = False
        self.received: str | None = None

    def publish(self) -> None:
        self.published = self.settled = True

    def checkpoint(self) -> None:
        if self.received is not None and not self.published:
            raise Stop(self.received)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signal.Signals(signum).name
        if not self.settled:
            # Settled by the first signal: a second one (CI cancels often send several) must
            # not cut short the removal of the scratch files the first one started.
            self.settled = True
            raise Stop(self.received)

    def reported(self, error: BaseException) -> BaseException:
        """The error to report: after a signal, and before publication, the signal whatever was raised."""
        if self.received is not None and not self.published:
            return Stop(self.received).as_error()
        return error.as_error() if isinstance(error, Stop) else error


_interruption = _Interruption()


def _wants_json(args: list[str]) -> bool:
    return any(a == "--format=json" or (a == "json" and i > 0 and args[i - 1] == "--format")
               for i, a in enumerate(args))


def _report_error(error: DprunError, as_json: bool) -> None:
    if as_json:
        problems = [p.as_dict() for p in error.problems()]
        answer: dict[str, Any] = {"ok": False, "exit_code": int(error.exit_code), "problems": problems}
        details = getattr(error, "details", None)
        if details:
            answer["details"] = details  # e.g. the earlier release, or requested/spent/remaining
        click.echo(json.dumps(answer, indent=2))
    else:
        for problem in error.problems():
            click.echo(f"error: {problem}".replace("error: : ", "error: "), err=True)


def main(args: list[str] | None = None) -> NoReturn:
    """Entry point: run the CLI and turn every failure into a message and an exit code."""
    arguments = list(sys.argv[1:] if args is None else args)
    _interruption.reset()
    _handle_signals(_interruption)
    as_json = _wants_json(arguments)
    unraisable = sys.unraisablehook
    if not os.environ.get("DPRUN_DEBUG"):
        # What Python cannot raise (in a finaliser or a callback) it prints with a traceback
        # that may quote data values; a Stop dropped there is raised again at a checkpoint.
        sys.unraisablehook = lambda _: None
    try:
        cli.main(args=arguments, prog_name="dprun", standalone_mode=False)
        # Python runs signal handlers at calls, never before a plain attribute store: once
        # the command returns or raises, no signal can cut in ahead of this line.
        _interruption.settled = True
        received = _interruption.received
        # A signal that was lost where it landed, in a command that then finished unpublished.
        code = ExitCode.OK if received is None or _interruption.published else \
            _report_failure(Stop(received).as_error(), as_json)
    except BaseException as error:  # noqa: BLE001 - last line of defence, incl. Rust panics from Polars
        _interruption.settled = True
        code = _report_failure(_interruption.reported(error), as_json)
    finally:
        sys.unraisablehook = unraisable
    # Python restores the default handlers as it shuts down; a signal then would kill the
    # process and replace the exit code that was just decided.
    _handle_signals(signal.SIG_IGN)
    sys.exit(int(code))


def _handle_signals(handler: Callable[[int, FrameType | None], None] | signal.Handlers) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def _report_failure(error: BaseException, as_json: bool) -> ExitCode:
    """Print what went wrong and give the exit code for it."""
    if isinstance(error, DprunError):
        _report_error(error, as_json)
        return error.exit_code
    if isinstance(error, click.exceptions.Abort):
        click.echo("error: interrupted; nothing was published", err=True)
        return ExitCode.INTERRUPTED
    if isinstance(error, click.ClickException):
        error.show()
        return ExitCode.USAGE_OR_INTERNAL
    if isinstance(error, (SystemExit, GeneratorExit)) or os.environ.get("DPRUN_DEBUG"):
        raise error
    click.echo(
        f"error: internal error ({type(error).__name__}); please report it. "
        "Set DPRUN_DEBUG=1 to see the traceback (it may contain data values).",
        err=True,
    )
    return ExitCode.USAGE_OR_INTERNAL

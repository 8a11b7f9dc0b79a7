"""The Python API: validate a spec, plan it, run it. The CLI is a thin layer over this.

    from dprun import api
    validated = api.validate("spec.yaml")
    plan = api.plan(validated)
    result = api.run("spec.yaml")          # publishes outputs and the report
    result.tables["visits_per_restaurant"]  # polars DataFrame of the DP release

The release ledger (docs/ledger.md):

    api.run("spec.yaml", ledger="ledger.db")      # refuses a re-release or a spend past the lifetime
    result.ledger_entry                            # this release's entry, marked published
    api.ledger_status(validated)                   # spent / remaining for the spec's dataset, or None
    api.read_ledger("ledger.db")                   # every entry, checked (or a postgresql:// URL)
    api.import_ledger("old.jsonl", "ledger.db")    # a JSON-lines ledger into a new database
    api.export_ledger("ledger.db")                 # every entry as JSON lines
    api.abandon_release(7, "ledger.db")            # a pending release whose run died stops counting
    api.scaffold("data.parquet", "spec.yaml")      # a commented spec from the file's schema
    api.verify("out/report.json")                  # the outputs are the report's release, or NotVerified
    api.profile("spec.yaml", epsilon=0.1)          # a DP profile of the data's contribution shape (spends ε)

Failures raise `dprun.errors.DprunError` subclasses, each with its `exit_code`.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from dprun import card_helper
from dprun import scaffold as scaffold_mod
from dprun.errors import DataError, DprunError, OutputError, Problem, SpecError
from dprun.ledger import entries as ledger_entries
from dprun.ledger import jsonl as ledger_jsonl
from dprun.ledger import location as ledger_location
from dprun.ledger import open_ledger
from dprun.ledger.spend import Spend
from dprun.ledger.store import SqlLedger
from dprun.publish import refuse_existing, staged, store_of, write_whole
from dprun.spec.input_schema import Located
from dprun.spec.models import InputSpec
from dprun.spec.rules import ledger_file_problem, report_files
from dprun.spec.strict_rows import check_rows
from dprun.spec.validation import ValidatedSpec, validate_spec
from dprun.small_files import loads_json, read_small_file
from dprun.verify import MAX_REPORT_BYTES, Verified, sha256_of, verify_release

if TYPE_CHECKING:
    from dprun.engines.spark_engine import SparkInputReader
    from dprun.mechanisms.bound_choice import ChosenBounds, NoisyShape
    from dprun.mechanisms.sampling import RandomSource
    from dprun.plan import Plan, QueryPlan

__all__ = [
    "Location",
    "Plan",
    "RunResult",
    "Status",
    "ValidatedSpec",
    "Verified",
    "abandon_release",
    "explain",
    "explain_card",
    "export_ledger",
    "find_ledger",
    "import_ledger",
    "ledger_name",
    "ledger_status",
    "ledger_totals",
    "plan",
    "profile",
    "read_ledger",
    "run",
    "scaffold",
    "scaffold_placeholders",
    "spec_json_schema",
    "validate",
    "verify",
    "write_scaffold",
]

# Types the API's functions return, under the names the API documents.
Status = ledger_entries.Status
Location = ledger_location.Location

# numpy, the mechanisms and the engines are imported by the calls that need them (plan, run):
# `dprun validate` and `dprun --help` start in a fraction of the time (docs/ci.md).

Progress = Callable[[str], None]
ENGINES = ("polars", "spark")


@dataclass(frozen=True)
class RunResult:
    plan: Plan
    tables: dict[str, pl.DataFrame]
    report: dict[str, Any]
    report_path: Path
    ledger_entry: dict[str, Any] | None = None  # this release's entry, marked published
    ledger_status: ledger_entries.Status | None = None  # the dataset's spend, this release included


def validate(spec_path: str | Path, engine: str = "polars", spark_options: dict[str, Any] | None = None,
             progress: Progress | None = None) -> ValidatedSpec:
    """The spec checked against its inputs' schemas, reading no data row. With `engine="spark"`, an
    input named by a URL (`s3a://`, `hdfs://`, `file://`, …) is listed and its schema read by Spark
    (a session from `spark_options`, started only for such an input); the Polars engine refuses one
    of another scheme than `file:`."""
    if engine not in ENGINES:
        raise DprunError(f"unknown engine '{engine}': use one of {', '.join(ENGINES)}")
    try:
        return validate_spec(Path(spec_path), _SparkInputsOnDemand(spark_options, progress) if engine == "spark"
                             else None)
    except SpecError as error:
        # A scaffold from `dprun init` fails until its FILL_IN placeholders are filled: say so plainly.
        found = scaffold_mod.explain_placeholders(Path(spec_path), error.problems())
        if found == error.problems():
            raise
        raise SpecError(found) from None


class _SparkInputsOnDemand:
    """`SparkInputs` whose Spark session starts at the first input that needs it."""

    def __init__(self, options: dict[str, Any] | None, progress: Progress | None) -> None:
        self.options = options
        self.progress = progress
        self.started: SparkInputReader | None = None

    def _reader(self) -> SparkInputReader:
        if self.started is None:
            from dprun.engines.spark_engine import SparkInputReader

            self.started = SparkInputReader(_spark(self.options, self.progress))
        return self.started

    def locate(self, declared: InputSpec) -> Located | str:
        return self._reader().locate(declared)

    def file_schema(self, located: Located, declared: InputSpec, value_columns: frozenset[str]
                    ) -> dict[str, pl.DataType] | str:
        return self._reader().file_schema(located, declared, value_columns)


def plan(validated: ValidatedSpec) -> Plan:
    from dprun.planner import make_plan

    return make_plan(validated)


def explain(validated: ValidatedSpec) -> dict[str, Any]:
    """What `dprun explain-budget --format json` prints, without its `ledger` key: the plan's
    budget split and accuracy, from the spec and the input schemas alone."""
    from dprun.report import explain as explain_plan

    return explain_plan(plan(validated))


def explain_card(validated: ValidatedSpec) -> str:
    """The release card (`report.html`) of the plan, before any data is read: the budget split,
    the keep curves and each metric's accuracy, without released values."""
    from dprun.card import release_card

    return release_card(plan(validated))


def spec_json_schema() -> dict[str, Any]:
    """The spec language as a JSON Schema (what `dprun schema` prints; docs/dprun.schema.json)."""
    from dprun.spec.models import Spec, SqlQuery

    document = Spec.model_json_schema()
    # A query may also be written in SQL: the document's second form of a query (the loader
    # compiles it into the first before the model sees it).
    sql = SqlQuery.model_json_schema()
    document["$defs"] |= sql.pop("$defs", {}) | {"SqlQuery": sql}
    document["properties"]["queries"]["items"] = {"anyOf": [{"$ref": "#/$defs/Query"}, {"$ref": "#/$defs/SqlQuery"}]}
    document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    document["title"] = "dprun spec, version 1"
    return document


def __getattr__(name: str) -> Any:
    # `Plan` is a documented type of the API; it is imported only when asked for, because the
    # planning modules import numpy, which `dprun validate` does without.
    if name == "Plan":
        from dprun.plan import Plan

        return Plan
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(
    spec_path: str | Path,
    *,
    seed: int | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    ledger: str | Path | None = None,
    new_release: bool = False,
    engine: str = "polars",
    spark_options: dict[str, Any] | None = None,
    on_published: Callable[[], None] | None = None,
    checkpoint: Callable[[], None] | None = None,
) -> RunResult:
    """Execute a spec and publish every output and the report, or nothing.

    `seed` makes the run deterministic for tests; the report then says
    `non_private_test_seed: true` and the release is not private.

    With a ledger (`ledger`, else $DPRUN_LEDGER, else the spec's `ledger:`: a path or a
    postgresql:// URL), the release's spend is checked and reserved in one transaction
    before any data row is read: a re-release of the same spec on the same data raises
    `AlreadyReleased` unless `new_release`; a spend past `budget.lifetime` raises
    `BudgetRefused`. The reservation is marked published once the outputs are committed,
    and abandoned (spending nothing) if the run fails before that.

    `engine="spark"` runs the same plan on Spark (docs/scale.md); `spark_options` holds
    `master` (default local[*]) or `remote` (a Spark Connect sc:// URL) and `conf` (a
    mapping or key=value strings), passed to `dprun.engines.spark_engine.spark_session`.
    Outputs are still written by this process, to local paths.

    `checkpoint` is called before each query and before publication, where it may raise to
    stop the run (the CLI raises there for a signal that arrived earlier and was lost).
    `on_published` is called once every output is in place and the ledger entry marked
    published, while SIGINT and SIGTERM are still held off: from then on the release
    exists, and a caller that stops on a signal must no longer say that nothing was published.
    """
    from dprun.mechanisms.sampling import RandomSource

    validated = validate(spec_path, engine, spark_options, progress)
    the_plan = plan(validated)
    card_helper.draw_ahead(the_plan)
    source = RandomSource.system() if seed is None else RandomSource.from_seed(seed)
    release_id = secrets.token_hex(8)
    reserved = _reserve(validated, ledger, lambda: _release(validated, the_plan), new_release, ledger_entries.Pending(
        release_id, [{"query": q.name, "path": str(q.output_path)} for q in the_plan.queries],
        {"path": str(the_plan.report_path)}, source.is_test_seed))
    try:
        tables, the_plan = _execute(validated, the_plan, overwrite, engine, spark_options, source, progress,
                                    checkpoint, reserved)
        _require_reserved(reserved, the_plan)
        report, recorded = _publish(validated, the_plan, tables, source, release_id, reserved, checkpoint,
                                    on_published)
    except BaseException:
        if reserved is not None and not reserved.published:
            reserved.abandon()
        raise
    entry, after = recorded if recorded is not None else (None, None)
    return RunResult(the_plan, tables, report, the_plan.report_path, entry, after)


def profile(
    spec_path: str | Path,
    epsilon: float,
    *,
    seed: int | None = None,
    progress: Progress | None = None,
    ledger: str | Path | None = None,
    new_release: bool = False,
    engine: str = "polars",
    spark_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A DP profile of the data's contribution shape, per query: the noisy histograms `auto` bounds
    are chosen from (`dprun.mechanisms.bound_choice`), summarised, and the bounds `auto` would choose.

    Spends `epsilon` (δ = 0), split evenly over the queries. With a ledger, the spend is
    checked and recorded like a release's (a profile of the same spec on the same data at the
    same ε is a re-release: refused unless `new_release`); it publishes no file.
    """
    from dprun.mechanisms.bound_choice import profile_summary
    from dprun.mechanisms.sampling import RandomSource
    from dprun.planner import SHARE_SAFETY

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise DprunError(f"the profile's epsilon must be a finite number above 0, not {epsilon}")
    validated = validate(spec_path, engine, spark_options, progress)
    as_auto = _every_bound_auto(validated)
    the_plan = plan(as_auto)
    source = RandomSource.system() if seed is None else RandomSource.from_seed(seed)
    reserved = _reserve(validated, ledger, lambda: _profile_release(validated, epsilon), new_release,
                        ledger_entries.Pending(secrets.token_hex(8), [], {"path": "(profile: standard output)"},
                                               source.is_test_seed, kind="profile"))
    if progress is not None:
        progress(f"profile: spends ε={epsilon:g} (δ=0) of this data, split over {len(the_plan.queries)} "
                 f"quer{'y' if len(the_plan.queries) == 1 else 'ies'}; reading the data")
    share = epsilon / len(the_plan.queries) * SHARE_SAFETY
    for query in the_plan.queries:  # before any row is read, as planning checks a run's
        assert query.bound_choice is not None, "every bound is auto"
        problem = replace(query.bound_choice, epsilon=share).sampler_problem("give the profile a larger --epsilon")
        if problem is not None:
            raise DprunError(f"query {query.name}: {problem}")
    queries = []
    try:
        for name in sorted({n for q in the_plan.queries for n in q.inputs}):
            check_rows(validated.inputs[name])
        spark = _spark(spark_options, progress) if engine == "spark" else None
        for index, query in enumerate(the_plan.queries):
            assert query.bound_choice is not None, "every bound is auto"
            choice = replace(query.bound_choice, epsilon=share)
            query = replace(query, bound_choice=choice)
            with _scratch_folder() as scratch, _query_failures(validated, query, Path(scratch), spark):
                noisy, chosen = _bounds_from_data(as_auto, the_plan, query, index, source, spark, Path(scratch))
            bounds = validated.spec.queries[index].contribution_bounds
            metrics = validated.spec.queries[index].metrics
            queries.append({
                "name": query.name, "epsilon": share, **profile_summary(noisy, chosen, choice, epsilon),
                "auto_would_choose": _would_choose(chosen, epsilon),
                "spec_bounds": {"max_partitions_contributed": bounds.max_partitions_contributed,
                                "max_contributions_per_partition": bounds.max_contributions_per_partition,
                                "value_bounds": {m.name: list(m.bounds) if isinstance(m.bounds, tuple) else m.bounds
                                                 for m in metrics if m.bounds is not None}},
            })
        result: dict[str, Any] = {"spec": validated.spec.name, "epsilon": epsilon, "delta": 0.0,
                                  "non_private_test_seed": source.is_test_seed, "queries": queries}
        if reserved is not None:
            with _signals_deferred():
                reserved.published = True
                entry, after = reserved.book.publish(reserved.release, {**reserved.entry, "published_at": _now()})
            result["ledger"] = {"release": entry["release"], "status": after.as_dict()}
    except BaseException:
        if reserved is not None and not reserved.published:
            reserved.abandon()
        raise
    return result


def _every_bound_auto(validated: ValidatedSpec) -> ValidatedSpec:
    """The spec with every query's contribution and value bounds `auto` (what a profile chooses them from)."""
    from dprun.spec.models import ContributionBounds

    auto = ContributionBounds(max_partitions_contributed="auto", max_contributions_per_partition="auto")
    spec = validated.spec.model_copy(update={"queries": [q.model_copy(update={
        "contribution_bounds": auto,
        "metrics": [m.model_copy(update={"bounds": "auto"}) if m.bounds is not None else m for m in q.metrics],
    }) for q in validated.spec.queries]})
    return replace(validated, loaded=replace(validated.loaded, spec=spec))


def _profile_release(validated: ValidatedSpec, epsilon: float) -> ledger_entries.Release:
    """A profile as the ledger sees it: its own key (not the spec's, whose release it must not block)."""
    import hashlib

    from dprun.report import input_fingerprints

    release = ledger_entries.make_release(validated.loaded, (epsilon, 0.0), "basic",
                                          input_fingerprints(validated.inputs))
    key = hashlib.sha256(f"dprun profile\n{validated.loaded.sha256}\n{epsilon!r}".encode()).hexdigest()
    return replace(release, spec_sha256=key)


def _reserve(validated: ValidatedSpec, ledger: str | Path | None, release_of: Callable[[], ledger_entries.Release],
             new_release: bool, pending: ledger_entries.Pending) -> _Reserved | None:
    """With a ledger (`ledger`, else $DPRUN_LEDGER, else the spec's), check the release and reserve
    its spend as pending, in one transaction, before any data row is read; None without a ledger."""
    location = ledger_location.resolve(validated.loaded, ledger)
    ledger_entries.require_ledger_for_lifetime(validated.loaded, location)
    _require_ledger_apart(validated, location)
    if location is None:
        return None
    book = open_ledger(location)
    release = release_of()
    entry = ledger_entries.pending_entry(release, pending, new_release, _now())
    return _Reserved(book, release, book.reserve(release, entry, new_release))


@dataclass
class _Reserved:
    """A run's reservation in the ledger: the store, the release, its pending entry, and
    whether the outputs were committed (from then on it must never be abandoned)."""

    book: SqlLedger
    release: ledger_entries.Release
    entry: dict[str, Any]
    published: bool = False

    def abandon(self) -> None:
        """Mark the reservation abandoned after a failure that published nothing.

        If the ledger cannot be reached now, the entry stays pending and still counts as
        spent: the safe side. The failure that stopped the run is the one reported.
        """
        try:
            self.book.abandon(self.entry["release"])
        except ledger_entries.LedgerError:
            pass


def _execute(validated: ValidatedSpec, the_plan: Plan, overwrite: bool, engine: str,
             spark_options: dict[str, Any] | None, source: RandomSource, progress: Progress | None,
             checkpoint: Callable[[], None] | None, reserved: _Reserved | None) -> tuple[dict[str, pl.DataFrame], Plan]:
    """Every query's DP table, after the checks that come before any data is processed; and the
    plan with the `auto` bounds chosen."""
    from dprun.engines import polars_engine, spark_engine
    from dprun.postprocess import released_rows
    from dprun.report import input_fingerprints

    targets = [(q.output_path, overwrite or q.overwrite) for q in the_plan.queries]
    refuse_existing([*targets, *((path, True) for path in report_files(the_plan.report_path))])
    read = sorted({name for q in the_plan.queries for name in q.inputs})
    for name in read:
        if progress is not None and validated.inputs[name].format != "parquet":
            progress(f"checking the rows of input {name}")
        check_rows(validated.inputs[name])
    if engine == "spark":
        for name in read:
            spark_engine.refuse_unreadable(validated.inputs[name])
    spark = _spark(spark_options, progress) if engine == "spark" else None
    tables: dict[str, pl.DataFrame] = {}
    # Intermediate files hold private data: a folder only this user can read, always removed.
    with _scratch_folder() as scratch:
        # Every `auto` bound is chosen before any query runs: a choice may change other queries'
        # plans (their δ share, tight accounting's common noise factor).
        for index, query in enumerate(the_plan.queries):
            if query.bound_choice is None:
                continue
            if checkpoint is not None:
                checkpoint()
            if progress is not None:
                progress(f"choosing the contribution bounds of query {query.name}")
            workdir = Path(scratch) / f"profile-{index}"
            workdir.mkdir()
            with _query_failures(validated, query, workdir, spark):
                the_plan = _with_bounds_chosen(validated, the_plan, index, source, spark, workdir)
        for index, query in enumerate(the_plan.queries):
            if checkpoint is not None:
                checkpoint()
            if progress is not None:
                progress(f"running query {query.name}")
            workdir = Path(scratch) / str(index)
            workdir.mkdir()
            with _query_failures(validated, query, workdir, spark):
                info = validated.query_inputs[query.name]
                if spark is not None:
                    released = spark_engine.run_query(query, info, source, spark)
                else:
                    released = polars_engine.run_query(query, info, source, workdir)
                tables[query.name] = released_rows(released, query)
    if reserved is not None and sorted(i["sha256"] for i in input_fingerprints(validated.inputs)) != \
            reserved.release.input_hashes:
        raise DataError("the input files changed while dprun ran; nothing was published or spent")
    return tables, the_plan


@contextmanager
def _query_failures(validated: ValidatedSpec, query: QueryPlan, workdir: Path, spark: Any = None) -> Iterator[None]:
    """A query's failures as dprun errors that name no data value."""
    from dprun.engines.polars_steps import run_failure

    try:
        yield
    except OSError as exc:
        # Reading an input (removed since validation?) or writing scratch files.
        raise run_failure(exc, workdir) from None
    except (DataError, pl.exceptions.PanicException) as exc:
        # Polars or Spark stopped at a value without saying where, or Polars panicked on a corrupt
        # file rather than raising: find the input at fault, then say so. After Spark, the
        # executors find the files at fault and this machine reads those only.
        for name in query.inputs:
            info = validated.inputs[name]
            if spark is None:
                check_rows(info, every_value=True)
            else:
                from dprun.engines import spark_engine

                check_rows(info, every_value=True, paths=spark_engine.files_with_bad_values(info, spark))
        if isinstance(exc, DataError):
            raise
        raise DprunError(
            f"query {query.name}: Polars failed internally (a bug in Polars, not in the spec or the "
            "data); its message may quote data values and is not shown (DPRUN_DEBUG=1 shows it). "
            "Nothing was published") from None


def _would_choose(chosen: ChosenBounds, epsilon: float) -> dict[str, Any]:
    """The bounds a profile at `epsilon` saw well enough to recommend; where it did not, None and the
    profile ε that would."""
    seen = chosen.seen_enough
    would: dict[str, Any] = {
        "max_partitions_contributed": chosen.l0 if seen else None,
        "max_contributions_per_partition": chosen.rows if seen else None,
        "dropped_share_estimate": chosen.dropped_share if seen else None,
        "shortfall": chosen.shortfall,
        "epsilon_needed": None if seen else epsilon * chosen.budget_factor,
        "value_bounds": {v.metric: [v.lower, v.upper] if v.seen_enough else None for v in chosen.values},
    }
    unseen = [v.budget_factor for v in chosen.values if not v.seen_enough]
    if unseen:
        would["value_epsilon_needed"] = epsilon * max(unseen)
    return would


def _with_bounds_chosen(validated: ValidatedSpec, the_plan: Plan, index: int, source: RandomSource,
                        spark: Any, workdir: Path) -> Plan:
    """The plan with query `index`'s `auto` bounds chosen from its data (`dprun.mechanisms.bound_choice`)."""
    from dprun.planner import make_plan

    query = the_plan.queries[index]
    _, chosen = _bounds_from_data(validated, the_plan, query, index, source, spark, workdir)
    so_far = {q.name: q.chosen_bounds for q in the_plan.queries if q.chosen_bounds is not None}
    return make_plan(validated, {**so_far, query.name: chosen})


def _bounds_from_data(validated: ValidatedSpec, the_plan: Plan, query: QueryPlan, index: int, source: RandomSource,
                      spark: Any, workdir: Path) -> tuple[NoisyShape, ChosenBounds]:
    """The noisy histograms of query `index` (planned as `query`, with its `bound_choice`), on the
    engine given, and the bounds chosen from them."""
    from dprun.engines import polars_engine, spark_engine
    from dprun.mechanisms.bound_choice import choose_bounds, choose_value_bounds, noisy_shape
    from dprun.planner import relative_noise

    assert query.bound_choice is not None, "a query with auto bounds"
    info = validated.query_inputs[query.name]
    if spark is not None:
        exact = spark_engine.contribution_profile(query, info, source, spark)
    else:
        exact = polars_engine.contribution_profile(query, info, source, workdir)
    choice = query.bound_choice
    noisy = noisy_shape(exact, choice, source)
    chosen = choose_bounds(exact, noisy, choice, relative_noise(validated, the_plan, index), source)
    return noisy, replace(chosen, values=choose_value_bounds(exact, choice, chosen.units, source))


def _publish(validated: ValidatedSpec, the_plan: Plan, tables: dict[str, pl.DataFrame], source: RandomSource,
             release_id: str, reserved: _Reserved | None, checkpoint: Callable[[], None] | None,
             on_published: Callable[[], None] | None,
             ) -> tuple[dict[str, Any], tuple[dict[str, Any], ledger_entries.Status] | None]:
    """Stage every output and the reports, commit them at once, then mark the reservation published;
    returns the report, and the entry as marked with the dataset's status after it (None without a ledger).
    """
    from dprun.render import explanation_markdown
    from dprun.report import release_report

    _, report_md, report_html = report_files(the_plan.report_path)
    released_on = _now()[:10]
    # Drawn before staging starts (matplotlib takes a while): publication itself stays short.
    card = card_helper.release_card(the_plan, tables, {"release_id": release_id, "released_on": released_on,
                                                       "non_private_test_seed": source.is_test_seed})
    digests: dict[Path, str] = {}
    recorded = None
    with staged(store_of(the_plan.report_path), release_id) as staging:
        for query in the_plan.queries:
            staging.write(query.output_path, _hashed(_table_writer(tables[query.name], query, release_id),
                                                     query.output_path, digests))
        report = release_report(the_plan, {name: table.height for name, table in tables.items()},
                                {q.name: (_relative(q.output_path, the_plan), digests[q.output_path])
                                 for q in the_plan.queries},
                                release_id, released_on, source.is_test_seed)
        staging.write(the_plan.report_path, _hashed(
            lambda p: p.write_text(json.dumps(report, indent=2) + "\n"), the_plan.report_path, digests))
        staging.write(report_md, _hashed(
            lambda p: p.write_text(explanation_markdown(report, "DP release")), report_md, digests))
        staging.write(report_html, _hashed(
            lambda p: p.write_text(card), report_html, digests))
        if checkpoint is not None:
            checkpoint()
        # Publication and marking its ledger entry go together: a signal now waits until both are done.
        with _signals_deferred():
            staging.commit()
            if reserved is not None:
                reserved.published = True
                recorded = _record(reserved, the_plan, digests)
            if on_published is not None:
                on_published()
    return report, recorded


def ledger_status(spec: str | Path | ValidatedSpec,
                  ledger: str | Path | None = None) -> ledger_entries.Status | None:
    """What the spec's dataset has spent in the ledger and what this spec would cost; None without a ledger.

    Reads the ledger in one read-only transaction (creating nothing) and hashes the input
    files for their fingerprints; reads no data rows.
    """
    validated = spec if isinstance(spec, ValidatedSpec) else validate(spec)
    location = ledger_location.resolve(validated.loaded, ledger)
    if location is None:
        return None
    return open_ledger(location).status(_release(validated, plan(validated)))


def verify(report_path: str | Path) -> Verified:
    """Check that the files at a release's output paths are the ones its report names.

    Raises `NotVerified` (exit 7) naming each output that is missing or whose sha256 is
    not the report's; reads only the report and the outputs.
    """
    return verify_release(Path(report_path))


def read_ledger(ledger: str | Path) -> list[dict[str, Any]]:
    """Every entry of a ledger (a path or a postgresql:// URL), checked, with its state.

    Raises `LedgerError` (exit 6) if it is corrupt or cannot be reached.
    """
    return open_ledger(_given(ledger)).entries()


def import_ledger(jsonl_path: str | Path, ledger: str | Path) -> int:
    """Move the entries of a JSON-lines ledger (an old file ledger, or an export) into an empty ledger, exactly.

    Returns how many entries were imported.
    """
    entries = ledger_jsonl.read_lines(Path(jsonl_path))
    if not entries:
        raise ledger_entries.LedgerError(f"{jsonl_path} holds no release: nothing to import (no ledger was made)")
    open_ledger(_given(ledger)).import_entries(entries)
    return len(entries)


def export_ledger(ledger: str | Path, output: str | Path | None = None, force: bool = False) -> str:
    """Every entry of a ledger as JSON lines, for audit (`import_ledger` takes them back);
    also written whole to `output` if given (`publish.write_whole`: an existing file only with
    `force`; a device such as /dev/stdout written through)."""
    text = ledger_jsonl.lines(read_ledger(ledger))
    if output is not None:
        write_whole(Path(output), text.encode(), force)
    return text


def find_ledger(ledger: str | Path | None = None, spec: str | Path | None = None) -> Location | None:
    """The ledger a command uses: `ledger` (a path or a postgresql:// URL), else
    $DPRUN_LEDGER, else the `ledger:` of `spec` (validated), else None."""
    loaded = None if spec is None or ledger else validate(spec).loaded
    return ledger_location.resolve(loaded, ledger)


def _given(ledger: str | Path) -> Location:
    """The ledger a caller named (relative paths from the working folder)."""
    located = find_ledger(ledger)
    assert located is not None, "a ledger was named"
    return located


def ledger_name(location: Location) -> str:
    """A ledger's location as it may be shown: a URL without its password."""
    return ledger_location.shown(location)


def ledger_totals(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per dataset of `entries`: its releases that count, how many are pending, and their exact spend."""
    return ledger_entries.totals_by_dataset(entries)


def abandon_release(number: int, ledger: str | Path) -> dict[str, Any]:
    """Mark a pending release abandoned, so that its spend no longer counts (see docs/ledger.md).

    Refused if its report on this machine shows that it was published.
    """
    book = open_ledger(_given(ledger))
    entry = next((e for e in book.entries() if e["release"] == number), None)
    if entry is not None and _was_published(entry):
        raise ledger_entries.LedgerError(
            f"release {number} was published: its report {entry['report']['path']} names it. Its spend stays "
            "counted; nothing was changed")
    return book.abandon(number)


def _was_published(entry: dict[str, Any]) -> bool:
    """Whether the report at the entry's report path (on this machine) is this release's."""
    try:
        report = loads_json(read_small_file(Path(entry["report"]["path"]), MAX_REPORT_BYTES))
    except (ValueError, KeyError, TypeError):  # UnreadableFile too: a report that is not there
        return False
    return isinstance(report, dict) and report.get("release_id") == entry.get("release_id")


def scaffold_placeholders(text: str) -> int:
    """How many placeholders a `scaffold` text leaves to fill."""
    return len(scaffold_mod.placeholder_lines(text))


def write_scaffold(data_path: str | Path, spec_path: str | Path, fmt: str | None = None, force: bool = False,
                   sql: bool = False) -> str:
    """`scaffold`, written to `spec_path` whole or not at all (a temporary file renamed into
    place); an existing file is replaced only with `force` (else `OutputError`, exit 6)."""
    target = Path(spec_path)
    if _same_file(target, Path(data_path)):
        raise OutputError(f"{target} is the data file init reads: write the spec elsewhere")
    text = scaffold(data_path, target, fmt, sql)
    write_whole(target, text.encode(), force)
    return text


def _same_file(one: Path, other: Path) -> bool:
    try:
        return one.exists() and other.exists() and os.path.samefile(one, other)
    except OSError:
        return False


def scaffold(data_path: str | Path, spec_path: str | Path | None = None, fmt: str | None = None,
             sql: bool = False) -> str:
    """A commented spec for a data file, from its column names and types only; see `dprun init`.

    Paths in it are relative to `spec_path`'s folder (the working folder if None); nothing is
    written. With `sql`, its query is written as a SELECT statement.
    """
    return scaffold_mod.scaffold(Path(data_path), None if spec_path is None else Path(spec_path), fmt, sql)


def _release(validated: ValidatedSpec, the_plan: Plan) -> ledger_entries.Release:
    """The release as the ledger reserves it before any data is read. With `auto` bounds the plan's
    total is known only once they are chosen, so the spec's budget is reserved: the final plan never
    spends more (`_require_reserved` checks it before anything is published)."""
    from dprun.report import input_fingerprints

    spend = (the_plan.total_epsilon, the_plan.total_delta)
    if any(query.bound_choice is not None for query in the_plan.queries):
        spend = (max(spend[0], the_plan.budget_epsilon), max(spend[1], the_plan.budget_delta))
    return ledger_entries.make_release(validated.loaded, spend, the_plan.accounting,
                                       input_fingerprints(validated.inputs))


def _require_reserved(reserved: _Reserved | None, the_plan: Plan) -> None:
    """The ledger never records less than a release spends: a final plan beyond its reservation
    (a bug) publishes nothing."""
    if reserved is None:
        return
    spent = Spend.of(the_plan.total_epsilon, the_plan.total_delta)
    if not spent.within(reserved.release.requested):
        raise DprunError(f"internal error: the release would spend {spent}, more than the {reserved.release.requested} "
                         "reserved in the ledger; nothing was published")


def _require_ledger_apart(validated: ValidatedSpec, location: ledger_location.Location | None) -> None:
    """A ledger given by --ledger or $DPRUN_LEDGER gets the check `validate` makes of the spec's `ledger:`."""
    if not isinstance(location, Path):
        return
    problem = ledger_file_problem(location, validated.loaded.published_and_read())
    if problem is not None:
        raise SpecError([Problem(str(validated.loaded.path), None, None, "ledger", problem)])


def _record(reserved: _Reserved, the_plan: Plan,
            digests: dict[Path, str]) -> tuple[dict[str, Any], ledger_entries.Status]:
    """Mark the reservation published, with every file's sha256. The outputs are committed already."""
    _, report_md, report_html = report_files(the_plan.report_path)
    entry = {
        **reserved.entry,
        "published_at": _now(),
        "outputs": [{"query": q.name, "path": str(q.output_path), "sha256": digests[q.output_path]}
                    for q in the_plan.queries],
        "report": {"path": str(the_plan.report_path), "sha256": digests[the_plan.report_path]},
        "report_markdown": {"path": str(report_md), "sha256": digests[report_md]},
        "report_html": {"path": str(report_html), "sha256": digests[report_html]},
    }
    try:
        return reserved.book.publish(reserved.release, entry)
    except ledger_entries.LedgerError as error:
        raise ledger_entries.LedgerError(
            f"the release WAS published, but the ledger could not mark it so: {error.message}. Its reservation "
            f"(release {entry['release']}) stays pending, which still counts its spend: nothing more is needed "
            "for the budget. `dprun ledger show` lists it as pending"
        ) from None


def _hashed(writer: Callable[[Path], object], target: Path, digests: dict[Path, str]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        writer(path)
        digests[target] = sha256_of(path)
    return write


@contextmanager
def _signals_deferred(deliver_after: bool = False) -> Iterator[None]:
    """Let SIGINT/SIGTERM wait while outputs are moved into place and the ledger entry is marked
    published, or (`deliver_after`) while the scratch folder is removed.

    Once the first output is renamed into place the release exists; stopping before its
    entry is marked would leave it pending (counted, but without its files' sha256s).
    A signal that arrives meanwhile is dropped: the release is complete a moment later.
    With `deliver_after`, it is raised again once the work is done: the run still stops.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if deliver_after:
            for signum in dict.fromkeys(caught):
                signal.raise_signal(signum)


@contextmanager
def _scratch_folder() -> Iterator[str]:
    """A private temporary folder in $DPRUN_TMPDIR (else the system's), exit 6 if it cannot be
    made; removed at the end whatever happens. A signal that lands while it is being removed
    waits until it is gone: stopping there would leave private intermediate files behind."""
    parent = os.environ.get("DPRUN_TMPDIR") or None
    try:
        folder = tempfile.TemporaryDirectory(prefix="dprun-", dir=parent)
    except OSError as exc:
        where = f"DPRUN_TMPDIR={parent}" if parent else "the system's temporary folder"
        raise OutputError(f"cannot make a folder for intermediate files in {where}: "
                          f"{exc.strerror or type(exc).__name__}") from None
    try:
        yield folder.name
    finally:
        with _signals_deferred(deliver_after=True):
            folder.cleanup()


def _spark(options: dict[str, Any] | None, progress: Progress | None) -> Any:
    """A Spark session from `spark_options` (pyspark is imported only now: it is optional)."""
    from dprun.engines import spark_engine

    options = dict(options or {})
    if progress is not None:
        progress(f"starting Spark ({spark_engine.describe(options.get('master'), options.get('remote'))})")
    return spark_engine.spark_session(options.get("master"), options.get("remote"), options.get("conf"))


def _table_writer(table: pl.DataFrame, query: QueryPlan, release_id: str) -> Callable[[Path], None]:
    from dprun.report import RELEASE_ID_KEY

    if query.output_format == "csv":
        return lambda path: table.write_csv(path)
    # The release id in the file's key-value metadata ties it to its report (`dprun verify`).
    return lambda path: table.write_parquet(path, metadata={RELEASE_ID_KEY: release_id})


def _relative(path: Path, the_plan: Plan) -> str:
    """`path` relative to the spec's folder: the report shows no absolute path of this machine."""
    return os.path.relpath(path, the_plan.spec_path.resolve().parent)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")

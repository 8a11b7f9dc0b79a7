"""The release ledger (the default SQLite store) through the real command line: re-releases
refused (exit 5), the lifetime budget enforced (exit 4), concurrent runs never both spending,
failed runs spending nothing, a corrupt ledger refused (exit 6), `explain-budget`, `ledger show`,
the job summary. The shared PostgreSQL store and the reservation's life are in
tests/test_shared_ledger.py.

Data is generated with numpy into tmp_path. Most tests drive `dprun.cli.main` in-process with
CliRunner; the concurrency tests start real processes (`python -m dprun`). Runs use `--seed`
(a random one, shown in every assertion message) so they are reproducible.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from click.testing import Result
from dprun_testing import chartless_dprun, everything, fresh_seed, invoke_clean, no_ambient_ledger  # noqa: F401 (a fixture)

from dprun import api
from dprun.errors import AlreadyReleased, BudgetRefused
from dprun.ledger.entries import LedgerError, Release
from dprun.ledger.spend import decimal_text, exact
from dprun.ledger.store import SqlLedger
from dprun.report import file_fingerprint

EPSILON = 0.3  # per release; the plan guarantees a hair less (its `total`)


pytestmark = pytest.mark.usefixtures("no_ambient_ledger")


# --- helpers -------------------------------------------------------------------------------


def write_data(path: Path, seed: int, rows: int = 2000) -> None:
    rng = np.random.default_rng(seed)
    frame = pl.DataFrame({
        "uid": rng.integers(0, rows // 4, rows),
        "shop": [f"s{k}" for k in rng.integers(0, 4, rows)],
        "spend": rng.uniform(0, 50, rows).round(2),
    })
    if path.suffix == ".csv":
        frame.write_csv(path)
    else:
        frame.write_parquet(path)


def write_spec(folder: Path, *, name: str = "ledger-test", data: str = "visits.parquet", output: str = "out/q.csv",
               report: str = "out/report.json", epsilon: float = EPSILON, ledger_path: str | None = "ledger.db",
               lifetime: dict[str, float] | None = None, dataset: str | None = None,
               filename: str = "spec.yaml", delta: float = 0.0, noise: str = "auto") -> Path:
    budget: dict[str, Any] = {"epsilon": epsilon, "delta": delta}
    if lifetime is not None:
        budget["lifetime"] = lifetime
    spec: dict[str, Any] = {
        "version": 1,
        "name": name,
        "privacy_unit": "uid",
        "budget": budget,
        "inputs": {"visits": {"path": data}},
        "queries": [{
            "name": "per_shop",
            "input": "visits",
            "group_by": ["shop"],
            "partitions": {"public": ["s0", "s1", "s2", "s3"]},
            "contribution_bounds": {"max_partitions_contributed": 2, "max_contributions_per_partition": 2},
            "metrics": [{"name": "visits", "kind": "count"},
                        {"name": "spend", "kind": "sum", "column": "spend", "bounds": [0, 50]}],
            "output": {"path": output},
            "noise": noise,
        }],
        "report": report,
    }
    if ledger_path is not None:
        spec["ledger"] = ledger_path
    if dataset is not None:
        spec["dataset"] = dataset
    path = folder / filename
    path.write_text(json.dumps(spec, indent=2))
    return path


def entries(path: Path) -> list[dict[str, Any]]:
    """Every entry of the ledger at `path`, abandoned ones included ([] if there is none)."""
    return api.read_ledger(path) if path.exists() else []


def counted(path: Path) -> list[dict[str, Any]]:
    """The entries whose spend counts."""
    return [e for e in entries(path) if e["state"] != "abandoned"]


def snapshot(path: Path) -> list[dict[str, Any]] | None:
    return entries(path) if path.exists() else None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(spec: Path, seed: int, *extra: str) -> Result:
    return invoke_clean("run", str(spec), "--seed", str(seed), *extra)


def run_ok(spec: Path, seed: int, *extra: str) -> Result:
    result = run(spec, seed, *extra)
    assert result.exit_code == 0, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    return result


def planned_total(spec: Path) -> tuple[float, float]:
    plan = api.plan(api.validate(spec))
    return plan.total_epsilon, plan.total_delta


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "GITHUB_STEP_SUMMARY")}
    env["CI"] = "1"
    return env


def start(spec: Path, seed: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        chartless_dprun("run", str(spec), "--seed", str(seed), *extra),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=spec.parent, env=subprocess_env(),
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = process.communicate(timeout=180)
    assert "Traceback" not in err, err
    return process.returncode, out + err


# --- already released ----------------------------------------------------------------------


def test_a_second_identical_run_refuses_with_exit_5_and_spends_nothing(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    ledger_file = tmp_path / "ledger.db"
    assert not ledger_file.exists()

    run_ok(spec, seed)
    table = pl.read_csv(tmp_path / "out" / "q.csv")
    assert table["shop"].to_list() == ["s0", "s1", "s2", "s3"], f"seed={seed}"
    assert len(entries(ledger_file)) == 1, f"seed={seed}"
    ledger_before = snapshot(ledger_file)
    outputs_before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()}

    for extra in ((), ("--overwrite",)):
        result = run(spec, seed + 1, *extra)
        assert result.exit_code == 5, f"seed={seed} {extra}: exit {result.exit_code}: {everything(result)}"
        message = result.stderr
        assert message.startswith("error: already released"), f"seed={seed}: {message}"
        assert str(tmp_path.resolve() / "out" / "q.csv") in message, f"seed={seed}: not pointed to: {message}"
        assert str(tmp_path.resolve() / "out" / "report.json") in message, f"seed={seed}: {message}"
        assert "--new-release" in message, f"seed={seed}: {message}"
        assert snapshot(ledger_file) == ledger_before, f"seed={seed}: the refused run changed the ledger"
        assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir() if p.is_file()} == outputs_before, f"seed={seed}"

    as_json = run(spec, seed + 2, "--format", "json")
    assert as_json.exit_code == 5
    answer = json.loads(as_json.stdout)
    assert answer["ok"] is False and answer["exit_code"] == 5
    earlier = answer["details"]["earlier_release"]
    assert earlier["release"] == 1 and earlier["outputs"][0]["path"] == str(tmp_path.resolve() / "out" / "q.csv")


def test_new_release_spends_again_on_purpose(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    run_ok(spec, seed)
    run_ok(spec, seed + 1, "--new-release", "--overwrite")
    first, second = entries(tmp_path / "ledger.db")
    assert (first["new_release"], second["new_release"]) == (False, True)
    assert first["spec_sha256"] == second["spec_sha256"] and first["dataset"] == second["dataset"]
    assert (first["release"], second["release"]) == (1, 2)
    status = api.ledger_status(spec)
    assert status is not None and status.releases == 2
    assert status.spent.epsilon == 2 * Fraction(repr(planned_total(spec)[0])), f"seed={seed}"


def test_the_entry_records_the_release(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    run_ok(spec, seed)
    [entry] = entries(tmp_path / "ledger.db")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert entry["ledger_version"] == 1
    assert entry["spec_sha256"] == report["spec_sha256"] == sha256(spec)
    # The input fingerprints are the data owner's: in the (private) ledger, not in the published report.
    [fingerprint] = entry["inputs"]
    assert fingerprint["sha256"] == file_fingerprint(tmp_path / "visits.parquet", "parquet")
    assert fingerprint["bytes"] == (tmp_path / "visits.parquet").stat().st_size and "inputs" not in report
    assert entry["epsilon"] == repr(report["total"]["epsilon"]) and Fraction(entry["delta"]) == 0
    assert entry["accounting"] == report["accounting"] == "basic"
    assert entry["time"][:10] == report["released_on"]
    assert entry["dataset"].startswith("inputs-sha256:") and entry["dataset_declared"] is False
    assert entry["non_private_test_seed"] is True
    [output] = entry["outputs"]
    assert output == {"query": "per_shop", "path": str(tmp_path.resolve() / "out" / "q.csv"),
                      "sha256": sha256(tmp_path / "out" / "q.csv")}
    assert entry["report"]["sha256"] == sha256(tmp_path / "out" / "report.json")
    assert entry["report_markdown"]["sha256"] == sha256(tmp_path / "out" / "report.md")


def test_a_changed_spec_is_a_new_release(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    run_ok(spec, seed)
    spec.write_text(spec.read_text().replace('"ledger-test"', '"ledger-test-2"'))
    run_ok(spec, seed, "--overwrite")
    first, second = entries(tmp_path / "ledger.db")
    assert first["spec_sha256"] != second["spec_sha256"] and first["dataset"] == second["dataset"]
    assert second["new_release"] is False


@pytest.mark.parametrize("declared", [None, "shop-visits"])
def test_changed_data_is_a_new_release(tmp_path: Path, declared: str | None) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, dataset=declared)
    run_ok(spec, seed)
    write_data(tmp_path / "visits.parquet", seed + 1)
    run_ok(spec, seed, "--overwrite")
    first, second = entries(tmp_path / "ledger.db")
    assert first["inputs"][0]["sha256"] != second["inputs"][0]["sha256"], f"seed={seed}"
    if declared:
        assert first["dataset"] == second["dataset"] == declared  # one dataset, one lifetime budget
    else:
        assert first["dataset"] != second["dataset"]  # identified by its files' fingerprints
    # ...and the same data again is refused.
    assert run(spec, seed, "--overwrite").exit_code == 5


def test_moved_input_files_are_the_same_data(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    run_ok(spec, seed)
    (tmp_path / "moved").mkdir()
    (tmp_path / "visits.parquet").rename(tmp_path / "moved" / "visits.parquet")
    moved = write_spec(tmp_path, data="moved/visits.parquet", filename="spec-moved.yaml")
    status = api.ledger_status(moved)
    assert status is not None and status.releases == 1, "the same files at another path are another dataset"


# --- the lifetime budget -------------------------------------------------------------------


def test_the_lifetime_budget_is_enforced_across_many_releases(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    lifetime = {"epsilon": 1.0, "delta": 0.0}
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, dataset="shop-visits", lifetime=lifetime)
    ledger_file = tmp_path / "ledger.db"
    cost = Fraction(repr(planned_total(spec)[0]))
    allowed = int(Fraction(1) // cost)
    assert allowed == 3, cost
    for release in range(allowed):  # fresh data each day: each a new release of one dataset
        write_data(tmp_path / "visits.parquet", seed + release)
        run_ok(spec, seed, "--overwrite")
    assert len(entries(ledger_file)) == allowed
    before = snapshot(ledger_file)

    write_data(tmp_path / "visits.parquet", seed + allowed)
    result = run(spec, seed, "--overwrite")
    assert result.exit_code == 4, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    spent = allowed * cost
    for word in ("requested", "spent", "remaining", "lifetime", "shop-visits"):
        assert word in result.stderr, f"{word!r} not in {result.stderr}"
    assert f"requested ε={decimal_text(cost)}" in result.stderr, result.stderr
    assert f"spent ε={decimal_text(spent)}" in result.stderr, result.stderr
    assert f"remaining ε={decimal_text(Fraction(1) - spent)}" in result.stderr, result.stderr
    assert snapshot(ledger_file) == before, "a refused run changed the ledger"

    answer = json.loads(run(spec, seed, "--overwrite", "--format", "json").stdout)
    assert answer["exit_code"] == 4
    details = answer["details"]
    assert Fraction(details["spent"]["epsilon"]) == spent
    assert Fraction(details["remaining"]["epsilon"]) == 1 - spent
    assert Fraction(details["requested"]["epsilon"]) == cost

    # --new-release does not lift the lifetime budget; another spec on the dataset is refused too.
    assert run(spec, seed, "--overwrite", "--new-release").exit_code == 4
    other = write_spec(tmp_path, name="other", output="out/other.csv", report="out/other.json",
                       dataset="shop-visits", lifetime=lifetime, filename="other.yaml")
    assert run(other, seed).exit_code == 4
    assert snapshot(ledger_file) == before


def test_delta_counts_against_the_lifetime_too(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, lifetime={"epsilon": 100.0}, delta=1e-6, noise="gaussian")  # lifetime δ: 0
    assert planned_total(spec)[1] > 0
    result = run(spec, seed)
    assert result.exit_code == 4, everything(result)
    assert "remaining ε=100, δ=0" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and entries(tmp_path / "ledger.db") == []


def test_spends_add_up_exactly_without_float_drift(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, dataset="d", lifetime={"epsilon": 1.0})
    template = {"ledger_version": 1, "time": "2024-01-01T00:00:00+00:00", "dataset": "d", "spec_sha256": "0" * 64,
                "inputs": [], "epsilon": "0.1", "delta": "0", "accounting": "basic", "outputs": []}
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps({**template, "release": k}) + "\n" for k in range(1, 11)))
    assert invoke_clean("ledger", "import", str(old), str(tmp_path / "ledger.db")).exit_code == 0
    assert sum([0.1] * 10) != 1.0  # what a float sum would have claimed
    result = invoke_clean("explain-budget", str(spec), "--format", "json")
    assert result.exit_code == 0, everything(result)
    status = json.loads(result.stdout)["ledger"]
    assert status["spent"] == {"epsilon": "1", "delta": "0"} and status["remaining"] == {"epsilon": "0", "delta": "0"}
    assert status["within_lifetime"] is False and status["releases"] == 10
    assert run(spec, seed).exit_code == 4


@pytest.mark.parametrize(("value", "text"), [
    (0.1, "0.1"), (1e-6, "0.000001"), (1e-7, "1E-7"), (0.29999999999972715, "0.29999999999972715"), (3.0, "3"),
])
def test_exact_decimal_round_trip(value: float, text: str) -> None:
    assert decimal_text(exact(value)) == text
    assert exact(text) == exact(value) == Fraction(repr(value))
    assert float(text) == value


def test_a_lifetime_without_a_ledger_is_refused(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, ledger_path=None, lifetime={"epsilon": 5.0})
    result = run(spec, seed)
    assert result.exit_code == 1, everything(result)
    assert "budget.lifetime" in result.stderr and "ledger" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
    explained = invoke_clean("explain-budget", str(spec))
    assert explained.exit_code == 0 and "cannot be enforced without a ledger" in explained.stdout


# --- failures spend nothing ----------------------------------------------------------------


def write_csv_with_a_late_bad_value(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = 6000
    spend = [f"{v:.2f}" for v in rng.uniform(0, 50, rows)]
    spend[4500] = "not-a-number"  # past the rows schema inference samples
    pl.DataFrame({"uid": rng.integers(0, 1500, rows), "shop": [f"s{k}" for k in rng.integers(0, 4, rows)],
                  "spend": spend}).write_csv(path)


def test_a_failed_run_spends_nothing(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    good = write_spec(tmp_path, dataset="shop-visits")
    run_ok(good, seed)
    ledger_file = tmp_path / "ledger.db"
    before = snapshot(ledger_file)

    write_csv_with_a_late_bad_value(tmp_path / "late.csv", seed)
    bad = write_spec(tmp_path, name="bad", data="late.csv", output="out/bad.csv", report="out/bad.json",
                     dataset="shop-visits", filename="bad.yaml")
    result = run(bad, seed)
    assert result.exit_code == 3, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert counted(ledger_file) == before, f"seed={seed}: a failed run spent"
    assert entries(ledger_file)[-1]["state"] == "abandoned", "the failed run's reservation was not abandoned"
    assert not (tmp_path / "out" / "bad.csv").exists()

    (tmp_path / "blocked").write_text("a file where a folder should be")
    unwritable = write_spec(tmp_path, name="unwritable", output="blocked/q.csv", report="out/u.json",
                            filename="unwritable.yaml")
    result = run(unwritable, seed)
    assert result.exit_code == 6, f"seed={seed}: exit {result.exit_code}: {everything(result)}"
    assert counted(ledger_file) == before, f"seed={seed}: a failed run spent"

    # The next good release goes through, and the bad spec, mended, is not "already released".
    run_ok(write_spec(tmp_path, name="next", output="out/next.csv", report="out/next.json", filename="next.yaml"), seed)
    assert [e["state"] for e in entries(ledger_file)] == ["published", "abandoned", "abandoned", "published"]
    write_data(tmp_path / "late.csv", seed)
    run_ok(bad, seed)


def test_a_failure_on_a_fresh_ledger_spends_nothing(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_csv_with_a_late_bad_value(tmp_path / "late.csv", seed)
    spec = write_spec(tmp_path, data="late.csv")
    assert run(spec, seed).exit_code == 3
    assert [e["state"] for e in entries(tmp_path / "ledger.db")] == ["abandoned"]
    status = api.ledger_status(spec)
    assert status is not None and status.releases == 0 and status.spent.epsilon == 0


# --- a corrupt or missing ledger -----------------------------------------------------------


def corrupt_row(column: str, value: str) -> Callable[[Path], None]:
    def damage(ledger_file: Path) -> None:
        with sqlite3.connect(ledger_file) as connection:
            connection.execute(f"UPDATE dprun_releases SET {column} = ? WHERE release = 1", (value,))
        connection.close()
    return damage


def replace_file(content: bytes) -> Callable[[Path], None]:
    return lambda ledger_file: ledger_file.write_bytes(content)


def newer_schema(ledger_file: Path) -> None:
    with sqlite3.connect(ledger_file) as connection:
        connection.execute("UPDATE dprun_ledger SET schema_version = 9")
    connection.close()


def truncated(ledger_file: Path) -> None:
    data = ledger_file.read_bytes()
    ledger_file.write_bytes(data[:100] + bytes(len(data) - 100))


@pytest.mark.parametrize(("damage", "says"), [
    (corrupt_row("entry", "{not json"), "release 1 is not valid JSON"),
    (corrupt_row("entry", '{"ledger_version": 1, "time": "t", "dataset": "d"}'), "release 1 has no valid `spec_sha256`"),
    (newer_schema, "newer dprun"),
    (truncated, "corrupt"),
    (replace_file(b"not a database at all, but long enough to have a header" * 20), "not an SQLite database"),
    (replace_file(b'{"ledger_version": 1}\n'), "dprun ledger import"),
], ids=["entry not JSON", "entry lacks fields", "newer schema", "zeroed pages", "not SQLite",
        "a JSON-lines ledger"])
def test_a_corrupt_ledger_exits_6_and_publishes_nothing(tmp_path: Path, damage: Callable[[Path], None],
                                                        says: str) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    run_ok(spec, seed)
    ledger_file = tmp_path / "ledger.db"
    damage(ledger_file)
    before = ledger_file.read_bytes()
    other = write_spec(tmp_path, name="other", output="out/other.csv", report="out/other.json", filename="o.yaml")
    commands = (("run", str(other), "--seed", "1"), ("explain-budget", str(other)),
                ("ledger", "show", str(ledger_file)), ("ledger", "export", str(ledger_file)))
    for args in commands:
        result = invoke_clean(*args)
        assert result.exit_code == 6, f"{args}: exit {result.exit_code}: {everything(result)}"
        assert says in result.stderr, f"{args}: {result.stderr}"
    assert not (tmp_path / "out" / "other.csv").exists()
    assert ledger_file.read_bytes() == before


def test_the_ledger_folder_must_exist(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, ledger_path="no-such-folder/ledger.db")
    result = run(spec, seed)
    assert result.exit_code == 6, everything(result)
    assert "no-such-folder" in result.stderr and "does not exist" in result.stderr
    assert not (tmp_path / "out").exists()


# --- where the ledger is -------------------------------------------------------------------


def test_ledger_path_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed(6)
    (tmp_path / "specs").mkdir()
    write_data(tmp_path / "specs" / "visits.parquet", seed)
    spec = write_spec(tmp_path / "specs", ledger_path="spec-ledger.db")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    run_ok(spec, seed)  # the spec's ledger, relative to the spec's folder
    assert len(entries(tmp_path / "specs" / "spec-ledger.db")) == 1
    monkeypatch.setenv("DPRUN_LEDGER", "env-ledger.db")  # relative to the working folder
    run_ok(spec, seed, "--overwrite")
    assert len(entries(elsewhere / "env-ledger.db")) == 1
    run_ok(spec, seed, "--overwrite", "--ledger", str(tmp_path / "flag-ledger.db"))
    assert len(entries(tmp_path / "flag-ledger.db")) == 1
    assert len(entries(tmp_path / "specs" / "spec-ledger.db")) == 1
    assert run(spec, seed, "--overwrite").exit_code == 5  # the env ledger knows it now


def test_without_a_ledger_nothing_is_recorded_or_refused(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, ledger_path=None)
    first = run_ok(spec, seed)
    assert first.stdout.count("ledger: none configured") == 1, first.stdout
    assert "this release was not recorded, and a re-run would not be refused" in first.stdout
    run_ok(spec, seed, "--overwrite")
    assert not list(tmp_path.glob("*.db"))


# --- concurrency ---------------------------------------------------------------------------


def test_concurrent_runs_of_one_spec_release_exactly_once(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    processes = [start(spec, seed + k) for k in range(4)]
    results = [finish(p) for p in processes]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 5, 5, 5], f"seed={seed}: {results}"
    for code, text in results:
        if code == 5:  # refused while the first runs, or after it published
            assert "already released" in text or "already being released" in text, text
    [entry] = entries(tmp_path / "ledger.db")
    assert entry["outputs"][0]["sha256"] == sha256(tmp_path / "out" / "q.csv"), "the outputs are not the recorded ones"


def test_concurrent_runs_never_exceed_the_lifetime(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    probe = write_spec(tmp_path, dataset="shared", filename="probe.yaml")
    cost = Fraction(repr(planned_total(probe)[0]))
    lifetime = {"epsilon": float(2 * cost) + 1e-9}  # room for exactly two releases
    assert 2 * cost <= Fraction(repr(lifetime["epsilon"])) < 3 * cost
    specs = [write_spec(tmp_path, name=f"spec{k}", output=f"out/q{k}.csv", report=f"out/r{k}.json",
                        dataset="shared", lifetime=lifetime, filename=f"spec{k}.yaml") for k in range(4)]
    results = [finish(p) for p in [start(spec, seed) for spec in specs]]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 0, 4, 4], f"seed={seed}: {results}"
    recorded = entries(tmp_path / "ledger.db")
    assert len(recorded) == 2 and sum(Fraction(e["epsilon"]) for e in recorded) <= Fraction(repr(lifetime["epsilon"]))
    assert [e["release"] for e in recorded] == [1, 2]
    published = sorted(p.name for p in (tmp_path / "out").glob("q*.csv"))
    assert len(published) == 2, published


def test_a_run_waits_while_another_holds_the_ledger(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    ledger_file = tmp_path / "ledger.db"
    run_ok(write_spec(tmp_path, name="first", output="out/first.csv", report="out/first.json",
                      filename="first.yaml"), seed)
    holder = sqlite3.connect(ledger_file, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")  # what a run's reservation holds, for a moment
        process = start(spec, seed)
        time.sleep(4)
        assert process.poll() is None, f"the run did not wait for the ledger: {process.communicate()}"
        assert not (tmp_path / "out" / "q.csv").exists()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    code, text = finish(process)
    assert code == 0, text
    assert len(entries(ledger_file)) == 2


# --- explain-budget, ledger show, the job summary, the API ---------------------------------


def test_explain_budget_shows_the_spend_beside_the_cost(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, dataset="shop-visits", lifetime={"epsilon": 2.0})
    cost = Fraction(repr(planned_total(spec)[0]))
    before = json.loads(invoke_clean("explain-budget", str(spec), "--format", "json").stdout)["ledger"]
    assert before["releases"] == 0 and before["spent"]["epsilon"] == "0" and before["already_released"] is None
    run_ok(spec, seed)
    result = invoke_clean("explain-budget", str(spec), "--format", "json")
    assert result.exit_code == 0, everything(result)
    status = json.loads(result.stdout)["ledger"]
    assert status["dataset"] == "shop-visits" and status["releases"] == 1
    assert Fraction(status["spent"]["epsilon"]) == cost and Fraction(status["requested"]["epsilon"]) == cost
    assert Fraction(status["remaining"]["epsilon"]) == 2 - cost
    assert Fraction(status["spent_after"]["epsilon"]) == 2 * cost
    assert status["already_released"]["release"] == 1

    text = invoke_clean("explain-budget", str(spec)).stdout
    assert f"dataset shop-visits: spent ε={decimal_text(cost)}" in text, text
    assert "remaining" in text and "will refuse it (exit 5)" in text, text
    markdown = invoke_clean("explain-budget", str(spec), "--format", "markdown").stdout
    assert "## Ledger" in markdown and "shop-visits" in markdown


def test_ledger_show_lists_the_releases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, dataset="a")
    run_ok(spec, seed)
    other = write_spec(tmp_path, name="other", output="out/o.csv", report="out/o.json", dataset="b", filename="o.yaml")
    run_ok(other, seed)
    ledger_file = tmp_path / "ledger.db"

    text = invoke_clean("ledger", "show", str(ledger_file))
    assert text.exit_code == 0, everything(text)
    assert "#1" in text.stdout and "#2" in text.stdout and str(tmp_path.resolve() / "out" / "o.csv") in text.stdout
    assert "dataset a: 1 release(s)" in text.stdout and "TEST SEED" in text.stdout

    as_json = json.loads(invoke_clean("ledger", "show", str(ledger_file), "--format", "json", "--dataset", "b").stdout)
    assert [e["dataset"] for e in as_json["releases"]] == ["b"]
    assert list(as_json["datasets"]) == ["b"]
    assert as_json["datasets"]["b"]["spent"]["epsilon"] == entries(ledger_file)[1]["epsilon"]

    assert json.loads(invoke_clean("ledger", "show", "--spec", str(spec), "--format", "json").stdout)["ledger"] == str(
        ledger_file.resolve())
    monkeypatch.setenv("DPRUN_LEDGER", str(ledger_file))
    assert invoke_clean("ledger", "show").exit_code == 0
    monkeypatch.delenv("DPRUN_LEDGER")
    assert invoke_clean("ledger", "show").exit_code == 2
    missing = invoke_clean("ledger", "show", str(tmp_path / "nope.db"))
    assert missing.exit_code == 6 and "no ledger" in missing.stderr


def test_the_github_step_summary_gets_the_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    run_ok(spec, seed)
    text = summary.read_text()
    assert text.startswith("earlier step\n# DP release: ledger-test"), text
    assert (tmp_path / "out" / "report.md").read_text() in text
    assert "ledger: recorded in" in text
    assert run(spec, seed).exit_code == 5
    assert "not released (exit 5)" in summary.read_text() and "already released" in summary.read_text()


def test_the_python_api(tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, ledger_path=None, dataset="api", lifetime={"epsilon": 0.5})
    ledger_file = tmp_path / "api-ledger.db"
    result = api.run(spec, seed=seed, ledger=ledger_file)
    assert result.ledger_entry is not None and result.ledger_entry["dataset"] == "api"
    assert result.ledger_status is not None and result.ledger_status.releases == 1
    assert result.tables["per_shop"].height == 4
    with pytest.raises(AlreadyReleased) as refused:
        api.run(spec, seed=seed, ledger=ledger_file)
    assert refused.value.exit_code == 5
    with pytest.raises(BudgetRefused):
        api.run(spec, seed=seed, ledger=ledger_file, new_release=True, overwrite=True)
    assert api.read_ledger(ledger_file) == [result.ledger_entry]
    status = api.ledger_status(spec, ledger=ledger_file)
    assert status is not None and not status.fits and status.earlier == result.ledger_entry
    assert api.ledger_status(spec) is None  # no ledger configured


# --- publication and its entry go together -------------------------------------------------


def test_a_signal_while_committing_still_records_the_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dprun import publish

    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)
    real_commit = publish.Staging.commit

    def interrupted_commit(self: publish.Staging) -> None:
        signal.raise_signal(signal.SIGTERM)  # arrives after the outputs were staged, as they are moved
        real_commit(self)

    monkeypatch.setattr(publish.Staging, "commit", interrupted_commit)
    result = run(spec, seed)
    assert result.exit_code == 0, everything(result)
    [entry] = entries(tmp_path / "ledger.db")
    assert entry["outputs"][0]["sha256"] == sha256(tmp_path / "out" / "q.csv")


def test_a_release_that_cannot_be_marked_published_stays_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path)

    def full_disk(self: SqlLedger, release: Release, entry: dict[str, Any]) -> Any:
        raise LedgerError(f"cannot read or write the ledger {self.shown}: database or disk is full")

    monkeypatch.setattr(SqlLedger, "publish", full_disk)
    result = run(spec, seed)
    assert result.exit_code == 6, everything(result)
    assert "WAS published" in result.stderr and "disk is full" in result.stderr, result.stderr
    assert "stays pending" in result.stderr, result.stderr
    assert (tmp_path / "out" / "q.csv").exists()
    [entry] = entries(tmp_path / "ledger.db")
    assert entry["state"] == "pending", "a published release's reservation was abandoned"
    monkeypatch.undo()
    assert run(spec, seed, "--overwrite").exit_code == 5, "the pending release does not count"

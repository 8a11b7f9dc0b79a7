"""The ledger as runners share it: reservations, racing runners, a killed runner, abandoning,
import and export, on the embedded SQLite store and on a real PostgreSQL server
(`postgres_ledger`, tests/conftest.py; skipped with the reason where there is none).

Runs go through the real command line: in-process with CliRunner, or as processes
(`python -m dprun`, or a racer that imports dprun and then waits for a start signal, so that
all racers reach the ledger within milliseconds of each other).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from dprun_testing import (  # noqa: F401 (a fixture)
    CHARTLESS_DPRUN,
    chartless_dprun,
    everything,
    fresh_seed,
    invoke,
    invoke_clean,
    no_ambient_ledger,
)

from dprun import api

pytestmark = pytest.mark.usefixtures("no_ambient_ledger")

# Eight racers on two cores: four times as many processes as cores reach the ledger at once, and
# three of them must be refused each round. Each racer is a whole `dprun run` without charts (~1 s of
# a core; twice that with its card helper): sixteen made this file a seventh of the suite's CPU time.
RACERS = 8
ROUNDS = 3
LIFETIME_EPSILON = 5.0
# Imports dprun first, says so (a file named for its process), then waits for the start file:
# the racers then reach the ledger together. Then `dprun ARGS` without charts.
RACER = """
import os, pathlib, sys, time
import dprun.api, dprun.cli
start = pathlib.Path(sys.argv.pop(1))
start.with_name(f"{start.name}.ready-{os.getpid()}").touch()
while not start.exists():
    time.sleep(0.001)
""" + CHARTLESS_DPRUN


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new, empty ledger of each store: a file path or a postgresql:// URL."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return str(request.getfixturevalue("postgres_ledger"))


def write_data(path: Path, seed: int, rows: int = 400) -> None:
    rng = np.random.default_rng(seed)
    pl.DataFrame({
        "uid": rng.integers(0, max(1, rows // 4), rows),
        "shop": [f"s{k}" for k in rng.integers(0, 3, rows)],
    }).write_parquet(path)


def write_spec(folder: Path, name: str, dataset: str, *, epsilon: float = 1.0,
               lifetime: float | None = LIFETIME_EPSILON, ledger: str | None = None) -> Path:
    spec: dict[str, Any] = {
        "version": 1,
        "name": name,
        "dataset": dataset,
        "privacy_unit": "uid",
        "budget": {"epsilon": epsilon, "delta": 0.0},
        "inputs": {"visits": {"path": "visits.parquet"}},
        "queries": [{
            "name": "per_shop", "input": "visits", "group_by": ["shop"],
            "partitions": {"public": ["s0", "s1", "s2"]},
            "contribution_bounds": {"max_partitions_contributed": 1, "max_contributions_per_partition": 1},
            "metrics": [{"name": "visits", "kind": "count"}],
            "output": {"path": f"out/{name}.csv"},
        }],
        "report": f"out/{name}.json",
    }
    if lifetime is not None:
        spec["budget"]["lifetime"] = {"epsilon": lifetime}
    if ledger is not None:
        spec["ledger"] = ledger
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(spec, indent=2))
    return path


def cost_of(spec: Path) -> Fraction:
    return Fraction(repr(api.plan(api.validate(spec)).total_epsilon))


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DPRUN_LEDGER", "GITHUB_STEP_SUMMARY")}
    env["CI"] = "1"
    return env


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    out, err = process.communicate(timeout=300)
    assert "Traceback" not in err, err
    return process.returncode, out + err


def counted(ledger: str, dataset: str) -> list[dict[str, Any]]:
    return [e for e in api.read_ledger(ledger) if e["dataset"] == dataset and e["state"] != "abandoned"]


# --- racing runners --------------------------------------------------------------------------


def test_racing_runners_never_spend_past_the_lifetime(ledger_at: str, tmp_path: Path) -> None:
    """RACERS runners each release a spec costing ε ≈ 1 from a dataset with a lifetime of ε = 5, at
    the same instant: exactly 5 release, the others are refused (exit 4), the spend is exactly 5
    releases'."""
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    for round_ in range(ROUNDS):
        dataset = f"shared-{round_}"
        specs = [write_spec(tmp_path, f"r{round_}-spec{k}", dataset) for k in range(RACERS)]
        start = tmp_path / f"start-{round_}"
        racers = [subprocess.Popen(
            [sys.executable, "-c", RACER, str(start), "run", str(spec), "--seed", str(seed), "--ledger", ledger_at],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=subprocess_env(),
        ) for spec in specs]
        wait_until_every_racer_is_ready(start, racers)
        start.touch()
        results = [finish(racer) for racer in racers]
        codes = [code for code, _ in results]
        assert sorted(codes) == [0] * 5 + [4] * (RACERS - 5), f"seed={seed} round {round_}: {results}"
        for code, text in results:
            assert code == 0 or "budget refused" in text, text
        cost = cost_of(specs[0])
        recorded = counted(ledger_at, dataset)
        assert [e["state"] for e in recorded] == ["published"] * 5, recorded
        spent = sum(Fraction(e["epsilon"]) for e in recorded)
        assert spent == 5 * cost <= Fraction(LIFETIME_EPSILON), f"round {round_}: spent {spent}"
        released = {spec.stem for spec, code in zip(specs, codes, strict=True) if code == 0}
        assert {e["spec"] for e in recorded} == released
        assert {p.stem for p in (tmp_path / "out").glob(f"r{round_}-*.csv")} == released


def wait_until_every_racer_is_ready(start: Path, racers: list[subprocess.Popen[str]]) -> None:
    """Until every racer has imported dprun and waits for `start`."""
    while len(list(start.parent.glob(f"{start.name}.ready-*"))) < len(racers):
        ended = [racer for racer in racers if racer.poll() is not None]
        if ended:
            for racer in racers:
                racer.kill()
            pytest.fail(f"a racer ended before the start: {finish(ended[0])}")
        time.sleep(0.01)


# --- a reservation's life ----------------------------------------------------------------------


def test_a_killed_runner_s_reservation_stays_spent_until_an_operator_abandons_it(
        ledger_at: str, tmp_path: Path) -> None:
    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    spec = write_spec(tmp_path, "killed", "d", lifetime=1.5)
    cost = cost_of(spec)
    # The run pauses while it publishes (a test-only hook), long after it reserved its spend.
    process = subprocess.Popen(
        chartless_dprun("run", str(spec), "--seed", str(seed), "--ledger", ledger_at),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        env={**subprocess_env(), "DPRUN_TEST_PUBLISH_PAUSE": "60"})
    try:
        deadline = time.monotonic() + 120
        while not api.read_ledger(ledger_at) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    [entry] = api.read_ledger(ledger_at)
    assert entry["state"] == "pending" and Fraction(entry["epsilon"]) == cost

    # The next run sees the spend: the same spec is "being released", another does not fit.
    again = invoke_clean("run", str(spec), "--seed", "1", "--ledger", ledger_at)
    assert again.exit_code == 5 and "already being released" in again.stderr, everything(again)
    other = write_spec(tmp_path, "other", "d", lifetime=1.5)
    refused = invoke_clean("run", str(other), "--seed", "1", "--ledger", ledger_at)
    assert refused.exit_code == 4 and "in 1 release(s)" in refused.stderr, everything(refused)
    shown = invoke_clean("ledger", "show", ledger_at)
    assert "[PENDING]" in shown.stdout and "1 release(s) (1 pending)" in shown.stdout, shown.stdout
    explained = json.loads(invoke_clean("explain-budget", str(other), "--format", "json", "--ledger",
                                        ledger_at).stdout)["ledger"]
    assert explained["pending"] == 1 and Fraction(explained["spent"]["epsilon"]) == cost

    # Abandoning needs the explicit flag, and frees the budget.
    unflagged = invoke_clean("ledger", "abandon", str(entry["release"]), ledger_at)
    assert unflagged.exit_code == 2 and "--confirm-not-published" in unflagged.stderr
    assert api.read_ledger(ledger_at)[0]["state"] == "pending"
    flagged = invoke_clean("ledger", "abandon", str(entry["release"]), ledger_at, "--confirm-not-published")
    assert flagged.exit_code == 0, everything(flagged)
    assert api.read_ledger(ledger_at)[0]["state"] == "abandoned"
    assert invoke_clean("ledger", "abandon", str(entry["release"]), ledger_at,
                        "--confirm-not-published").exit_code == 6  # only a pending release
    released = invoke_clean("run", str(other), "--seed", "1", "--ledger", ledger_at)
    assert released.exit_code == 0, everything(released)


def test_a_published_release_cannot_be_abandoned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dprun.ledger.entries import LedgerError, Release
    from dprun.ledger.store import SqlLedger

    seed = fresh_seed(6)
    write_data(tmp_path / "visits.parquet", seed)
    ledger = str(tmp_path / "ledger.db")
    spec = write_spec(tmp_path, "lost-mark", "d", lifetime=None, ledger="ledger.db")

    def unreachable(self: SqlLedger, release: Release, entry: dict[str, Any]) -> Any:
        raise LedgerError("the ledger database went away")

    monkeypatch.setattr(SqlLedger, "publish", unreachable)
    assert invoke_clean("run", str(spec), "--seed", str(seed)).exit_code == 6
    monkeypatch.undo()
    [entry] = api.read_ledger(ledger)
    assert entry["state"] == "pending"
    result = invoke_clean("ledger", "abandon", "1", ledger, "--confirm-not-published")
    assert result.exit_code == 6 and "was published" in result.stderr, everything(result)
    assert api.read_ledger(ledger)[0]["state"] == "pending"


# --- import and export -------------------------------------------------------------------------


def test_import_and_export_are_exact(ledger_at: str, tmp_path: Path) -> None:
    template = {"ledger_version": 1, "time": "2024-01-01T00:00:00+00:00", "dataset": "d", "spec_sha256": "0" * 64,
                "inputs": [], "delta": "0", "accounting": "basic", "outputs": []}
    spends = ["0.29999999999972715", "0.1", "1E-7", "0.000001"]
    old = tmp_path / "old.jsonl"  # a ledger file of an earlier dprun: no state, no release id
    old.write_text("".join(json.dumps({**template, "release": k, "epsilon": e}) + "\n"
                           for k, e in enumerate(spends, start=1)))
    imported = invoke_clean("ledger", "import", str(old), ledger_at)
    assert imported.exit_code == 0 and "imported 4 release(s)" in imported.stdout, everything(imported)
    entries = api.read_ledger(ledger_at)
    assert [e["epsilon"] for e in entries] == spends and {e["state"] for e in entries} == {"published"}
    assert [e["release"] for e in entries] == [1, 2, 3, 4]

    # Runs add a published and an abandoned entry; export, import elsewhere, export again: the same bytes.
    write_data(tmp_path / "visits.parquet", fresh_seed(6))
    assert invoke_clean("run", str(write_spec(tmp_path, "ok", "d", lifetime=None)), "--seed", "1",
                        "--ledger", ledger_at).exit_code == 0
    (tmp_path / "out" / "blocked.csv").mkdir()
    blocked = write_spec(tmp_path, "blocked", "d", lifetime=None)
    assert invoke_clean("run", str(blocked), "--seed", "1", "--ledger", ledger_at).exit_code == 6
    exported = tmp_path / "export.jsonl"
    assert invoke_clean("ledger", "export", ledger_at, "-o", str(exported)).exit_code == 0
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [e["state"] for e in lines] == ["published"] * 5 + ["abandoned"]
    second = tmp_path / "second.db"
    assert invoke_clean("ledger", "import", str(exported), str(second)).exit_code == 0
    again = invoke_clean("ledger", "export", str(second))
    assert again.stdout == exported.read_text()
    total = sum(Fraction(e["epsilon"]) for e in lines if e["state"] != "abandoned")
    assert total == sum(Fraction(e) for e in spends) + cost_of(tmp_path / "ok.yaml")

    refused = invoke_clean("ledger", "import", str(exported), str(second))
    assert refused.exit_code == 6 and "already holds 6 release(s)" in refused.stderr
    broken = tmp_path / "broken.jsonl"
    broken.write_text(old.read_text() + '{"ledger_version": 1, "epsilon": 0.5}\n')
    result = invoke_clean("ledger", "import", str(broken), str(tmp_path / "third.db"))
    assert result.exit_code == 6 and "line 5 has no valid `time`" in result.stderr, everything(result)
    assert not api.read_ledger(str(tmp_path / "third.db"))


# --- PostgreSQL: credentials and failures --------------------------------------------------------


def test_a_password_never_shows(postgres_ledger: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_data(tmp_path / "visits.parquet", fresh_seed(6))
    spec = write_spec(tmp_path, "pg", "d", lifetime=None)
    secret = "Pa55-w0rd-" + os.urandom(6).hex()
    user_at = postgres_ledger.replace("postgresql://dprun@", f"postgresql://dprun:{secret}@")

    unreachable = "postgresql://dprun:" + secret + "@127.0.0.1:1/ledger"
    result = invoke_clean("run", str(spec), "--seed", "1", "--ledger", unreachable)
    assert result.exit_code == 6 and "cannot reach the ledger database" in result.stderr, everything(result)
    assert secret not in everything(result) and not (tmp_path / "out").exists()

    monkeypatch.setenv("PGPASSWORD", secret)  # the wrong password, libpq's way
    wrong = invoke_clean("run", str(spec), "--seed", "1", "--ledger", postgres_ledger)
    assert wrong.exit_code == 6 and "authentication failed" in wrong.stderr, everything(wrong)
    assert secret not in everything(wrong)
    wrong_in_url = invoke_clean("explain-budget", str(spec), "--ledger", user_at)
    assert wrong_in_url.exit_code == 6 and secret not in everything(wrong_in_url)

    in_spec = write_spec(tmp_path, "pg-in-spec", "d", lifetime=None, ledger=user_at)
    refused = invoke_clean("validate", str(in_spec))
    assert refused.exit_code == 1 and "ledger" in refused.stderr and "password" in refused.stderr
    assert secret not in everything(refused)


def test_a_postgres_ledger_through_the_spec(postgres_ledger: str, tmp_path: Path) -> None:
    write_data(tmp_path / "visits.parquet", fresh_seed(6))
    spec = write_spec(tmp_path, "pg", "d", lifetime=2.5, ledger=postgres_ledger)
    for _ in range(2):
        assert invoke_clean("run", str(spec), "--seed", "1", "--new-release", "--overwrite").exit_code == 0
    refused = invoke_clean("run", str(spec), "--seed", "1", "--new-release", "--overwrite")
    assert refused.exit_code == 4 and postgres_ledger in refused.stderr, everything(refused)
    summary = json.loads(invoke_clean("ledger", "show", "--spec", str(spec), "--format", "json").stdout)
    assert summary["ledger"] == postgres_ledger and summary["datasets"]["d"]["releases"] == 2
    assert Fraction(summary["datasets"]["d"]["spent"]["epsilon"]) == 2 * cost_of(spec)

"""Fixtures shared by the test folders: a seeded random source for statistical tests, a real
PostgreSQL server for the shared ledger's tests, the command's allocator settings, the
release card's charts left undrawn outside the tests that look at them, and the Spark tests first.

`seeded` draws a fresh seed from os.urandom for both the data and the noise. The seed is
printed, recorded as a test property and put in every assertion message by `Seeded.why`;
DPRUN_TEST_SEED=<seed> replays a failing test.

The server is Debian's `postgresql` (`.ci/run` installs it): `initdb` in a temporary
folder, started on a free loopback port with password authentication, stopped when the
session ends. Where the server binaries or psycopg are missing, the tests that need it are
skipped with the reason. PostgreSQL refuses to run as root, so as root it runs as the
`postgres` user the package creates.

Drawing a chart (building its matplotlib figure, then writing its SVG) was a fifth of the suite's
time, most of it in tests of tables that never read a chart. Outside the modules in DRAWN and the
tests marked `draws_charts`, the card's drawing functions (`dprun_testing.CHART_DRAWINGS`) return
a placeholder: the card still decides which charts there are and computes what each shows, and is
still written; the card's own tests, the adversarial inputs', the column families' and the fuzzed
hostile keys' draw every chart. The runs that the publication and ledger tests start as processes
draw placeholders too (`dprun_testing.CHARTLESS_DPRUN`).
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from dprun_testing import CHART_DRAWINGS, PLACEHOLDER_SVG

from dprun import card
from dprun.malloc_tuning import keep_freed_memory
from dprun.mechanisms.sampling import RandomSource

POSTGRES_USER = "dprun"

# The allocator settings `dprun` (the command) runs with: the audits' large numpy arrays are
# then reused instead of mapped afresh, which halves their kernel time.
keep_freed_memory()

# Test modules whose runs draw the release card's charts for real: the card's own, the adversarial
# inputs' and the column families' (text, date, compound and null keys); elsewhere, tests marked
# `draws_charts` (the fuzzed hostile keys). The other fuzz tests run a hundred cases each, and the
# card's budget chart, the same for every case, was two fifths of their time.
DRAWN = frozenset({"test_card", "test_card_helper", "test_adversarial", "test_column_families"})


# Modules whose tests share one costly process-wide resource (a Spark JVM: ~20 s to start and warm
# up on two cores). They run first: pytest-xdist's work stealing hands each worker a contiguous half
# of the collection and steals from the back of a queue, so they all stay on the first worker, one
# JVM for the whole run instead of one per worker.
RUN_FIRST = frozenset({"test_spark_engine.py"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in RUN_FIRST)


@pytest.fixture(autouse=True)
def _charts_drawn_only_where_looked_at(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = request.module.__name__.rpartition(".")[2] in DRAWN or request.node.get_closest_marker("draws_charts")
    if not drawn:
        for drawing in CHART_DRAWINGS:
            monkeypatch.setattr(card, drawing, lambda *arguments: PLACEHOLDER_SVG)


@dataclass(frozen=True)
class Seeded:
    seed: int
    source: RandomSource
    rng: np.random.Generator
    test_id: str

    def why(self, finding: str) -> str:
        return f"{finding} [reproduce: DPRUN_TEST_SEED={self.seed} pytest '{self.test_id}']"


@pytest.fixture
def seeded(request: pytest.FixtureRequest, record_property: Callable[[str, object], None]) -> Seeded:
    seed = int(os.environ.get("DPRUN_TEST_SEED") or int.from_bytes(os.urandom(16), "big"))
    record_property("dprun_test_seed", seed)
    print(f"DPRUN_TEST_SEED={seed}")
    return Seeded(seed, RandomSource.from_seed(seed), np.random.default_rng(seed), request.node.nodeid)


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    password: str  # of POSTGRES_USER; tests pass it as PGPASSWORD, libpq's convention

    def url(self, database: str = "postgres") -> str:
        """A URL without the password."""
        return f"postgresql://{POSTGRES_USER}@{self.host}:{self.port}/{database}"


def _server_binaries() -> Path | None:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    binaries = _server_binaries()
    if binaries is None:
        pytest.skip("no PostgreSQL server here (Debian package `postgresql`; .ci/run installs it)")
    pytest.importorskip("psycopg", reason="psycopg is not installed: pip install -e '.[postgres]'")
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("PostgreSQL will not run as root, and runuser is missing")
        as_user = ["runuser", "-u", "postgres", "--"]
        # pytest's own temporary folders are root's alone: the server's must be the postgres user's.
        folder = Path(tempfile.mkdtemp(prefix="dprun-postgres-"))
        shutil.chown(folder, "postgres")
    else:
        folder = tmp_path_factory.mktemp("postgres")
    password = secrets.token_hex(12)
    password_file = folder / "password"
    password_file.write_text(password + "\n")
    if as_user:
        shutil.chown(password_file, "postgres")
    data = folder / "data"
    subprocess.run([*as_user, str(binaries / "initdb"), "-D", str(data), "-U", POSTGRES_USER, "--no-sync",
                    "--auth-host=scram-sha-256", "--auth-local=trust", f"--pwfile={password_file}"],
                   check=True, capture_output=True)
    port = _free_port()
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
    subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-o", options,
                    "-w", "start"], check=True, capture_output=True)
    try:
        yield PostgresServer("127.0.0.1", port, password)
    finally:
        subprocess.run([*as_user, str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], check=False,
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_ledger(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The URL of a new, empty database on the server, with PGPASSWORD set for the test."""
    import psycopg

    monkeypatch.setenv("PGPASSWORD", postgres_server.password)
    database = f"ledger_{secrets.token_hex(6)}"
    with psycopg.connect(postgres_server.url(), autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {database}")
    return postgres_server.url(database)

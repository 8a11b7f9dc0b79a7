"""The release ledger: every release dprun publishes, and what it spent, in a JSON-lines file.

Re-running a release with fresh noise gives an attacker another sample to average the
noise away, so `dprun run` consults the ledger before it reads any data row:

* the same spec (sha256) on the same data (dataset id and input fingerprints) is
  refused as already released (exit 5), unless `--new-release` asks to spend again;
* a release whose ε or δ would take the dataset past its lifetime budget
  (`budget.lifetime`) is refused (exit 4) with what is requested, spent and remaining.

The ledger is append-only JSON lines, one entry per published release. Spends are
stored as exact decimal strings (the shortest repr of the float the plan guarantees)
and summed as `fractions.Fraction`, so no float drift accumulates over many releases.

One lock file beside the ledger (`<ledger>.lock`, `fcntl.flock`) is held from the
check until the entry is appended, after the outputs are committed, so two jobs on
one machine can never both pass the check and both spend. The ledger is rewritten
atomically (temporary file, fsync, rename): readers never see a half-written entry.
A ledger that cannot be parsed is an error (exit 6), never silently ignored.
See docs/ledger.md.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dprun import __version__
from dprun.errors import AlreadyReleased, BudgetRefused, OutputError, SpecError

if TYPE_CHECKING:  # the spec package imports Polars, which `dprun --help` does not need
    from dprun.spec import LoadedSpec

LEDGER_VERSION = 1
ENVIRONMENT_VARIABLE = "DPRUN_LEDGER"
FINGERPRINT_PREFIX = "inputs-sha256:"
_DECIMAL = re.compile(r"^(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class LedgerError(OutputError):
    """The ledger is corrupt, or cannot be read, locked or written (exit 6)."""


class ReleasedBefore(AlreadyReleased):
    """The spec was already released on this data; `earlier` is that release's ledger entry."""

    def __init__(self, message: str, earlier: dict[str, Any]) -> None:
        super().__init__(message)
        self.earlier = earlier
        self.details = {"earlier_release": earlier}


class LifetimeExceeded(BudgetRefused):
    """The release would take the dataset past its lifetime budget."""

    def __init__(self, message: str, details: dict[str, Any]) -> None:
        super().__init__(message)
        self.details = details


# --- exact arithmetic ------------------------------------------------------------------------


def exact(value: float | str) -> Fraction:
    """The exact value of a float's shortest decimal repr, or of a decimal string."""
    text = repr(float(value)) if isinstance(value, (int, float)) else value
    if not isinstance(text, str) or not _DECIMAL.match(text):
        raise ValueError(f"not a non-negative decimal number: {text!r}")
    return Fraction(text)


def decimal_text(value: Fraction) -> str:
    """The exact decimal string of a fraction whose denominator is 2^a·5^b (all our sums are)."""
    numerator, denominator = value.numerator, value.denominator
    twos = fives = 0
    while denominator % 2 == 0:
        denominator //= 2
        twos += 1
    while denominator % 5 == 0:
        denominator //= 5
        fives += 1
    if denominator != 1:  # not reachable from decimal inputs; keep a faithful, if long, answer
        return str(value)
    places = max(twos, fives)
    scaled = numerator * 10**places // value.denominator
    sign = 1 if scaled < 0 else 0
    digits = str(abs(scaled))
    while places > 0 and len(digits) > 1 and digits.endswith("0"):
        digits, places = digits[:-1], places - 1
    return str(Decimal((sign, tuple(int(d) for d in digits), -places)))


@dataclass(frozen=True)
class Spend:
    """(ε, δ) as exact fractions."""

    epsilon: Fraction = Fraction(0)
    delta: Fraction = Fraction(0)

    @classmethod
    def of(cls, epsilon: float | str, delta: float | str) -> Spend:
        return cls(exact(epsilon), exact(delta))

    def __add__(self, other: Spend) -> Spend:
        return Spend(self.epsilon + other.epsilon, self.delta + other.delta)

    def __sub__(self, other: Spend) -> Spend:
        return Spend(max(self.epsilon - other.epsilon, Fraction(0)), max(self.delta - other.delta, Fraction(0)))

    def within(self, limit: Spend) -> bool:
        return self.epsilon <= limit.epsilon and self.delta <= limit.delta

    def as_dict(self) -> dict[str, str]:
        return {"epsilon": decimal_text(self.epsilon), "delta": decimal_text(self.delta)}

    def __str__(self) -> str:
        return f"ε={decimal_text(self.epsilon)}, δ={decimal_text(self.delta)}"


# --- where the ledger is, what a release is --------------------------------------------------


def resolve_path(loaded: LoadedSpec | None, override: str | Path | None = None) -> Path | None:
    """The ledger to use: `--ledger` (relative to the working folder), else $DPRUN_LEDGER
    (likewise), else the spec's `ledger:` (relative to the spec file's folder), else none."""
    if override is not None and str(override) != "":
        return Path(override).expanduser().resolve()
    from_environment = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if from_environment:
        return Path(from_environment).expanduser().resolve()
    if loaded is not None and loaded.spec.ledger:
        return loaded.resolve(loaded.spec.ledger)
    return None


def require_ledger_for_lifetime(loaded: LoadedSpec, ledger_path: Path | None) -> None:
    """A lifetime budget cannot be enforced without a ledger: refuse rather than ignore it."""
    if ledger_path is None and loaded.spec.budget.lifetime is not None:
        raise SpecError(loaded.problems([(("budget", "lifetime"),
            "a lifetime budget needs a ledger to be enforced: set `ledger:` in the spec, "
            f"pass --ledger PATH, or set {ENVIRONMENT_VARIABLE}")]))
    if loaded.spec.dataset is not None and not loaded.spec.dataset.strip():
        raise SpecError(loaded.problems([(("dataset",), "the dataset id must not be empty")]))


@dataclass(frozen=True)
class Release:
    """What a run is about to publish, as the ledger sees it."""

    spec_name: str | None
    spec_path: Path
    spec_sha256: str
    dataset: str
    dataset_declared: bool
    inputs: tuple[dict[str, Any], ...]  # name, format, path, bytes, sha256
    requested: Spend
    accounting: str
    lifetime: Spend | None

    @property
    def input_hashes(self) -> list[str]:
        return sorted(str(i["sha256"]) for i in self.inputs)


def dataset_id(declared: str | None, fingerprints: list[dict[str, Any]]) -> str:
    """The declared `dataset:` id, else a digest of the input files' fingerprints
    (independent of their names and paths, so moved or renamed files stay one dataset)."""
    if declared:
        return declared
    joined = "\n".join(sorted(str(f["sha256"]) for f in fingerprints))
    return FINGERPRINT_PREFIX + hashlib.sha256(joined.encode()).hexdigest()


def make_release(loaded: LoadedSpec, plan_total: tuple[float, float], accounting: str,
                 fingerprints: list[dict[str, Any]]) -> Release:
    spec = loaded.spec
    lifetime = spec.budget.lifetime
    return Release(
        spec_name=spec.name,
        spec_path=loaded.path.resolve(),
        spec_sha256=loaded.sha256,
        dataset=dataset_id(spec.dataset, fingerprints),
        dataset_declared=bool(spec.dataset),
        inputs=tuple(fingerprints),
        requested=Spend.of(*plan_total),
        accounting=accounting,
        lifetime=None if lifetime is None else Spend.of(lifetime.epsilon, lifetime.delta),
    )


# --- reading ---------------------------------------------------------------------------------


def read_entries(path: Path) -> list[dict[str, Any]]:
    """Every entry of the ledger at `path`, checked; [] if it does not exist yet."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LedgerError(f"cannot read the ledger {path}: {exc.strerror or type(exc).__name__}") from None
    return parse_entries(raw, path)


def parse_entries(raw: bytes, path: Path) -> list[dict[str, Any]]:
    entries = []
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            raise _corrupt(path, number, "is not valid JSON") from None
        problem = _entry_problem(entry)
        if problem:
            raise _corrupt(path, number, problem)
        entries.append(entry)
    return entries


def _corrupt(path: Path, line: int, problem: str) -> LedgerError:
    return LedgerError(
        f"the ledger {path} is corrupt: line {line} {problem}. dprun will not guess what was spent; "
        "restore the ledger from version control or a backup (it is append-only), then run again"
    )


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "is not a JSON object"
    version = entry.get("ledger_version")
    if version != LEDGER_VERSION:
        if isinstance(version, int) and version > LEDGER_VERSION:
            return f"has ledger_version {version}, written by a newer dprun; upgrade dprun"
        return "has no valid `ledger_version`"
    for key in ("time", "dataset", "spec_sha256", "accounting"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"has no valid `{key}`"
    if not _SHA256.match(entry["spec_sha256"]):
        return "has no valid `spec_sha256`"
    for key in ("epsilon", "delta"):
        value = entry.get(key)
        if not isinstance(value, str) or not _DECIMAL.match(value):
            return f"has no valid `{key}` (an exact decimal string)"
    inputs = entry.get("inputs")
    if not isinstance(inputs, list) or not all(
        isinstance(i, dict) and isinstance(i.get("sha256"), str) and _SHA256.match(i["sha256"]) for i in inputs
    ):
        return "has no valid `inputs` (each with a sha256)"
    outputs = entry.get("outputs")
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("path"), str) for o in outputs
    ):
        return "has no valid `outputs`"
    return None


def entry_spend(entry: dict[str, Any]) -> Spend:
    return Spend(exact(entry["epsilon"]), exact(entry["delta"]))


def spent_on(entries: list[dict[str, Any]], dataset: str) -> tuple[Spend, int]:
    """What the dataset has spent over all its releases, and how many there were."""
    total, count = Spend(), 0
    for entry in entries:
        if entry["dataset"] == dataset:
            total += entry_spend(entry)
            count += 1
    return total, count


def earlier_release(entries: list[dict[str, Any]], release: Release) -> dict[str, Any] | None:
    """The latest entry with this spec on this data (the release key), if any."""
    for entry in reversed(entries):
        if (entry["spec_sha256"] == release.spec_sha256 and entry["dataset"] == release.dataset
                and sorted(i["sha256"] for i in entry["inputs"]) == release.input_hashes):
            return entry
    return None


def totals_by_dataset(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        found.setdefault(entry["dataset"], {"releases": 0, "spent": Spend()})
        found[entry["dataset"]]["releases"] += 1
        found[entry["dataset"]]["spent"] += entry_spend(entry)
    return {key: {"releases": v["releases"], "spent": v["spent"].as_dict()} for key, v in found.items()}


# --- status and the checks -------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """The ledger as it bears on one release: for the checks and `explain-budget`."""

    path: Path
    release: Release
    releases: int  # earlier releases of this dataset
    spent: Spend
    earlier: dict[str, Any] | None  # the same spec on the same data, released before

    @property
    def remaining(self) -> Spend | None:
        lifetime = self.release.lifetime
        return None if lifetime is None else lifetime - self.spent

    @property
    def fits(self) -> bool:
        lifetime = self.release.lifetime
        return lifetime is None or (self.spent + self.release.requested).within(lifetime)

    def as_dict(self) -> dict[str, Any]:
        lifetime, remaining = self.release.lifetime, self.remaining
        return {
            "path": str(self.path),
            "dataset": self.release.dataset,
            "dataset_declared": self.release.dataset_declared,
            "releases": self.releases,
            "spent": self.spent.as_dict(),
            "requested": self.release.requested.as_dict(),
            "spent_after": (self.spent + self.release.requested).as_dict(),
            "lifetime": None if lifetime is None else lifetime.as_dict(),
            "remaining": None if remaining is None else remaining.as_dict(),
            "within_lifetime": self.fits,
            "already_released": None if self.earlier is None else _reference(self.earlier),
        }


def status(path: Path, entries: list[dict[str, Any]], release: Release) -> Status:
    spent, count = spent_on(entries, release.dataset)
    return Status(path, release, count, spent, earlier_release(entries, release))


def check(state: Status, new_release: bool) -> None:
    """Refuse a re-release (unless `new_release`) and any spend beyond the lifetime budget."""
    release = state.release
    if state.earlier is not None and not new_release:
        earlier = state.earlier
        outputs = ", ".join(o["path"] for o in earlier["outputs"]) or "(none)"
        report = earlier.get("report", {}).get("path", "(unknown)")
        raise ReleasedBefore(
            f"already released: this spec (sha256 {release.spec_sha256[:12]}…) was released on the same data "
            f"at {earlier['time']} (release {earlier.get('release', '?')} in ledger {state.path}). "
            f"Its outputs: {outputs}; report: {report}. Publish those again instead: a re-run draws fresh "
            "noise that can be averaged with the earlier release. To spend the budget again on purpose, "
            f"pass --new-release (it costs {release.requested}). Nothing was read or spent.",
            _reference(earlier),
        )
    if not state.fits:
        lifetime = release.lifetime
        assert lifetime is not None and state.remaining is not None
        dataset = release.dataset if release.dataset_declared else f"{release.dataset[:30]}… (its input files)"
        raise LifetimeExceeded(
            f"budget refused: this release would exceed the lifetime budget of dataset {dataset}: "
            f"requested {release.requested} / spent {state.spent} in {state.releases} release(s) / "
            f"remaining {state.remaining} of lifetime {lifetime} (ledger {state.path}). "
            "Nothing was read or spent.",
            {"dataset": release.dataset, "requested": release.requested.as_dict(),
             "spent": state.spent.as_dict(), "remaining": state.remaining.as_dict(),
             "lifetime": lifetime.as_dict(), "releases": state.releases, "ledger": str(state.path)},
        )


def _reference(entry: dict[str, Any]) -> dict[str, Any]:
    return {"release": entry.get("release"), "time": entry["time"], "spec_sha256": entry["spec_sha256"],
            "dataset": entry["dataset"], "outputs": entry["outputs"], "report": entry.get("report")}


# --- the locked ledger -----------------------------------------------------------------------


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


@contextmanager
def locked(path: Path, on_wait: Callable[[str], None] | None = None) -> Iterator[Ledger]:
    """Hold the ledger's lock for the block; yields the ledger read under the lock.

    The lock is `fcntl.flock` on `<ledger>.lock`: the kernel releases it when the process
    ends, however it ends, so it is never left stale. It excludes other processes on this
    machine (and on file systems with working flock); see docs/ledger.md for CI runners.
    """
    folder = path.parent
    if not folder.is_dir():
        raise LedgerError(f"the ledger's folder {folder} does not exist; create it (dprun never creates it, "
                          "so a mistyped ledger path cannot start a fresh, empty ledger)")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise LedgerError(f"the ledger {path} is not writable")
    try:
        descriptor = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise LedgerError(f"cannot open the ledger lock {lock_path(path)}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(f"waiting for the ledger lock {lock_path(path)} (another dprun run holds it)")
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield Ledger(path)
    finally:
        os.close(descriptor)  # releases the lock


class Ledger:
    """A ledger whose lock this process holds: its entries, and an atomic append."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._raw = path.read_bytes()
        except FileNotFoundError:
            self._raw = b""
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {path}: {exc.strerror or type(exc).__name__}") from None
        self.entries = parse_entries(self._raw, path)

    def status(self, release: Release) -> Status:
        return status(self.path, self.entries, release)

    def append(self, entry: dict[str, Any]) -> dict[str, Any]:
        """Append one entry: the old bytes plus one line go to a temporary file, fsynced, then renamed."""
        entry = {"ledger_version": LEDGER_VERSION, "release": len(self.entries) + 1, **entry}
        line = json.dumps(entry, ensure_ascii=False, separators=(", ", ": ")).encode() + b"\n"
        try:
            current = self.path.read_bytes() if self.path.exists() else b""
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger {self.path}: {exc.strerror}") from None
        if current != self._raw:
            raise LedgerError(f"the ledger {self.path} changed while dprun held its lock: something writes it "
                              "without the lock; the new entry was not written")
        prefix = current if not current or current.endswith(b"\n") else current + b"\n"
        temporary = self.path.with_name(f".{self.path.name}.dprun-{secrets.token_hex(6)}.tmp")
        try:
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(descriptor, "wb") as handle:
                    handle.write(prefix + line)
                    handle.flush()
                    os.fsync(handle.fileno())
                if self.path.exists():
                    os.chmod(temporary, self.path.stat().st_mode & 0o7777)
                os.replace(temporary, self.path)
            finally:
                temporary.unlink(missing_ok=True)
            _fsync_folder(self.path.parent)
        except OSError as exc:
            raise LedgerError(f"cannot write the ledger {self.path}: {exc.strerror or type(exc).__name__}") from None
        self._raw = prefix + line
        self.entries.append(entry)
        return entry


def _fsync_folder(folder: Path) -> None:
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def new_entry(release: Release, time: str, outputs: list[dict[str, Any]], report: dict[str, Any],
              report_markdown: dict[str, Any], new_release: bool, test_seed: bool) -> dict[str, Any]:
    return {
        "time": time,
        "dataset": release.dataset,
        "dataset_declared": release.dataset_declared,
        "spec": release.spec_name,
        "spec_path": str(release.spec_path),
        "spec_sha256": release.spec_sha256,
        "inputs": list(release.inputs),
        "epsilon": decimal_text(release.requested.epsilon),
        "delta": decimal_text(release.requested.delta),
        "accounting": release.accounting,
        "outputs": outputs,
        "report": report,
        "report_markdown": report_markdown,
        "new_release": new_release,
        "non_private_test_seed": test_seed,
        "dprun_version": __version__,
    }


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- rendering -------------------------------------------------------------------------------


def status_lines(state: Status | None, lifetime_declared: bool) -> list[str]:
    """Plain-text lines for `explain-budget` (Markdown-safe)."""
    if state is None:
        lines = ["ledger: none configured; re-runs are not refused and no release is recorded"]
        if lifetime_declared:
            lines.append("warning: budget.lifetime is declared but cannot be enforced without a ledger; "
                         "`dprun run` will refuse to run")
        return lines
    release = state.release
    name = release.dataset if release.dataset_declared else f"{release.dataset[:30]}… (from the input files)"
    lines = [
        f"ledger: {state.path}",
        f"dataset {name}: spent {state.spent} in {state.releases} release(s); this spec costs {release.requested}",
    ]
    if release.lifetime is not None and state.remaining is not None:
        verdict = "fits" if state.fits else "does NOT fit: `dprun run` will refuse it (exit 4)"
        lines.append(f"lifetime {release.lifetime}: remaining {state.remaining}; this release {verdict}")
    else:
        lines.append("no lifetime budget declared (budget.lifetime): spending is recorded but not capped")
    if state.earlier is not None:
        lines.append(f"already released at {state.earlier['time']} (release {state.earlier.get('release')}): "
                     "`dprun run` will refuse it (exit 5) unless --new-release")
    return lines

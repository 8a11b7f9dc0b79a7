"""What the ledger holds and how a release is checked against it, whatever stores it.

Re-running a release with fresh noise gives an attacker another sample to average the
noise away, so `dprun run` consults the ledger before it reads any data row:

* the same spec (sha256) on the same data (dataset id and input fingerprints) is
  refused as already released (exit 5), unless `--new-release` asks to spend again;
* a release whose ε or δ would take the dataset past its lifetime budget
  (`budget.lifetime`) is refused (exit 4) with what is requested, spent and remaining.

An entry is one release: reserved (`pending`) before any data row is read, `published`
once its outputs are committed, or `abandoned` after a handled failure that published
nothing. Pending and published entries count as spent; abandoned ones do not. The
stores (`dprun.ledger.store`) keep entries; this module only reads and makes them.
See docs/ledger.md.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dprun import __version__
from dprun.errors import AlreadyReleased, BudgetRefused, OutputError, SpecError
from dprun.ledger.location import ENVIRONMENT_VARIABLE, Location
from dprun.ledger.spend import DECIMAL, Spend, decimal_text, exact

if TYPE_CHECKING:  # the spec package imports Polars, which `dprun --help` does not need
    from dprun.spec.validation import LoadedSpec

LEDGER_VERSION = 1
FINGERPRINT_PREFIX = "inputs-sha256:"
PENDING, PUBLISHED, ABANDONED = "pending", "published", "abandoned"
STATES = (PENDING, PUBLISHED, ABANDONED)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class LedgerError(OutputError):
    """The ledger is corrupt, unreachable, or cannot be read or written (exit 6)."""


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


# --- what a release is --------------------------------------------------------------------


def require_ledger_for_lifetime(loaded: LoadedSpec, location: Location | None) -> None:
    """A lifetime budget cannot be enforced without a ledger: refuse rather than ignore it."""
    if location is None and loaded.spec.budget.lifetime is not None:
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


# --- entries -------------------------------------------------------------------------------


def entry_problem(entry: Any) -> str | None:
    """What is wrong with an entry read from a store or a JSON-lines file, or None."""
    if not isinstance(entry, dict):
        return "is not a JSON object"
    version = entry.get("ledger_version")
    if version != LEDGER_VERSION:
        if isinstance(version, int) and version > LEDGER_VERSION:
            return f"has ledger_version {version}, written by a newer dprun; upgrade dprun"
        return "has no valid `ledger_version`"
    if entry.get("state", PUBLISHED) not in STATES:
        return f"has no valid `state` (one of {', '.join(STATES)})"
    for key in ("time", "dataset", "spec_sha256", "accounting"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            return f"has no valid `{key}`"
    if not _SHA256.match(entry["spec_sha256"]):
        return "has no valid `spec_sha256`"
    for key in ("epsilon", "delta"):
        value = entry.get(key)
        if not isinstance(value, str) or not DECIMAL.match(value):
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


def counts(entry: dict[str, Any]) -> bool:
    """Whether an entry's spend counts: published, or pending (its run may have published, or died after noise)."""
    return entry.get("state", PUBLISHED) != ABANDONED


def entry_spend(entry: dict[str, Any]) -> Spend:
    return Spend(exact(entry["epsilon"]), exact(entry["delta"]))


def spent_on(entries: list[dict[str, Any]], dataset: str) -> tuple[Spend, int, int]:
    """What the dataset has spent over its releases that count, how many they are, and how many are pending."""
    total, count, pending = Spend(), 0, 0
    for entry in entries:
        if entry["dataset"] == dataset and counts(entry):
            total += entry_spend(entry)
            count += 1
            pending += entry.get("state") == PENDING
    return total, count, pending


def earlier_release(entries: list[dict[str, Any]], release: Release) -> dict[str, Any] | None:
    """The latest entry that counts with this spec on this data (the release key), if any."""
    for entry in reversed(entries):
        if (counts(entry) and entry["spec_sha256"] == release.spec_sha256 and entry["dataset"] == release.dataset
                and sorted(i["sha256"] for i in entry["inputs"]) == release.input_hashes):
            return entry
    return None


def totals_by_dataset(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per dataset: its releases that count, how many of them are pending, and their spend."""
    found: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if not counts(entry):
            continue
        total = found.setdefault(entry["dataset"], {"releases": 0, "pending": 0, "spent": Spend()})
        total["releases"] += 1
        total["pending"] += entry.get("state") == PENDING
        total["spent"] += entry_spend(entry)
    return {key: {**v, "spent": v["spent"].as_dict()} for key, v in found.items()}


# --- status and the checks -------------------------------------------------------------------


@dataclass(frozen=True)
class Status:
    """The ledger as it bears on one release: for the checks and `explain-budget`."""

    ledger: str  # where the ledger is, as messages show it (`location.shown`)
    release: Release
    releases: int  # earlier releases of this dataset that count (published or pending)
    pending: int  # of which pending: reserved by a run still going, or one that died
    spent: Spend
    earlier: dict[str, Any] | None  # the same spec on the same data, released (or reserved) before

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
            "path": self.ledger,
            "dataset": self.release.dataset,
            "dataset_declared": self.release.dataset_declared,
            "releases": self.releases,
            "pending": self.pending,
            "spent": self.spent.as_dict(),
            "requested": self.release.requested.as_dict(),
            "spent_after": (self.spent + self.release.requested).as_dict(),
            "lifetime": None if lifetime is None else lifetime.as_dict(),
            "remaining": None if remaining is None else remaining.as_dict(),
            "within_lifetime": self.fits,
            "already_released": None if self.earlier is None else _reference(self.earlier),
        }


def status(ledger: str, entries: list[dict[str, Any]], release: Release) -> Status:
    spent, count, pending = spent_on(entries, release.dataset)
    return Status(ledger, release, count, pending, spent, earlier_release(entries, release))


def check(state: Status, new_release: bool) -> None:
    """Refuse a re-release (unless `new_release`) and any spend beyond the lifetime budget."""
    release = state.release
    if state.earlier is not None and not new_release:
        earlier = state.earlier
        if earlier.get("state") == PENDING:
            raise ReleasedBefore(
                f"already being released: this spec (sha256 {release.spec_sha256[:12]}…) on the same data was "
                f"reserved at {earlier['time']} (release {earlier['release']} in ledger {state.ledger}) by a run "
                "that has not finished, or that died. Wait for it, or see `dprun ledger show`; to spend the "
                f"budget again on purpose, pass --new-release (it costs {release.requested}). "
                "Nothing was read or spent.",
                _reference(earlier),
            )
        outputs = ", ".join(o["path"] for o in earlier["outputs"]) or "(none)"
        report = earlier.get("report", {}).get("path", "(unknown)")
        raise ReleasedBefore(
            f"already released: this spec (sha256 {release.spec_sha256[:12]}…) was released on the same data "
            f"at {earlier['time']} (release {earlier.get('release', '?')} in ledger {state.ledger}). "
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
            f"remaining {state.remaining} of lifetime {lifetime} (ledger {state.ledger}). "
            "Nothing was read or spent.",
            {"dataset": release.dataset, "requested": release.requested.as_dict(),
             "spent": state.spent.as_dict(), "remaining": state.remaining.as_dict(),
             "lifetime": lifetime.as_dict(), "releases": state.releases, "ledger": state.ledger},
        )


def _reference(entry: dict[str, Any]) -> dict[str, Any]:
    return {"release": entry.get("release"), "state": entry.get("state", PUBLISHED), "time": entry["time"],
            "spec_sha256": entry["spec_sha256"], "dataset": entry["dataset"], "outputs": entry["outputs"],
            "report": entry.get("report")}


@dataclass(frozen=True)
class Pending:
    """What a run (or a profile, `kind`) reserves besides its release: its id, the outputs and
    report it will write, not yet hashed, and whether it is made with a test seed."""

    release_id: str
    outputs: list[dict[str, Any]]
    report: dict[str, Any]
    test_seed: bool
    kind: str = "release"


def pending_entry(release: Release, pending: Pending, new_release: bool, time: str) -> dict[str, Any]:
    """The entry a run reserves before it reads data: its outputs and report named, not yet hashed.

    `publish` then adds each file's sha256 and the time it was published.
    """
    return {
        "ledger_version": LEDGER_VERSION,
        "release_id": pending.release_id,
        "kind": pending.kind,
        "state": PENDING,
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
        "outputs": pending.outputs,
        "report": pending.report,
        "new_release": new_release,
        "non_private_test_seed": pending.test_seed,
        "dprun_version": __version__,
    }

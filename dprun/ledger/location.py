"""Where the ledger is: a file path (an embedded SQLite database) or a `postgresql://` URL.

The location comes from `--ledger` (relative to the working folder), else $DPRUN_LEDGER
(likewise), else the spec's `ledger:` (relative to the spec file's folder). A URL is
never shown with its password: `shown` is the only form that goes into a message, a
report or a log line. This module imports nothing heavy: `dprun --help` and the spec
checks use it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from dprun.errors import OutputError
from dprun.small_files import path_problem

if TYPE_CHECKING:  # the spec package imports Polars, which `dprun --help` does not need
    from dprun.spec.validation import LoadedSpec

ENVIRONMENT_VARIABLE = "DPRUN_LEDGER"
DATABASE_SCHEMES = ("postgresql://", "postgres://")
# SQLite writes its rollback journal beside the database while a transaction is open.
JOURNAL_SUFFIX = "-journal"

Location = Path | str  # a path, or a database URL


def is_database_url(text: str) -> bool:
    return text.lower().startswith(DATABASE_SCHEMES)


def resolve(loaded: LoadedSpec | None, override: str | Path | None = None) -> Location | None:
    """The ledger to use: `override` (from --ledger), else $DPRUN_LEDGER, else the spec's `ledger:`, else none."""
    if override is not None and str(override) != "":
        return _location(str(override), Path.cwd())
    from_environment = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if from_environment:
        return _location(from_environment, Path.cwd())
    if loaded is not None and loaded.spec.ledger:
        return _location(loaded.spec.ledger, loaded.base_dir)
    return None


def _location(text: str, base: Path) -> Location:
    if is_database_url(text):
        try:
            urlsplit(text).port  # parses the host and port: a malformed one raises here, not mid-run
        except ValueError as exc:
            # Not shown: an unparsable URL cannot be stripped of its password.
            raise OutputError(f"the ledger URL is not a valid URL ({exc}); check its host and port") from None
        return text
    path = Path(text).expanduser()
    problem = path_problem(str(path if path.is_absolute() else base / path))
    if problem is not None:
        raise OutputError(f"the ledger path: {problem}")
    located = path if path.is_absolute() else base / path
    try:
        # The folder resolved, the name kept: a ledger path that is a link to a file a spec publishes
        # (out/report.md) is compared with that path as the spec writes it (`rules.published_path`).
        return located.parent.resolve() / located.name
    except (OSError, RuntimeError):  # a symbolic link loop: the ledger's own check names it
        return located


def shown(location: Location) -> str:
    """The location as messages show it: a URL without its password."""
    if isinstance(location, Path):
        return str(location)
    return redacted(location)


def redacted(url: str) -> str:
    """`url` without a password, in the user part or in the query string."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}@{host}"
    query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in parse_qsl(parts.query)])
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_password(url: str) -> bool:
    parts = urlsplit(url)
    return parts.password is not None or any(k.lower() == "password" for k, _ in parse_qsl(parts.query))


def secrets_in(url: str) -> list[str]:
    """The passwords this URL or the environment hold, to be scrubbed from any message."""
    parts = urlsplit(url)
    found = [parts.password or "", os.environ.get("PGPASSWORD", "")]
    found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password"]
    return [secret for secret in found if secret]


def companion_files(path: Path) -> set[Path]:
    """The ledger file and the files SQLite keeps beside it: none may be a file a spec reads or publishes."""
    return {path, path.with_name(path.name + JOURNAL_SUFFIX)}

"""dprun's own exception types and the exit codes they map to.

Every failure a user can cause is one of these; the CLI turns them into a
message and an exit code in one place (`dprun.cli`). Messages never quote a
value read from a data file: privacy units and metric values are secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """Documented in docs/ci.md; scripts rely on these numbers."""

    OK = 0
    CHECK_FAILED = 1  # the spec or the input schemas failed validation
    USAGE_OR_INTERNAL = 2  # bad command line, or a bug in dprun
    DATA_INVALID = 3  # the data rows could not be processed as the spec says
    BUDGET_REFUSED = 4  # the release would exceed a lifetime budget
    ALREADY_RELEASED = 5  # this spec was already released on this data
    IO_FAILED = 6  # an output could not be written, or exists already
    NOT_VERIFIED = 7  # `dprun verify`: the files at the output paths are not the report's release
    INTERRUPTED = 130  # SIGINT/SIGTERM; nothing was published


@dataclass(frozen=True)
class Problem:
    """One finding about a spec: where it is and what is wrong."""

    file: str
    line: int | None
    column: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}:{self.column or 1}"
        field = f" {self.field}:" if self.field else ""
        return f"{where}:{field} {self.message}"

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "field": self.field,
            "message": self.message,
        }


class DprunError(Exception):
    exit_code: ExitCode = ExitCode.USAGE_OR_INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def problems(self) -> list[Problem]:
        return [Problem(file="", line=None, column=None, field="", message=self.message)]


class SpecError(DprunError):
    """The spec, or the input schemas it names, failed one or more checks."""

    exit_code = ExitCode.CHECK_FAILED

    def __init__(self, found: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in found))
        self.found = found

    def problems(self) -> list[Problem]:
        return list(self.found)


class DataError(DprunError):
    """Data rows could not be processed; names a column and a problem, never a value."""

    exit_code = ExitCode.DATA_INVALID


class OutputError(DprunError):
    """An output or the report could not be published; nothing was."""

    exit_code = ExitCode.IO_FAILED


class BudgetRefused(DprunError):
    exit_code = ExitCode.BUDGET_REFUSED


class AlreadyReleased(DprunError):
    exit_code = ExitCode.ALREADY_RELEASED


class NotVerified(DprunError):
    """`dprun verify`: an output is missing, or its sha256 is not the one its report gives."""

    exit_code = ExitCode.NOT_VERIFIED


class Interrupted(DprunError):
    exit_code = ExitCode.INTERRUPTED

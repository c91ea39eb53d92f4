"""One exception hierarchy for everything the supervisor reports to a person.

The CLI turns any ``SupervisorError`` into one line and its ``exit_code``: 2 for bad input
(a file, a field, an argument a person can fix), 3 when the supervisor, Ray or storage
failed. Anything else escaping a command is a bug and keeps its traceback.
"""

from __future__ import annotations

# Exit codes of every `supervisor` command (docs/operations.md, DESIGN "Exit codes").
EXIT_OK = 0
"""The job finished healthy / the check passed."""
EXIT_FAILED = 1
"""The job failed or escalated / the check found what `--fail-on` names."""
EXIT_BAD_INPUT = 2
"""Bad input: a file, field or argument that a person must fix."""
EXIT_BROKEN = 3
"""The supervisor, Ray or storage failed (nothing wrong with the input)."""


def printable(text: str) -> str:
    """``text`` with control characters escaped (``\\n``, ``\\x1b``): a file name holding a newline
    or a terminal escape stays on its one line and cannot forge another ``error:`` line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


class SupervisorError(Exception):
    """Base of every expected failure: bad input, unreachable storage, a refused action.

    ``source`` names the file (or bucket, or job) and ``field`` the dotted path inside it,
    so the one-line message reads ``<source>: <field>: <what was wrong>``. ``exit_code``
    defaults to the class's (bad input unless the class says otherwise).
    """

    exit_code: int = EXIT_BAD_INPUT

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        field: str | None = None,
        exit_code: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.field = field
        if exit_code is not None:
            self.exit_code = exit_code

    def one_line(self) -> str:
        parts = [printable(p) for p in (self.source, self.field) if p]
        parts.append(printable(" ".join(self.message.split())))
        return ": ".join(parts)

    def __str__(self) -> str:
        return self.one_line()


class ConfigError(SupervisorError):
    """A job.yaml (or other config file) that cannot be read or does not validate."""


class PolicyError(SupervisorError):
    """A policy file that does not validate, or a plan the engine refuses to make."""


class TraceError(SupervisorError):
    """A trace or log that cannot be read at all (garbage lines are skipped, not raised)."""


class CheckpointError(SupervisorError):
    """A checkpoint that is missing, incomplete, corrupt, or not allowed as a target."""


class StorageError(SupervisorError):
    """Storage that cannot be reached or refuses an operation after bounded retries."""

    exit_code = EXIT_BROKEN


class IncidentStoreError(SupervisorError):
    """The incident database cannot be opened, migrated or written, or holds no such record.

    Exit code 2 (a wrong path, id or value given by a person) unless raised with
    ``exit_code=EXIT_BROKEN`` (a database that fails under the supervisor: I/O, locks, lost file).
    """


class RuntimeBackendError(SupervisorError):
    """Ray (or the worker group on it) cannot be reached, started or controlled."""

    exit_code = EXIT_BROKEN

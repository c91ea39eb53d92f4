"""One exception hierarchy for everything the supervisor reports to a person.

The CLI turns any ``SupervisorError`` into one line and exit code 2; anything else
escaping a command is a bug and keeps its traceback.
"""

from __future__ import annotations


class SupervisorError(Exception):
    """Base of every expected failure: bad input, unreachable storage, a refused action.

    ``source`` names the file (or bucket, or job) and ``field`` the dotted path inside it,
    so the one-line message reads ``<source>: <field>: <what was wrong>``.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.field = field

    def one_line(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        parts.append(" ".join(self.message.split()))
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


class IncidentStoreError(SupervisorError):
    """The incident database cannot be opened, migrated or written."""


class RuntimeBackendError(SupervisorError):
    """Ray (or the worker group on it) cannot be reached, started or controlled."""

"""What a step of the loop does to the job, as values: the executors (``actions.base``), the plan
runner (``plans``) and the incident flow (``incidents``) return them, and ``Controller.apply`` alone
carries them out, in order, each keyed or idempotent (docs/architecture.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rewind:
    """The job continues from checkpoint ``to_step``; keyed: carried out once."""

    to_step: int
    key: str
    reason: str


@dataclass(frozen=True)
class NoteOverrides:
    """The detector learns of a fix the ranks applied after ``step``."""

    step: int
    params: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class SetFrozen:
    """The ranks park at a boundary (``True``, acknowledged) or go on (``False``)."""

    frozen: bool


@dataclass(frozen=True)
class ReleaseLatest:
    """`latest` may advance again as far as incident ``incident`` holds it."""

    incident: int


@dataclass(frozen=True)
class RestartGroup:
    """A rollback carried out as a group restart from ``to_step`` (None: from the run's start, no
    checkpoint resumed); keyed: carried out once."""

    to_step: int | None
    key: str
    reason: str


@dataclass(frozen=True)
class EndJob:
    """The job ends in ``phase`` once the workers are down (a stop, an escalation)."""

    phase: str
    reason: str


@dataclass(frozen=True)
class KillWorkers:
    """A directive that ends training could not reach every rank: take the group down."""

    reason: str


@dataclass(frozen=True)
class FinishAction:
    """The timeline event of a plan's action is marked done (or failed) with ``result``: after the
    effects of its outcome, so a supervisor killed in between polls the action again."""

    event_id: int
    result: dict[str, Any]
    failed: bool


Effect = (
    Rewind | NoteOverrides | SetFrozen | ReleaseLatest | RestartGroup | EndJob | KillWorkers | FinishAction
)

"""What a step of the loop does to the job, as values: the executors (``actions.base``), the plan
runner (``plans``) and the incident flow (``incidents``) return them, and ``Controller.apply`` alone
carries them out, in order, each keyed or idempotent (docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.core.model import Diagnosis
from supervisor.core.policy import Plan
from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime.state import ActivePlan, JobPhase
from supervisor.sdk.directives import Directive


class Effect:
    """One thing a step of the loop does to the job: each class below is one kind."""


@dataclass(frozen=True)
class Issue(Effect):
    """A directive to every rank: on disk before any rank can fetch it; issued once per id."""

    directive: Directive


@dataclass(frozen=True)
class BlockLatest(Effect):
    """`latest` stops advancing until incident ``incident`` releases it (``ReleaseLatest``)."""

    incident: int
    reason: str


@dataclass(frozen=True)
class Submit(Effect):
    """``fn(*args)`` runs on the supervisor's I/O pool as task ``name``, once per name; an executor
    reads its result with ``Runtime.result_of(name)``."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class SubmitReplay(Effect):
    """The offline replay from checkpoint ``step`` as task ``name`` (a Ray task), once per name."""

    name: str
    step: int
    suspects: tuple[str, ...]
    numeric: bool


@dataclass(frozen=True)
class Rewind(Effect):
    """The job continues from checkpoint ``to_step``; keyed: carried out once."""

    to_step: int
    key: str
    reason: str


@dataclass(frozen=True)
class NoteOverrides(Effect):
    """The detector learns of a fix the ranks applied after ``step``."""

    step: int
    params: dict[str, Any]
    reason: str


@dataclass(frozen=True)
class SetFrozen(Effect):
    """The ranks park at a boundary (``True``, acknowledged) or go on (``False``)."""

    frozen: bool


@dataclass(frozen=True)
class ReleaseLatest(Effect):
    """`latest` may advance again as far as incident ``incident`` holds it."""

    incident: int


@dataclass(frozen=True)
class RestartGroup(Effect):
    """A rollback carried out as a group restart from ``to_step`` (None: from the run's start, no
    checkpoint resumed); keyed: carried out once."""

    to_step: int | None
    key: str
    reason: str


@dataclass(frozen=True)
class EndJob(Effect):
    """The job ends in ``phase`` once the workers are down (a stop, an escalation)."""

    phase: str
    reason: str


@dataclass(frozen=True)
class KillWorkers(Effect):
    """A directive that ends training could not reach every rank: take the group down."""

    reason: str


@dataclass(frozen=True)
class BeginAction(Effect):
    """The ``pending`` timeline event of a plan's action, keyed by its action id, with what it is
    started with (its parameters and memo): on disk before the action starts."""

    incident: int
    kind: EventKind
    step: int
    payload: dict[str, Any]
    action_id: str
    irreversible: bool = False
    """Once it began, a changed diagnosis no longer re-makes the plan (``ActivePlan.irreversible``)."""


@dataclass(frozen=True)
class FinishAction(Effect):
    """The timeline event of a plan's action is marked done (or failed) with ``result``: after the
    effects of its outcome, so a supervisor killed in between polls the action again."""

    event_id: int
    result: dict[str, Any]
    failed: bool


@dataclass(frozen=True)
class NextAction(Effect):
    """The active plan (incident ``incident``'s plan ``plan_no``) moves past its action ``index``:
    done, or moot."""

    incident: int
    plan_no: int
    index: int


@dataclass(frozen=True)
class AmendPlan(Effect):
    """The active plan (incident ``incident``'s plan ``plan_no``) goes on as ``plan`` (after a failed
    action, its ``on_failure`` follow-up in place of the rest)."""

    incident: int
    plan_no: int
    plan: Plan


@dataclass(frozen=True)
class StartPlan(Effect):
    """``active`` is the plan in force: a new incident's, or one re-made (a changed diagnosis, a
    failed observation); its first action begins once it is on disk (``Persist``)."""

    active: ActivePlan


@dataclass(frozen=True)
class EndPlan(Effect):
    """No plan is active any more: no incident is acted on until the next one's plan is made."""


@dataclass(frozen=True)
class OpenIncident(Effect):
    """A new incident, ``open``, for the detector's ``key``; the controller sends its id back to the
    flow, which goes on with it (``IncidentFlow.observe``)."""

    diagnosis: Diagnosis
    key: int
    step: int


@dataclass(frozen=True)
class ReopenIncident(Effect):
    """Resolved incident ``incident`` opens again for attempt ``attempt``: its fault came back."""

    incident: int
    diagnosis: Diagnosis
    reason: str
    attempt: int
    step: int
    key: int


@dataclass(frozen=True)
class MoveIncident(Effect):
    """Incident ``incident`` moves to ``to`` when the move is valid from its state then (a no-op
    otherwise, e.g. frozen -> frozen); the store records the reason with the move."""

    incident: int
    to: IncidentState
    reason: str
    step: int | None


@dataclass(frozen=True)
class RecordEvent(Effect):
    """An event (a note: a plan made, what was skipped, the downtime) in an incident's timeline."""

    incident: int
    kind: EventKind
    step: int | None
    payload: dict[str, Any]
    actor: str = "supervisor"


@dataclass(frozen=True)
class SetPhase(Effect):
    """The job's phase becomes ``phase`` (``Controller.set_phase`` logs old -> new and the reason);
    with ``only_from``, only while the phase is that one when the effect is carried out."""

    phase: JobPhase
    reason: str
    only_from: JobPhase | None = None


@dataclass(frozen=True)
class Persist(Effect):
    """The state is on disk now (a plan made is written before its first action begins)."""

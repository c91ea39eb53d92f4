"""The incident state machine and the vocabulary of its timeline.

An incident is a persisted state machine (docs/architecture.md, One writer per state). Each state documents what it
means; ``TRANSITIONS`` lists every valid move and ``IncidentStore.transition`` is the only
way to change a state: it checks the move and appends a ``state_changed`` event carrying
the reason, in the same transaction.

::

    ┌──────────────────── reopened (the fault came back, next attempt) ◄─────────┐
    ▼                                                                            │
    open ──► frozen ──► acting ──► observing ──► resolved ───────────────────────┘
      │        │          │  ▲          │
      │        │          │  └──────────┘  (observation failed, next attempt)
      │        └──────────┴──────────────┴──► escalated
      │        └──────────┴──────────────┴──► stopped    (`supervisor stop` during the plan)
      └──► dismissed   (metric artifact, benign shift, false alarm)

``resolved``, ``escalated``, ``stopped`` and ``dismissed`` are terminal: nothing acts on them. One move
leaves a terminal state: a fault that comes back within the policy's
``recurrence.reopen_within_steps`` of a *resolved* incident reopens it (``resolved → open``,
same id, next attempt; ``IncidentStore.reopen`` records the reason and the attempt number).
The policy's ``recurrence.max_attempts`` bounds the attempts before escalation.
``escalated``, ``stopped`` and ``dismissed`` are final: a person decided, or there was nothing to
fix. ``stopped`` says a person ended the job while the incident was being handled: its timeline
notes what was done and what was not (a fix never observed is unverified, never resolved).
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from supervisor.errors import IncidentStoreError

E = TypeVar("E", bound=Enum)


class IncidentState(str, Enum):
    OPEN = "open"
    """Detected and recorded; no action has run yet (alerting and metric checks happen here)."""
    FROZEN = "frozen"
    """Training is held at a step boundary while the incident is examined (snapshot, block latest)."""
    ACTING = "acting"
    """Recovery actions are running: replay, rollback, fix."""
    OBSERVING = "observing"
    """Training resumed under the fix inside an observation window; checks are compared to the baseline."""
    RESOLVED = "resolved"
    """The observation window passed and training continues normally."""
    ESCALATED = "escalated"
    """The supervisor gave up (an action failed, attempts ran out, or policy said so): a person decides."""
    STOPPED = "stopped"
    """The job was stopped on request (`supervisor stop`, Ctrl-C) before the incident was handled:
    a ``note`` event lists the actions done and not done; a person decides."""
    DISMISSED = "dismissed"
    """Not a real training problem: a metric artifact, a benign shift or a false alarm."""

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def is_active(self) -> bool:
        return not self.is_terminal

    @property
    def is_final(self) -> bool:
        """No move leaves it (``resolved`` is terminal but may be reopened)."""
        return not TRANSITIONS[self]


_TERMINAL = frozenset(
    {IncidentState.RESOLVED, IncidentState.ESCALATED, IncidentState.STOPPED, IncidentState.DISMISSED}
)

S = IncidentState
#: Every valid move. Anything else raises ``IncidentStoreError`` naming the valid choices.
TRANSITIONS: dict[IncidentState, frozenset[IncidentState]] = {
    S.OPEN: frozenset({S.FROZEN, S.ACTING, S.OBSERVING, S.RESOLVED, S.ESCALATED, S.STOPPED, S.DISMISSED}),
    S.FROZEN: frozenset({S.ACTING, S.OBSERVING, S.RESOLVED, S.ESCALATED, S.STOPPED, S.DISMISSED}),
    S.ACTING: frozenset({S.OBSERVING, S.RESOLVED, S.ESCALATED, S.STOPPED}),
    S.OBSERVING: frozenset({S.ACTING, S.RESOLVED, S.ESCALATED, S.STOPPED}),
    S.RESOLVED: frozenset({S.OPEN}),  # reopened: only through IncidentStore.reopen
    S.ESCALATED: frozenset(),
    S.STOPPED: frozenset(),
    S.DISMISSED: frozenset(),
}
del S


#: The one move out of a terminal state; it carries an attempt number (``IncidentStore.reopen``).
REOPEN = (IncidentState.RESOLVED, IncidentState.OPEN)


def can_transition(old: IncidentState, new: IncidentState) -> bool:
    return new in TRANSITIONS[old]


class EventKind(str, Enum):
    """Typed timeline events (docs/incidents.md)."""

    DETECTED = "detected"
    METRIC_CHECK = "metric_check"
    FROZE = "froze"
    SNAPSHOT = "snapshot"
    LATEST_BLOCKED = "latest_blocked"
    DIAGNOSED = "diagnosed"
    REPLAYED = "replayed"
    ROLLED_BACK = "rolled_back"
    FIX_APPLIED = "fix_applied"
    OBSERVATION = "observation"
    RESUMED = "resumed"
    ESCALATED = "escalated"
    ALERT_SENT = "alert_sent"
    DISMISSED = "dismissed"
    STATE_CHANGED = "state_changed"
    # Machinery faults: not part of the incident itself, but they explain gaps in the timeline.
    WORKER_RESTARTED = "worker_restarted"
    SUPERVISOR_RESUMED = "supervisor_resumed"
    NOTE = "note"


class EventStatus(str, Enum):
    """An action's event is written ``pending`` before it runs and marked ``done``/``failed`` after."""

    PENDING = "pending"
    DONE = "done"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        return self is not EventStatus.PENDING


def parse_enum(enum: type[E], value: object, what: str) -> E:
    """``enum(value)`` with an error that lists the valid choices (registry-style failure)."""
    if isinstance(value, enum):
        return value
    try:
        return enum(value)
    except ValueError:
        choices = ", ".join(str(m.value) for m in enum)
        raise IncidentStoreError(f"unknown {what} {value!r}; valid: {choices}") from None

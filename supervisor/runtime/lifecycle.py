"""The worker group's lifecycle as the control loop sees it: one value, each state carrying its data.

Its transitions::

    Running ── EndJob (a stop action, an escalation) ──► Ending ── a stop asked for ──► Stopping
    Running ── a stop asked for ──► Stopping
    Running | Ending | Stopping ── ranks held at their last step given a Finish ──► the same, released
    Running | Ending | Stopping ── a group fault, a rollback by restart ──► Relaunching(restart, then)
    Relaunching ── at restart.due ──► then: what the restart interrupted, a stop's clock running on
    any ── every rank returned, workers killed, a start or a restart failed ──► Ended(ending)
    Ended ── EndJob (a plan that goes on once the workers are gone) ──► Ended(ending)

``Controller.set_lifecycle`` alone changes it (docs/architecture.md, "One writer per state"). It is
not persisted: a re-attached supervisor starts in ``Running`` (``Relaunching`` when it finds no
workers). Each state's methods are its transitions: they return the next state and do nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from supervisor.runtime.restarts import Restarting
from supervisor.runtime.state import JobPhase


@dataclass(frozen=True, kw_only=True)
class Running:
    """Workers are placed (or being placed) and train: phase starting, running or incident."""

    released: str | None = None
    """The ``Finish`` directive this supervisor issued to ranks held at their last step, once issued."""

    def resumed(self) -> Running | Ended:
        """What the job is, or will be once a restart in progress is launched."""
        return self

    def decided(self, phase: JobPhase, reason: str) -> Running | Ended:
        """The job's end is decided (``effects.EndJob``): it ends in ``phase`` once the workers are down."""
        return Ending(phase=phase, reason=reason, released=self.released)

    def stopping(self, reason: str, sent_at: float) -> Running | Ended:
        """A requested stop's directive went out at ``sent_at``: the job ends as stopped, for
        ``reason``, unless its end was decided before."""
        return Stopping(phase=JobPhase.STOPPED, reason=reason, sent_at=sent_at, released=self.released)

    def taken_down(self) -> Running | Ended:
        """The workers are gone: a decided end is kept."""
        return Ended()


@dataclass(frozen=True, kw_only=True)
class Ending(Running):
    """The workers train on; once they are down the job ends in ``phase`` (a stop action, an
    escalation; a later decision replaces an earlier one)."""

    phase: JobPhase
    reason: str

    def decided(self, phase: JobPhase, reason: str) -> Running | Ended:
        return replace(self, phase=phase, reason=reason)  # a stop's clock runs on

    def stopping(self, reason: str, sent_at: float) -> Running | Ended:
        return Stopping(phase=self.phase, reason=self.reason, sent_at=sent_at, released=self.released)

    def taken_down(self) -> Running | Ended:
        return Ended(self)


@dataclass(frozen=True, kw_only=True)
class Stopping(Ending):
    """A stop asked for (``Controller.request_stop``) went out as a directive at ``sent_at``
    (``time.monotonic()``), once: workers not down ``directive_timeout_s`` later are killed."""

    sent_at: float


@dataclass(frozen=True)
class Ended:
    """The workers are gone (finished, killed, or the group failed): no record and no ack will come.
    The job ends once nothing is left to handle, in ``ending`` when one was decided."""

    ending: Ending | None = None

    def resumed(self) -> Running | Ended:
        return self

    def decided(self, phase: JobPhase, reason: str) -> Running | Ended:
        return Ended(Ending(phase=phase, reason=reason))

    def stopping(self, reason: str, sent_at: float) -> Running | Ended:
        return self

    def taken_down(self) -> Running | Ended:
        return self


@dataclass(frozen=True)
class Relaunching:
    """No workers: the old generation is down and its successor launches at ``restart.due`` (phase
    restarting; no plan step runs meanwhile). ``then``: what the job is once it is launched -- a
    decided end and a stop's clock survive the restart."""

    restart: Restarting
    then: Running | Ended

    def resumed(self) -> Running | Ended:
        return self.then

    def decided(self, phase: JobPhase, reason: str) -> Relaunching:
        return replace(self, then=self.then.decided(phase, reason))

    def stopping(self, reason: str, sent_at: float) -> Relaunching:
        return replace(self, then=self.then.stopping(reason, sent_at))

    def taken_down(self) -> Relaunching:
        return replace(self, then=self.then.taken_down())  # it still launches, then ends


Lifecycle = Running | Relaunching | Ended

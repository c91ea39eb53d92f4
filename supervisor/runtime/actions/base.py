"""What an action executor is, and what it may read of the job.

An executor is a small state machine driven by the controller loop:

1. ``prepare`` decides, without side effects, what the action will do (e.g. the directive
   and its id) -- the controller writes this memo into the ``pending`` timeline event;
2. ``start`` returns what doing it takes (a directive, a task, a block on `latest`) as effects.
   It must be idempotent: a restarted supervisor that finds the event still pending calls it
   again with the same memo (a directive with the same id is not issued twice);
3. ``poll`` returns ``None`` while the work is in flight (``Waiting`` when that takes a further
   effect: a fallback directive, a task it hands off to), then an ``Outcome``.

Executors read the job through ``Runtime`` and change nothing: what an action does is a value
(``effects``) that the controller alone carries out; an outcome carries those it needs
(``Outcome.effects``), carried out before the action is marked done (docs/architecture.md)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from supervisor.checkpoint.manifest import Manifest
from supervisor.checkpoint.store import BlockState
from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.core.model import Diagnosis
from supervisor.core.policy import Policy
from supervisor.runtime.directives import DirectiveLog
from supervisor.runtime.effects import Effect, Issue
from supervisor.runtime.observe import StepStats
from supervisor.sdk.directives import Directive
from supervisor.storage.base import Backend


@dataclass(frozen=True)
class Outcome:
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    skipped: bool = False
    """It did not happen because training ended: recorded as skipped, never as done."""
    effects: tuple[Effect, ...] = ()
    """What the job must do for this outcome to hold, carried out (in order) before it is recorded."""

    @classmethod
    def done(cls, **result: Any) -> Outcome:
        return cls(True, result)

    @classmethod
    def fail(cls, reason: str, **result: Any) -> Outcome:
        return cls(False, result, reason)

    @classmethod
    def skip(cls, reason: str, **result: Any) -> Outcome:
        return cls(False, result | {"skipped": True}, f"skipped: {reason}", skipped=True)


@dataclass(frozen=True)
class Waiting:
    """The action is still in flight, and needs ``effects`` carried out to go on."""

    effects: tuple[Effect, ...]


class Checkpoints(Protocol):
    """What an executor may read of the checkpoint store (it changes it by effects: ``BlockLatest``)."""

    @property
    def backend(self) -> Backend: ...
    def find(self, step: int) -> Manifest | None: ...
    def block_state(self) -> BlockState | None: ...


class Runtime(Protocol):
    """What an executor may read of the job (the controller's read-only face)."""

    job: JobSpec
    policy: Policy
    settings: RuntimeSettings
    stop_requested: str | None
    """Why a person asked the job to stop (``supervisor stop``, Ctrl-C); None: nobody did."""
    directives: DirectiveLog
    world_size: int

    @property
    def checkpoints(self) -> Checkpoints | None: ...

    current_step: int
    generation_started_at: float

    @property
    def incident_id(self) -> int: ...
    @property
    def diagnosis(self) -> Diagnosis: ...

    def rollback_target(self, max_step: int, min_mark: str = "healthy") -> tuple[int, dict[str, Any]]: ...
    def window_after(self, step: int) -> list[StepStats]: ...
    def baseline(self) -> dict[str, Any] | None: ...
    def result_of(self, name: str) -> tuple[bool, Any] | None: ...
    def incidents_opened_since(self, step: int) -> int: ...
    def recurrences_since(self, step: int) -> list[dict[str, Any]]: ...
    def training_ended(self) -> bool: ...
    def workers_gone(self) -> bool: ...
    def batch_range(self, first_step: int, last_step: int) -> tuple[int, int]: ...


class Executor(Protocol):
    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]: ...
    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[Effect, ...]: ...
    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | Waiting | None: ...


def await_acks(rt: Runtime, directive_id: str, started_at: float) -> Outcome | None:
    """Done once every rank acknowledged the directive; failed if one refused or time ran out;
    skipped (never done) when the workers are gone before they could apply it."""
    failed = rt.directives.failed_on(directive_id)
    if failed:
        return Outcome.fail(f"rank(s) {sorted(failed)} could not apply directive {directive_id}")
    acked = rt.directives.acked_by(directive_id)
    if set(acked) >= set(range(rt.world_size)):
        return Outcome.done(directive=directive_id, acked_at_step=max(acked.values()), ranks=sorted(acked))
    if rt.workers_gone():
        return Outcome.skip("training ended before the workers could apply it", directive=directive_id)
    # A directive re-delivered to a new generation gets the full time again from its start.
    if time.time() - max(started_at, rt.generation_started_at) > rt.settings.directive_timeout_s:
        missing = sorted(set(range(rt.world_size)) - set(acked))
        return Outcome.fail(
            f"rank(s) {missing} did not acknowledge directive {directive_id} within "
            f"{rt.settings.directive_timeout_s:.0f}s (RuntimeSettings.directive_timeout_s)"
        )
    return None


class DirectiveAction:
    """An action that is one directive to every rank, done when all ranks acknowledged it."""

    def directive(self, rt: Runtime, params: dict[str, Any], action_id: str) -> Directive:
        raise TypeError(f"{type(self).__name__} defines neither directive() nor its own prepare()")

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        return {"directive": self.directive(rt, params, action_id).to_dict(), "started_at": time.time()}

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[Effect, ...]:
        return (Issue(Directive.from_dict(memo["directive"])),)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | Waiting | None:
        out = await_acks(rt, memo["directive"]["id"], memo["started_at"])
        if out is not None and out.ok:
            return self.finished(rt, params, memo, out)
        return out

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        return out

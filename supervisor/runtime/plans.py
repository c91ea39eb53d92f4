"""Carrying out one incident's plan, action by action, through the incident store.

Every action: (1) ``prepare`` its memo, (2) write the ``pending`` event with that memo,
(3) ``start`` it, (4) ``poll`` until it has an outcome, (5) mark the event ``done`` or
``failed``. (2) and (5) are effects the runner returns (``BeginAction``, ``FinishAction``), which
the controller carries out before it steps again. The event is keyed by an action id (incident,
plan number, index, name), so after a restart an action whose event is ``done`` is skipped and
one that is ``pending`` is polled (and idempotently re-started), never run again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from supervisor.core.policy.actions import ACTIONS
from supervisor.incidents import EventStatus, IncidentState
from supervisor.incidents.states import REOPEN, can_transition
from supervisor.logging import get_logger
from supervisor.runtime import effects
from supervisor.runtime.actions import entry
from supervisor.runtime.actions.base import Executor, Outcome, Runtime, Waiting
from supervisor.runtime.state import ActivePlan

log = get_logger("supervisor.runtime.plans")


def action_id(active: ActivePlan, index: int, name: str) -> str:
    return f"i{active.incident_id}-p{active.plan_no}-a{index}-{name}"


@dataclass(frozen=True)
class Step:
    """One transition of the active plan: the effects the controller carries out, in order; the
    failed action's outcome, if one failed; and whether to step again at once, after them (an action
    begun starts once its pending event is on disk; one a restarted supervisor re-started is polled
    once its start's effects are carried out)."""

    effects: tuple[effects.Effect, ...] = ()
    failed: Outcome | None = None
    again: bool = False


class PlanRunner:
    """Advances the active plan by at most one action transition per call, returning the executors'
    effects (``Step``): an outcome's come before the ``FinishAction`` that marks its action done and
    the ``NextAction`` that moves the plan on. It changes neither the incident store nor the plan."""

    def __init__(self, incidents: Any) -> None:
        self.incidents = incidents
        self._started: set[str] = set()
        self._begun: set[str] = set()  # begun in the step before: its start comes next
        self.transitions = 0
        self.began: dict[str, float] = {}
        """Wall time each action began in this process (``status``: how long the current one runs)."""

    def advance(self, active: ActivePlan, rt: Runtime) -> Step:
        actions = active.plan.actions
        if active.index >= len(actions):
            return Step()
        pa = actions[active.index]
        aid = action_id(active, active.index, pa.name)
        reg = entry(pa.name)
        ex = reg.executor
        event = self.incidents.event_for_action(active.incident_id, aid)
        # What the action was started with (recorded in its pending event) is what it goes on with.
        params = dict(event.payload.get("params") or pa.params) if event is not None else dict(pa.params)
        if event is None and aid in self._begun:  # never step it again blind: that would loop
            raise RuntimeError(f"action {aid} began, but its pending event is not in the incident store")
        if event is None:  # 1. it begins: the incident's move and its pending event, carried out first
            params = self._for_target_used(active, active.index, params)
            memo = ex.prepare(rt, params, aid)
            payload = {"action": pa.name, "params": params, "reason": pa.reason, "memo": memo}
            payload |= reg.report(params, memo)
            begins: tuple[effects.Effect, ...] = ()
            if reg.state is not None:
                begins = (effects.MoveIncident(active.incident_id, reg.state, f"action {pa.name} begins",
                                               rt.current_step),)  # fmt: skip
            begins += (effects.BeginAction(active.incident_id, reg.event, rt.current_step, payload, aid,
                                           ACTIONS[pa.name].irreversible),)  # fmt: skip
            self.began[aid] = time.time()
            log.info("action_started", incident=active.incident_id, action=pa.name, reason=pa.reason, id=aid)
            self.transitions += 1
            self._begun.add(aid)
            return Step(begins, again=True)
        memo = dict(event.payload.get("memo") or {})
        if aid in self._begun:  # 2. ... then it starts, with what its pending event holds
            self._begun.discard(aid)
            return Step(self._start(ex, rt, params, memo, aid))
        next_action = effects.NextAction(active.incident_id, active.plan_no, active.index)
        result = event.result or {}
        # Done, or moot: it can no longer matter (e.g. the state it was to save is gone).
        if event.status is EventStatus.DONE or (event.status is EventStatus.FAILED and result.get("moot")):
            return Step((next_action,))
        if event.status is EventStatus.FAILED:
            reason = str(result.get("reason", "failed"))
            return Step(failed=Outcome(False, dict(result), reason, skipped=bool(result.get("skipped"))))
        if aid not in self._started:  # a predecessor started it: re-start idempotently, then poll
            self.began.setdefault(aid, event.wall_time)
            return Step(self._start(ex, rt, params, memo, aid), again=True)
        out = ex.poll(rt, params, memo)
        if out is None or isinstance(out, Waiting):
            return Step(out.effects if out else ())
        result = dict(out.result) | ({"reason": out.reason} if out.reason else {})
        if out.skipped:
            result["skipped"] = True
        log.info(
            "action_finished",
            incident=active.incident_id,
            action=pa.name,
            ok=out.ok,
            skipped=out.skipped,
            reason=out.reason,
            id=aid,
        )
        # The outcome's effects before the event is marked done: a restart never skips one.
        finish = effects.FinishAction(event.id, result, failed=not out.ok)
        if out.ok:
            return Step((*out.effects, finish, next_action))
        return Step((*out.effects, finish), failed=out)

    def _start(
        self, ex: Executor, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], aid: str
    ) -> tuple[effects.Effect, ...]:
        started = ex.start(rt, params, memo)  # keyed or idempotent: a re-start repeats none
        self._started.add(aid)
        return started

    def _for_target_used(self, active: ActivePlan, index: int, params: dict[str, Any]) -> dict[str, Any]:
        """A re-warm planned "from the rollback target to the onset", computed again for the target
        the rollback used (a planned one that failed re-verification was passed over for an older one)."""
        warmup = params.get("warmup_steps")
        if not isinstance(warmup, int) or not warmup:
            return params
        for i in range(index - 1, -1, -1):
            prev = active.plan.actions[i]
            if prev.name != "rollback":
                continue
            ev = self.incidents.event_for_action(active.incident_id, action_id(active, i, prev.name))
            result = (ev.result or {}) if ev is not None and ev.status is EventStatus.DONE else {}
            target = prev.params.get("target_step")
            got = (result.get("to_step"), result.get("onset_step"),
                   prev.params.get("max_target_step") if target is None else target)  # fmt: skip
            if not all(isinstance(x, int) for x in got):
                return params
            used, onset, planned = (int(x or 0) for x in got)
            if used == planned:
                return params
            if warmup != onset - planned or not used < onset:
                return params  # a re-warm of its own length, not one to the onset
            log.warning("fix_recomputed", incident=active.incident_id, planned_target=planned, target=used,
                        warmup_steps=onset - used, planned_warmup_steps=warmup)  # fmt: skip
            return params | {"warmup_steps": onset - used, "recomputed_for_target": {
                "planned_target": planned, "target": used, "planned_warmup_steps": warmup}}  # fmt: skip
        return params


def can_move(incidents: Any, incident_id: int, target: IncidentState) -> bool:
    """Valid from the incident's current state, and not a reopen."""
    current = incidents.get(incident_id).state
    return current != target and can_transition(current, target) and (current, target) != REOPEN


def move(incidents: Any, incident_id: int, target: IncidentState, reason: str, step: int | None) -> None:
    """Transition when valid from the current state (a no-op otherwise, e.g. frozen -> frozen)."""
    if can_move(incidents, incident_id, target):
        incidents.transition(incident_id, target, reason, actor="supervisor", step=step)

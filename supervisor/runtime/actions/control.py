"""freeze, resume, stop, escalate: directives that hold, release or end training."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from supervisor.runtime import effects
from supervisor.runtime.actions.base import DirectiveAction, Outcome, Runtime, Waiting, await_acks
from supervisor.sdk.directives import Continue, Directive, Freeze, Snapshot, Stop


class FreezeAction(DirectiveAction):
    """Every rank parks at the next step boundary with its state in memory."""

    def directive(self, rt: Runtime, params: dict[str, Any], action_id: str) -> Directive:
        return Freeze(reason=f"incident {rt.incident_id}", id=action_id)

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        return replace(out, effects=(effects.SetFrozen(True),))


class ResumeAction(DirectiveAction):
    """Release a freeze (harmless when training already runs) and let `latest` advance again."""

    def directive(self, rt: Runtime, params: dict[str, Any], action_id: str) -> Directive:
        return Continue(id=action_id)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | Waiting | None:
        if rt.workers_gone():  # nothing left to release; `latest` is released all the same
            return self.finished(rt, params, memo, Outcome.done(released=False, note="training had ended"))
        return super().poll(rt, params, memo)

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        done = Outcome.done(latest_unblocked=True, **out.result)
        return replace(done, effects=(effects.SetFrozen(False), effects.ReleaseLatest(rt.incident_id)))


class StopAction(DirectiveAction):
    """End training at the next boundary; the job ends as stopped."""

    def directive(self, rt: Runtime, params: dict[str, Any], action_id: str) -> Directive:
        return Stop(
            reason=params.get("message") or f"incident {rt.incident_id}: policy says stop", id=action_id
        )

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        return replace(out, effects=(effects.EndJob("stopped", memo["directive"]["reason"]),))


class EscalateAction:
    """Save the state (diagnostic snapshot), stop the job, and leave the incident to a person."""

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        import time

        why = params.get("message") or "escalated by policy"
        snap = Snapshot(reason=f"escalation of incident {rt.incident_id}", id=f"{action_id}-snapshot")
        stop = Stop(reason=why, id=f"{action_id}-stop")
        return {"snapshot": snap.to_dict(), "stop": stop.to_dict(), "reason": why, "started_at": time.time()}

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[effects.Effect, ...]:
        snapshot, stop = Directive.from_dict(memo["snapshot"]), Directive.from_dict(memo["stop"])
        return effects.Issue(snapshot), effects.Issue(stop)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        snap = await_acks(rt, memo["snapshot"]["id"], memo["started_at"])
        stop = await_acks(rt, memo["stop"]["id"], memo["started_at"])
        if snap is None or stop is None:
            return None
        then: tuple[effects.Effect, ...] = (effects.EndJob("escalated", memo["reason"]),)
        saved = snap.result.get("acked_at_step") if snap.ok else None
        killed = None
        if not stop.ok and not rt.workers_gone():
            # The stop never reached every rank (dead or hung): the escalation's effect -- training
            # ends -- is carried out all the same, and recorded as what happened, not as a stop.
            killed = f"workers killed: {stop.reason}"
            then += (effects.KillWorkers(killed),)
        done = Outcome.done(
            state_saved_at_step=saved, snapshot_ok=snap.ok, stopped=stop.ok, reason=memo["reason"],
            **({"workers_killed": killed} if killed else {}),
        )  # fmt: skip
        return replace(done, effects=then)

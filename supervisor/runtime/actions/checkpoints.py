"""snapshot, block_latest, rollback: the actions that touch the checkpoint store."""

from __future__ import annotations

import time
from typing import Any

from supervisor.config.recovery import rollback_mode
from supervisor.runtime.actions.base import DirectiveAction, Outcome, Runtime
from supervisor.sdk.directives import Directive, RollbackInPlace, Snapshot


class SnapshotAction(DirectiveAction):
    """Every rank saves its current (suspect) state, marked diagnostic: evidence, never a target."""

    def directive(self, rt: Runtime, params: dict[str, Any], action_id: str) -> Directive:
        return Snapshot(reason=f"incident {rt.incident_id}", id=action_id)

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        return Outcome.done(mark="diagnostic", **out.result)


class BlockLatestAction:
    """`latest` stops advancing until this incident releases it (persisted in storage)."""

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        return {"incident": rt.incident_id}

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> None:
        if rt.checkpoints is not None:
            rt.checkpoints.block(f"incident {rt.incident_id} open", incident=rt.incident_id)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        if rt.checkpoints is None:
            return Outcome.fail("the job has no checkpoint store")
        state = rt.checkpoints.block_state()
        if state is None:
            return Outcome.fail("block did not persist")
        return Outcome.done(
            latest_at_block=state.latest_at_block, holders=[h.incident for h in state.holders]
        )


class RollbackAction(DirectiveAction):
    """Back to the chosen checkpoint, in place or by restarting the worker group; the target is
    picked and re-verified first (``supervisor.config.recovery`` says which mode and why).

    In place: every rank loads the target at the step boundary (a ``RollbackInPlace``
    directive). Restart: the group is shut down and a new generation resumes from the target
    (a framework checkpoint through the framework's resume path); done once it is running.
    The target and the mode are chosen in ``prepare`` and written into the pending event, so a
    restarted supervisor finishes the *same* rollback instead of choosing (and loading) again.
    """

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        memo: dict[str, Any] = {"from_step": rt.current_step, "started_at": time.time()}
        try:
            target, verification = rt.rollback_target(
                int(params.get("max_target_step", rt.diagnosis.onset_step)),
                str(params.get("min_mark", "healthy")),
            )
        except Exception as exc:  # no target: the action fails and the policy's on_failure decides
            return memo | {"error": str(exc)}
        manifest = rt.checkpoints.find(target)
        mode, why = rollback_mode(rt.job.recovery, manifest is not None and manifest.source is not None)
        memo |= {"to_step": target, "verification": verification, "mode": mode, "why": why}
        if mode == "restart":
            return memo | {"restart_key": f"restart:{action_id}"}
        return memo | {"directive": RollbackInPlace(step=target, id=action_id).to_dict()}

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> None:
        if "restart_key" in memo:
            rt.restart_group(memo["to_step"], memo["restart_key"],
                             f"rollback of incident {rt.incident_id}: {memo['why']}")  # fmt: skip
        elif "directive" in memo:
            super().start(rt, params, memo)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        if "error" in memo:
            return Outcome.fail(memo["error"])
        if "restart_key" in memo:
            if rt.generation_started_at < memo["started_at"]:
                return None  # the new generation is not running yet (a failed launch ends the job)
            return self.finished(rt, params, memo, Outcome.done())
        return super().poll(rt, params, memo)

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        # Keyed by the directive: a supervisor restarted after this ran does not rewind twice
        # (a restart rewound when it took the group down, keyed by restart_key).
        if "directive" in memo:
            rt.rewind(
                memo["to_step"], f"rewind:{memo['directive']['id']}", f"rollback of incident {rt.incident_id}"
            )
        return Outcome.done(
            from_step=memo["from_step"],
            to_step=memo["to_step"],
            margin_steps=params.get("margin_steps"),
            onset_step=rt.diagnosis.onset_step,
            verification=memo["verification"],
            mode=memo.get("mode", "in_place"),
            mode_why=memo.get("why"),
            **out.result,
        )

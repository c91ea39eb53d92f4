"""snapshot, block_latest, rollback: the actions that touch the checkpoint store."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from supervisor.config.recovery import rollback_mode
from supervisor.core.model import HealthMark
from supervisor.logging import get_logger
from supervisor.runtime import effects
from supervisor.runtime.actions.base import DirectiveAction, Outcome, Runtime, Waiting, await_acks
from supervisor.runtime.directives import DirectiveLog
from supervisor.sdk.directives import Directive, RollbackInPlace, Snapshot

log = get_logger("supervisor.runtime.actions")

START = 0
"""``to_step`` of a rollback to the run's start: the state before step 1 (steps count from 1), so
the re-warm to the onset and the steps to train again are counted as for a checkpoint at step 0;
the group is restarted from scratch (``RestartGroup(None)``), no checkpoint resumed."""


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

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[effects.Effect, ...]:
        return (effects.BlockLatest(rt.incident_id, f"incident {rt.incident_id} open"),)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        if rt.checkpoints is None:
            return Outcome.fail("the job has no checkpoint store")
        state = rt.checkpoints.block_state()
        if state is None:
            return Outcome.fail("block did not persist")
        return Outcome.done(
            latest_at_block=state.latest_at_block, holders=[h.incident for h in state.holders]
        )


def in_force(directives: DirectiveLog, planned_id: str) -> str:
    """The id of a rollback's directive in force: the newest fallback ``<planned id>~<step>`` issued
    after the ranks refused a target (``RollbackAction._in_force``), else the planned one. A new
    worker generation is sent this one: the refused targets are quarantined, never loaded again."""
    fallbacks = [e["id"] for e in directives.entries if str(e["id"]).startswith(f"{planned_id}~")]
    return str(fallbacks[-1]) if fallbacks else planned_id


class RollbackAction(DirectiveAction):
    """Back to the chosen, re-verified checkpoint, in place (every rank loads it at the boundary) or
    by a new generation of the group that resumes from it (``supervisor.config.recovery`` says
    which and why). Target and mode are chosen in ``prepare`` and written into the pending event, so
    a restarted supervisor finishes the *same* rollback. A target the ranks' restore check refuses
    is quarantined and passed over (``_in_force``): ``to_step`` is the target used."""

    def __init__(self) -> None:
        self._chosen: dict[tuple[str, float], dict[str, Any]] = {}
        """Fallbacks found so far, by (directive id, start time): the one executor serves every
        controller of the process, whose action ids repeat from job to job (incident 1, plan 1)."""

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        memo: dict[str, Any] = {"from_step": rt.current_step, "started_at": time.time()}
        if params.get("to_start"):
            # No checkpoint before the onset of a young run: the group restarts from the job's own
            # initial state (no resume checkpoint; every checkpoint after the start is quarantined as
            # the abandoned timeline, so none is picked up as `latest`).
            onset = rt.diagnosis.onset_step
            why = f"no checkpoint before onset {onset}: the worker group restarts from the run's start"
            return memo | {"to_step": START, "to_start": True, "onset_step": onset, "verification": {}, "mode": "restart",
                           "why": why, "restart_key": f"restart:{action_id}"}  # fmt: skip
        try:
            target, verification = rt.rollback_target(
                int(params.get("max_target_step", rt.diagnosis.onset_step)),
                str(params.get("min_mark", "healthy")),
            )
        except Exception as exc:  # no target: the action fails and the policy's on_failure decides
            return memo | {"error": str(exc)}
        manifest = rt.checkpoints.find(target) if rt.checkpoints is not None else None
        mode, why = rollback_mode(rt.job.recovery, manifest is not None and manifest.source is not None)
        memo |= {"to_step": target, "verification": verification, "mode": mode, "why": why}
        if mode == "restart":
            return memo | {"restart_key": f"restart:{action_id}"}
        return memo | {"directive": RollbackInPlace(step=target, id=action_id).to_dict()}

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[effects.Effect, ...]:
        if "restart_key" in memo:
            why = f"rollback of incident {rt.incident_id}: {memo['why']}"
            to_step = None if memo.get("to_start") else memo["to_step"]
            return (effects.RestartGroup(to_step, memo["restart_key"], why),)
        return super().start(rt, params, memo) if "directive" in memo else ()

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | Waiting | None:
        if "error" in memo:
            return Outcome.fail(memo["error"])
        if "restart_key" in memo:
            if rt.generation_started_at < memo["started_at"]:
                return None  # the new generation is not running yet (a failed launch ends the job)
            return self.finished(rt, params, memo, Outcome.done())
        now = self._in_force(rt, params, memo)
        if isinstance(now, Outcome):
            return now
        out = await_acks(rt, now["directive"]["id"], now["since"])
        if out is not None and out.ok:
            return self.finished(rt, params, memo | now, out)
        if out is not None and now["passed_over"]:
            return Outcome.fail(out.reason, passed_over=now["passed_over"], **out.result)
        if out is None and not rt.directives.has(now["directive"]["id"]):  # a fallback, not issued yet
            return Waiting((effects.Issue(Directive.from_dict(now["directive"])),))
        return out

    def _in_force(
        self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]
    ) -> dict[str, Any] | Outcome:
        """The rollback directive in force: the planned one, or -- once the ranks' restore check
        refused its target and quarantined it (a checkpoint whose files and checksums were rewritten
        to match passes every check before loading) -- a ``RollbackInPlace`` to the next target
        that qualifies, ``<action id>~<step>``. Derived from the quarantine marks and the refusals
        in the state file, so a restarted supervisor arrives at (and re-issues) the same one."""
        planned = memo["directive"]
        key = (str(planned["id"]), float(memo["started_at"]))
        known = self._chosen.get(key)
        now = dict(known) if known is not None else {
            "directive": planned, "to_step": memo["to_step"], "verification": memo["verification"],
            "since": memo["started_at"], "passed_over": [],
        }  # fmt: skip
        while rt.directives.failed_on(now["directive"]["id"]):
            step = int(now["directive"]["step"])
            manifest = rt.checkpoints.find(step) if rt.checkpoints is not None else None
            if manifest is None or manifest.health is not HealthMark.QUARANTINED:
                break  # refused for another reason: the action fails (await_acks says which rank)
            why = manifest.history[-1].reason if manifest.history else "quarantined"
            passed = [*now["passed_over"], {"step": step, "reason": why}]
            try:
                target, verification = rt.rollback_target(step - 1, str(params.get("min_mark", "healthy")))
            except Exception as exc:  # no older target: the policy's on_failure decides
                return Outcome.fail(f"checkpoint {step} failed the restore check on the ranks and was "
                                    f"quarantined; no other target: {exc}", passed_over=passed)  # fmt: skip
            directive = RollbackInPlace(step=target, id=f"{planned['id']}~{target}").to_dict()
            log.warning("rollback_target_refused", incident=rt.incident_id, refused=step, reason=why[:300],
                        target=target, directive=directive["id"])  # fmt: skip
            now = {"directive": directive, "to_step": target, "verification": verification,
                   "since": time.time(), "passed_over": passed}  # fmt: skip
        self._chosen[key] = now
        return now

    def finished(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any], out: Outcome) -> Outcome:
        # Keyed by the directive: a supervisor restarted after this ran does not rewind twice
        # (a restart rewound when it took the group down, keyed by restart_key).
        then: tuple[effects.Effect, ...] = ()
        if "directive" in memo:
            reason = f"rollback of incident {rt.incident_id}"
            then = (effects.Rewind(memo["to_step"], f"rewind:{memo['directive']['id']}", reason),)
        passed = {"passed_over": memo["passed_over"]} if memo.get("passed_over") else {}
        if memo.get("to_start"):
            passed["to_start"] = True
        done = Outcome.done(
            from_step=memo["from_step"],
            to_step=memo["to_step"],
            margin_steps=params.get("margin_steps"),
            onset_step=rt.diagnosis.onset_step,
            verification=memo["verification"],
            mode=memo.get("mode", "in_place"),
            mode_why=memo.get("why"),
            **passed,
            **out.result,
        )
        return replace(done, effects=then)

"""replay: the suspect batch and a control batch from a verified checkpoint, on the job's own ranks.

While the workers are alive (training, frozen, or held at their last step), every rank runs a
``Replay`` directive at its boundary (``supervisor.sdk.replay``: the checkpoint's state in place
of the live one, put back after) and rank 0 leaves the result in the job's storage. When the
workers are gone, or the ranks refuse (no map-style loader, no loss function), the offline
single-process Ray task (``supervisor.ranks.replay``, the job's ``replay_hooks``) replays.
"""

from __future__ import annotations

import json
import time
from typing import Any

from supervisor.core.model import Cause
from supervisor.errors import SupervisorError
from supervisor.runtime import effects
from supervisor.runtime.actions.base import Outcome, Runtime, Waiting
from supervisor.sdk.directives import Replay
from supervisor.sdk.replay import result_key


class ReplayAction:
    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        d = rt.diagnosis
        memo: dict[str, Any] = {"task": f"replay:{action_id}", "suspects": list(d.suspect_samples)}
        memo["numeric"] = d.nonfinite or d.top_cause is Cause.NUMERIC
        memo["started_at"] = time.time()
        try:
            memo["checkpoint"], _ = rt.rollback_target(d.onset_step - 1, "verified")
        except Exception as exc:
            memo["error"] = f"no checkpoint to replay from: {exc}"
            return memo
        if not rt.workers_gone():  # live ranks replay, training or held at their last step alike
            directive = Replay(step=memo["checkpoint"], suspects=tuple(memo["suspects"]), numeric=memo["numeric"],
                               deadline_s=rt.settings.replay_timeout_s, id=action_id)  # fmt: skip
            memo["directive"] = directive.to_dict()
        return memo

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> tuple[effects.Effect, ...]:
        if "directive" in memo:
            return (effects.Issue(Replay.from_dict(memo["directive"])),)
        return () if "error" in memo else (offline(memo),)

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | Waiting | None:
        if "error" in memo:
            return Outcome.fail(memo["error"])
        if "directive" in memo and not memo.get("offline"):
            res = self._on_ranks(rt, memo)
            if res is None:
                return None
            if isinstance(res, dict):
                return judged(res)
            memo["offline"] = True  # the ranks could not replay: the single-process path takes over
        res_task = rt.result_of(memo["task"])
        if res_task is None:  # handed off to the offline replay now, or in flight
            return Waiting((offline(memo),)) if "directive" in memo else None
        ok, value = res_task
        if not ok:
            return Outcome.fail(f"replay task failed: {value}")
        return judged(value)

    def _on_ranks(self, rt: Runtime, memo: dict[str, Any]) -> dict[str, Any] | bool | None:
        """The ranks' result; None while they run; False when they refused (fall back offline)."""
        directive_id = memo["directive"]["id"]
        if rt.directives.failed_on(directive_id) or rt.workers_gone():
            return False
        if set(rt.directives.acked_by(directive_id)) >= set(range(rt.world_size)):
            if rt.checkpoints is None:
                return False  # no storage to read their result from: replay it offline instead
            try:
                return dict(
                    json.loads(rt.checkpoints.backend.get_bytes(result_key(rt.job.name, directive_id)))
                )
            except (SupervisorError, ValueError):
                return False  # acknowledged without a readable result: replay it offline instead
        limit = rt.settings.replay_timeout_s + rt.settings.directive_timeout_s
        return False if time.time() - memo["started_at"] > limit else None


def offline(memo: dict[str, Any]) -> effects.SubmitReplay:
    """The single-process replay task, submitted once per task name."""
    return effects.SubmitReplay(memo["task"], memo["checkpoint"], tuple(memo["suspects"]), memo["numeric"])


def judged(value: dict[str, Any]) -> Outcome:
    if value["verdict"] == "data":
        return Outcome.done(**value)
    # Not reproduced: the suspect data is not the cause; the policy's on_failure decides.
    return Outcome.fail(f"replay did not implicate the data: {value['why']}", **value)

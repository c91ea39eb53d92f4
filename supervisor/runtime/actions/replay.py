"""replay: a single-process Ray task re-runs the suspect and a control batch from a healthy checkpoint."""

from __future__ import annotations

from typing import Any

from supervisor.core.model import Cause
from supervisor.incidents import EventKind
from supervisor.runtime.actions.base import Outcome, Runtime
from supervisor.runtime.stores import pick_rollback_target


class ReplayAction:
    event = EventKind.REPLAYED

    def prepare(self, rt: Runtime, params: dict[str, Any], action_id: str) -> dict[str, Any]:
        d = rt.diagnosis
        memo: dict[str, Any] = {"task": f"replay:{action_id}", "suspects": list(d.suspect_samples)}
        memo["numeric"] = d.nonfinite or d.top_cause is Cause.NUMERIC
        try:
            memo["checkpoint"], _ = pick_rollback_target(
                rt.checkpoints, max_step=d.onset_step - 1, min_mark="verified", world_size=rt.world_size
            )
        except Exception as exc:
            memo["error"] = f"no checkpoint to replay from: {exc}"
        return memo

    def start(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> None:
        if "error" not in memo:
            rt.submit_replay(memo["task"], memo["checkpoint"], memo["suspects"], memo["numeric"])

    def poll(self, rt: Runtime, params: dict[str, Any], memo: dict[str, Any]) -> Outcome | None:
        if "error" in memo:
            return Outcome.fail(memo["error"])
        res = rt.result_of(memo["task"])
        if res is None:
            return None
        ok, value = res
        if not ok:
            return Outcome.fail(f"replay task failed: {value}")
        if value["verdict"] == "data":
            return Outcome.done(**value)
        # Not reproduced: the suspect data is not the cause; the policy's on_failure decides.
        return Outcome.fail(f"replay did not implicate the data: {value['why']}", **value)

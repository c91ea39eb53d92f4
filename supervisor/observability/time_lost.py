"""Time lost to instability, as operators count it (docs/runtime.md, Crash consistency): per incident
the steps re-trained and the time spent re-training them, per run the effective training time ratio.

A step's time is its slowest rank's ``step_time``; with none reported, the gap to the previous
step's record ``time`` when the two are consecutive on one timeline. The steps a rollback or
restart abandons leave the total: the running total is kept for the newest ``MARKS_KEPT`` steps
(every rollback or restart target is a checkpoint among them), so memory stays bounded.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from supervisor.core.frame import StepFrame
from supervisor.incidents.states import EventKind
from supervisor.incidents.timeline import seconds_words

#: The ``incidents`` key of the steps re-trained after worker-group restarts (no rollback of an incident).
RESTARTS = "restarts"
#: Steps whose surviving time is kept: a rollback or restart goes back to a checkpoint within them
#: (further back, to the newest kept step before its target).
MARKS_KEPT = 2048


class TimeLedger:
    """Owns ``state`` (a plain dict persisted in ``RuntimeState.time_lost``)."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.s = state
        state.setdefault("started_at", time.time())
        state.setdefault("effective_s", 0.0)
        state.setdefault("marks", {})  # checkpoint step -> effective_s when it was trained
        state.setdefault("last", None)  # [step, max record time] of the last analysed step
        state.setdefault("retrain", None)  # the rollback being re-trained: incident, until, spent
        state.setdefault("incidents", {})  # incident id -> steps_retrained, retrain_s, rollbacks

    # -- fed by the controller ------------------------------------------------------------------
    def on_step(self, step: int, records: Sequence[Any]) -> float:
        """Returns the time counted for an analysed step of the current timeline."""
        if type(records) is StepFrame:
            times = [t for t in records.col("step_time") if t is not None]  # numbers: Record's types
            stamps = [t for t in records.col("time") if t is not None]
        else:
            times = [r.step_time for r in records if isinstance(getattr(r, "step_time", None), int | float)]
            stamps = [r.time for r in records if isinstance(getattr(r, "time", None), int | float)]
        last = self.s["last"]
        if times:
            spent = max(0.0, float(max(times)))
        elif stamps and last is not None and last[0] == step - 1 and last[1] is not None:
            spent = max(0.0, max(stamps) - last[1])
        else:
            spent = 0.0
        self.s["effective_s"] += spent
        self.s["last"] = [step, max(stamps) if stamps else None]
        self.mark(step)
        rt = self.s["retrain"]
        if rt is not None and step <= rt["until"]:
            rt["spent"] += spent
            if step >= rt["until"]:
                self._close_retrain()
        return spent

    def mark(self, step: int) -> None:
        marks = self.s["marks"]
        marks[str(step)] = self.s["effective_s"]
        if len(marks) > MARKS_KEPT + MARKS_KEPT // 4:  # pruned in bulk: not a sort per step
            for k in sorted(marks, key=int)[: len(marks) - MARKS_KEPT]:
                del marks[k]

    def on_rewind(self, to_step: int, from_step: int, incident_id: int | None) -> None:
        """Training continues from checkpoint ``to_step``: the steps after it no longer count.
        ``incident_id``: the incident whose rollback this is; None: a worker-group restart (its
        steps count for the run, under ``RESTARTS``)."""
        if self.s["retrain"] is not None:
            self._close_retrain()
        marks = self.s["marks"]
        before = [int(k) for k in marks if int(k) <= to_step]
        self.s["effective_s"] = marks[str(max(before))] if to_step > 0 and before else 0.0
        for k in [k for k in marks if int(k) > to_step]:
            del marks[k]
        self.s["last"] = None
        lost = max(0, from_step - max(to_step, 0))
        if lost:
            key = RESTARTS if incident_id is None else str(incident_id)
            inc = self._incident(key)
            inc["steps_retrained"] += lost
            inc["rollbacks"].append([from_step, max(to_step, 0)])
            self.s["retrain"] = {"incident": key, "until": from_step, "spent": 0.0}

    def finish(self, now: float) -> None:
        """The run ended at ``now``: a re-training cut short counts what it spent."""
        if self.s["retrain"] is not None:
            self._close_retrain()
        self.s["ended_at"] = now

    def note_incidents(self, store: Any, job: str, step: int) -> None:
        """After ``finish``: each incident's time lost into its timeline, once (a ``time_lost`` note;
        the run's totals are in the final summary and ``status``)."""
        for inc in store.list_incidents(job=job):
            timeline = store.timeline(inc.id)
            if any("time_lost" in e.payload for e in timeline):
                continue  # recorded by the supervisor that ended the run before this one re-attached
            downtime = sum(float(e.payload["downtime_s"]) for e in timeline if "downtime_s" in e.payload)
            lost = {**self.of_incident(inc.id), "downtime_s": round(downtime, 2)}
            if lost["steps_retrained"] or lost["retrain_s"] or downtime:
                lost["retrain_s"] = round(lost["retrain_s"], 2)
                store.record(
                    inc.id, EventKind.NOTE, actor="supervisor", step=step, payload={"time_lost": lost}
                )

    # -- read ---------------------------------------------------------------------------------
    def wall_s(self, now: float | None = None) -> float:
        end = self.s.get("ended_at") or now or time.time()
        return max(0.0, end - self.s["started_at"])

    def ettr(self, now: float | None = None) -> float | None:
        """Effective training time ratio (None before any time passed)."""
        wall = self.wall_s(now)
        return min(1.0, self.s["effective_s"] / wall) if wall > 0 else None

    def of_incident(self, incident_id: int | str) -> dict[str, Any]:
        inc = self.s["incidents"].get(str(incident_id))
        out = _no_loss()
        if inc is not None:
            out |= {k: inc[k] for k in out}
        rt = self.s["retrain"]
        if rt is not None and rt["incident"] == str(incident_id):
            out["retrain_s"] += rt["spent"]
        return out

    def summary(self, downtime_s: float, now: float | None = None) -> dict[str, Any]:
        # A copy of the keys: status() reads from a Ray thread.
        incidents = [self.of_incident(k) for k in list(self.s["incidents"])]
        ettr = self.ettr(now)
        return {
            "wall_s": round(self.wall_s(now), 2),
            "effective_s": round(self.s["effective_s"], 2),
            "effective_training_time_ratio": None if ettr is None else round(ettr, 4),
            "downtime_s": round(downtime_s, 2),
            "steps_retrained": sum(i["steps_retrained"] for i in incidents),
            "retrain_s": round(sum(i["retrain_s"] for i in incidents), 2),
        }

    def _incident(self, key: str) -> dict[str, Any]:
        return self.s["incidents"].setdefault(key, _no_loss())

    def _close_retrain(self) -> None:
        rt = self.s["retrain"]
        self.s["retrain"] = None
        self._incident(rt["incident"])["retrain_s"] += rt["spent"]


def _no_loss() -> dict[str, Any]:
    return {"steps_retrained": 0, "retrain_s": 0.0, "rollbacks": []}


def run_words(summary: dict[str, Any] | None) -> str | None:
    """The run's time lost in one line (``TimeLedger.summary``); None before any was counted."""
    if not summary or summary.get("effective_training_time_ratio") is None:
        return None
    return (
        f"effective training time {summary['effective_training_time_ratio']:.1%} of {seconds_words(summary['wall_s'])} "
        f"wall; {summary['steps_retrained']} step(s) re-trained in {seconds_words(summary['retrain_s'])}; "
        f"training stood still {seconds_words(summary['downtime_s'])}"
    )

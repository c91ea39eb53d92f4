"""From detector updates to incidents and plans: open, plan, carry out, close.

One incident is acted on at a time (the *active* plan); incidents that become ready while
another is being handled wait their turn. In ``observe_only`` mode incidents are recorded
and never acted on.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from supervisor.core.model import Cause, Diagnosis, Severity
from supervisor.core.policy import JobState, plan
from supervisor.core.records import Record
from supervisor.incidents import EventKind, IncidentState
from supervisor.logging import get_logger
from supervisor.runtime.observe import baseline
from supervisor.runtime.plans import PlanRunner, actions_of, move
from supervisor.runtime.state import ActivePlan, JobPhase

if TYPE_CHECKING:
    from supervisor.runtime.controller import Controller

log = get_logger("supervisor.runtime.incidents")


def make_analyzer(job: Any, saved: Any) -> Any:
    from supervisor.core.analysis import StreamingAnalyzer
    from supervisor.core.detect import DetectorSettings

    analyzer = StreamingAnalyzer(DetectorSettings.from_telemetry(job.telemetry))
    if saved:
        try:
            analyzer.load_state_dict(saved)
        except Exception as exc:  # an unreadable saved state must not stop supervision: start empty
            log.warning("analyzer_state_not_restored", error=repr(exc))
    return analyzer


class IncidentFlow:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.analyzer = make_analyzer(ctl.job, ctl.state.analyzer)
        self.runner = PlanRunner(ctl, ctl.incidents)
        self.waiting: deque[tuple[int, Diagnosis]] = deque()
        self._diagnosis: Diagnosis | None = None
        self._opened_at: list[tuple[int, int]] = []  # (step, incident id) of incidents opened this run
        self._dismiss_after = False

    # -- detector side ------------------------------------------------------------------------
    def observe(self, step: int, records: list[Record]) -> None:
        for update in self.analyzer.observe_step(step, records):
            self._on_update(update, step)

    def _on_update(self, u: Any, step: int) -> None:
        key = str(u.key)
        incident_id = self.ctl.state.incident_keys.get(key)
        if incident_id is None:
            incident = self.ctl.incidents.open_incident(self.ctl.job.name, u.diagnosis, key=u.key, step=step)
            incident_id = self.ctl.state.incident_keys[key] = incident.id
            if u.diagnosis.severity.rank >= Severity.MEDIUM.rank:  # low blips do not fail an observation
                self._opened_at.append((step, incident_id))
            self.ctl.state.last_incident_step = step
        elif u.kind in ("refined", "closed", "ready"):
            self.ctl.incidents.update_diagnosis(incident_id, u.diagnosis, step=step)
        if self.active is not None and incident_id == self.active.incident_id:
            self._diagnosis = u.diagnosis
        if u.kind == "ready" and self.ctl.job.mode == "supervised":
            self.waiting.append((incident_id, u.diagnosis))

    def notify_rollback(self, to_step: int) -> None:
        for update in self.analyzer.notify_rollback(to_step) or ():
            self._on_update(update, to_step)
        self.ctl.history = type(self.ctl.history)((h for h in self.ctl.history if h.step <= to_step),
                                                  maxlen=self.ctl.history.maxlen)  # fmt: skip

    def analyzer_state(self) -> Any:
        return self.analyzer.state_dict()

    def opened_since(self, step: int) -> int:
        active = self.active.incident_id if self.active else None
        return sum(1 for s, i in self._opened_at if s > step and i != active)

    # -- plans --------------------------------------------------------------------------------
    @property
    def active(self) -> ActivePlan | None:
        return self.ctl.state.active

    @property
    def active_incident_id(self) -> int:
        assert self.active is not None
        return self.active.incident_id

    @property
    def active_diagnosis(self) -> Diagnosis:
        if self._diagnosis is None:
            assert self.active is not None
            d = self.ctl.incidents.get(self.active.incident_id).diagnosis
            assert d is not None
            self._diagnosis = d
        return self._diagnosis

    def advance(self) -> bool:
        """Move the active plan on; True when an action started or finished."""
        if self.active is None:
            if not self.waiting or self.ctl.training_ended():  # nothing left to act on once training ended
                return False
            incident_id, diagnosis = self.waiting.popleft()
            self._start_plan(incident_id, diagnosis, plan_no=1, observation_failures=0)
        assert self.active is not None
        before = (self.active.plan_no, self.active.index, self.runner.transitions)
        failed = self.runner.advance(self.active)
        if failed is not None:
            self._on_failure(failed.reason)
        elif self.active is not None and self.active.index >= len(self.active.plan["actions"]):
            self._close_plan()
        return self.active is None or before != (
            self.active.plan_no,
            self.active.index,
            self.runner.transitions,
        )

    def _start_plan(self, incident_id: int, d: Diagnosis, *, plan_no: int, observation_failures: int) -> None:
        ctl = self.ctl
        since = (
            None if ctl.state.last_incident_step is None else ctl.current_step - ctl.state.last_incident_step
        )
        refs = None
        if ctl.checkpoints is not None:
            refs = tuple((m.step, m.health) for m in ctl.checkpoints.manifests())
        js = JobState(
            step=ctl.current_step,
            attempts=ctl.state.attempts,
            observation_failures=observation_failures,
            steps_since_last_incident=since,
            checkpoints=refs,
            state_maybe_nonfinite=d.nonfinite,
        )
        p = plan(d, js, ctl.policy)
        rule = p.rule or "fallback"
        ctl.state.attempts[rule] = ctl.state.attempts.get(rule, 0) + 1
        pre = [h for h in ctl.history if h.step < d.onset_step][-200:]
        base = baseline(pre)
        note = {"plan": f"rule {p.rule or 'fallback'}: {', '.join(p.action_names)}", "why": p.matched_because,
                "escalate": p.escalate_reason, "attempt": p.attempt}  # fmt: skip
        ctl.incidents.record(incident_id, EventKind.NOTE, actor="policy", step=ctl.current_step, payload=note)
        ctl.incidents.add_artifact(incident_id, "plan", f"plan-{plan_no}",
                                   {"plan": p.to_json(), "job_state": js.to_json(),
                                    "baseline": base.to_json() if base else None})  # fmt: skip
        self._attach_series(incident_id, d)
        ctl.state.active = ActivePlan(incident_id=incident_id, plan_no=plan_no, plan=p.to_json(),
                                      baseline=base.to_json() if base else None,
                                      observation_failures=observation_failures)  # fmt: skip
        self._diagnosis = d
        ctl.state.phase = JobPhase.INCIDENT
        log.info(
            "plan", incident=incident_id, rule=p.rule, actions=p.action_names, escalate=p.escalate_reason
        )
        if d.top_cause is Cause.METRIC_ARTIFACT and not any(
            a.name != "alert" for a in actions_of(ctl.state.active)
        ):
            self._dismiss_after = True

    def _attach_series(self, incident_id: int, d: Diagnosis) -> None:
        rows = [h.to_json() for h in self.ctl.history if h.step >= d.onset_step - 200]
        self.ctl.incidents.attach_series(incident_id, rows)

    def _on_failure(self, reason: str) -> None:
        """An action failed: a failed observation is re-planned; otherwise its on_failure decides."""
        active = self.active
        assert active is not None
        pa = actions_of(active)[active.index]
        log.warning(
            "action_failed",
            incident=active.incident_id,
            action=pa.name,
            reason=reason,
            on_failure=pa.on_failure,
        )
        if pa.name == "observe":
            move(
                self.ctl.incidents,
                active.incident_id,
                IncidentState.ACTING,
                f"observation failed: {reason}",
                self.ctl.current_step,
            )
            self._start_plan(active.incident_id, self.active_diagnosis, plan_no=active.plan_no + 1,
                             observation_failures=active.observation_failures + 1)  # fmt: skip
            return
        if pa.on_failure == "continue":
            active.index += 1
            return
        follow = "stop" if pa.on_failure == "stop" else "escalate"
        rest = {"name": follow, "params": {"message": f"{pa.name} failed: {reason}"},
                "reason": f"on_failure={pa.on_failure} of action {pa.name}", "on_failure": "stop"}  # fmt: skip
        active.plan = dict(active.plan) | {"actions": active.plan["actions"][: active.index + 1] + [rest]}
        active.index += 1

    def _close_plan(self) -> None:
        active = self.active
        assert active is not None
        names = [a["name"] for a in active.plan["actions"]]
        ctl = self.ctl
        if names and names[-1] in ("escalate", "stop"):
            move(
                ctl.incidents,
                active.incident_id,
                IncidentState.ESCALATED,
                f"plan ended with {names[-1]}",
                ctl.current_step,
            )
        elif self._dismiss_after:
            move(
                ctl.incidents,
                active.incident_id,
                IncidentState.DISMISSED,
                "metric artifact: alert only",
                ctl.current_step,
            )
        else:
            obs = ctl.incidents.last_done(active.incident_id, EventKind.OBSERVATION)
            unverified = obs is not None and (obs.result or {}).get("passed") is None
            move(
                ctl.incidents,
                active.incident_id,
                IncidentState.RESOLVED,
                "every planned action done"
                + (", but training ended before the observation window ran: the fix is unverified"
                   if unverified else ""),
                ctl.current_step,
            )  # fmt: skip
            if ctl.checkpoints is not None:
                ctl.checkpoints.unblock(active.incident_id)
        self._dismiss_after = False
        ctl.state.active = None
        self._diagnosis = None
        if not ctl.phase.is_terminal and ctl.state.phase is JobPhase.INCIDENT:
            ctl.state.phase = JobPhase.RUNNING

    def summary(self) -> dict[str, Any] | None:
        active = self.active
        if active is None:
            return None
        actions = active.plan["actions"]
        current = actions[active.index]["name"] if active.index < len(actions) else None
        return {
            "id": active.incident_id,
            "rule": active.plan.get("rule"),
            "phenotype": self._diagnosis.phenotype.value if self._diagnosis else None,
            "action": current,
            "progress": f"{min(active.index + 1, len(actions))}/{len(actions)}",
        }

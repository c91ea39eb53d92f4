"""Compare what the supervisor did in a drill run with the scenario's expectations.

Everything is read back from where the system itself recorded it: the incident store
(incidents, diagnoses, timelines), the checkpoint store (health marks), the job's final
status, and the records the ranks sent. Each expectation becomes one ``Check``: passed,
failed, or not applicable (``ok is None``) with a one-line detail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config.job import JobSpec
from supervisor.core.model import HealthMark
from supervisor.core.policy.actions import ACTIONS
from supervisor.drills import series
from supervisor.drills.scenario import Expect, LoadedScenario
from supervisor.incidents import Event, EventKind, EventStatus, Incident, IncidentStore

#: The timeline event each policy action leaves (``stop`` leaves a note carrying its action id).
ACTION_EVENTS: dict[str, EventKind] = {name: EventKind(a.event) for name, a in ACTIONS.items()}
#: Onsets this many steps before the first fault still count as caused by it.
ONSET_SLACK = 2
OBSERVE_SPAN = 50


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None
    detail: str


@dataclass
class RunOutcome:
    """One finished drill run, as the runner hands it to the checks."""

    scenario: LoadedScenario
    job: JobSpec
    status: dict[str, Any]
    wall_s: float
    out_dir: Path
    reference_loss: float | None = None
    error: str | None = None
    reports: list[Path] = field(default_factory=list)
    killed: str | None = None
    """What a kill drill killed, and at which point (None: nothing, or the point was never reached)."""


def _taken(events: list[Event], action: str) -> list[Event]:
    kind = ACTION_EVENTS[action]
    return [e for e in events if e.kind is kind and (action != "stop" or e.action_id)]


class Checker:
    def __init__(self, run: RunOutcome, store: IncidentStore) -> None:
        self.run, self.store = run, store
        self.expect: Expect = run.scenario.expect
        self.job = run.job
        self.incidents = sorted(store.list_incidents(job=self.job.name), key=lambda i: i.id)
        fault = run.scenario.first_fault_step
        self.fault_step = fault
        caused = [
            i for i in self.incidents if fault is not None and (i.onset_step or 0) >= fault - ONSET_SLACK
        ]
        self.primary: Incident | None = caused[0] if caused else None
        # A worker the drill killed itself opens a machinery incident wherever the run was then (on
        # a re-trained timeline, possibly before the fault's step): that is the kill, not an alarm.
        kill = run.scenario.scenario.kill
        own = run.killed is not None and kill is not None and kill.target == "worker"
        self.false_alarms = [
            i for i in self.incidents if i not in caused and not (own and i.top_cause == "distributed")
        ]
        self.timeline = store.timeline(self.primary.id) if self.primary else []
        ws = self.job.resources.num_workers
        self.records = series.read_trace(Path(self.job.storage.path), self.job.name, ws)
        self.first = series.step_losses(self.records, ws, "first")
        self.last = series.step_losses(self.records, ws, "last")

    def checks(self) -> list[Check]:
        e = self.expect
        out = [self._phase(), self._false_alarms(), self._incident()]
        if e.incident:
            out += [self._diagnosis(), self._state()]
            out += [self._action(a) for a in e.actions]
            out += [self._attempted(a) for a in e.attempted]
        out += [self._not_taken(a) for a in e.no_actions]
        if e.incident and e.report:
            out.append(self._report())
        if e.incident and e.exported:
            out.append(self._exported())
        if e.recovered:
            out.append(self._recovered())
        if e.final_loss_tolerance is not None:
            out.append(self._final_loss(e.final_loss_tolerance))
        if e.incident:
            out += [self._event(k) for k in e.events]
        if e.resumed_from is not None:
            out.append(self._resumed_from(e.resumed_from))
        out += [self._quarantined(step) for step in e.quarantined]
        if e.killed:
            out.append(
                Check(
                    "killed",
                    self.run.killed is not None,
                    self.run.killed or "the kill point was never reached",
                )
            )
        if e.rollbacks is not None:
            out.append(self._rollbacks(e.rollbacks))
        if e.latest_healthy:
            out.append(self._latest_healthy())
        if e.restarts:
            got = int(self.run.status.get("group_restarts") or 0)
            out.append(
                Check(
                    "restarts", got >= e.restarts, f"{got} worker-group restart(s), expected >= {e.restarts}"
                )
            )
        return out

    def _rollbacks(self, expected: int) -> Check:
        done = [e for i in self.incidents for e in self.store.timeline(i.id)
                if e.kind is EventKind.ROLLED_BACK and e.action_id and e.status.value == "done"]  # fmt: skip
        moves = ", ".join(
            f"{(e.result or {}).get('from_step')}->{(e.result or {}).get('to_step')}" for e in done
        )
        return Check(
            "rollbacks", len(done) == expected, f"{len(done)} rollback(s) [{moves}], expected {expected}"
        )

    def _latest_healthy(self) -> Check:
        from supervisor.checkpoint.lifecycle import open_checkpoint_store

        store = open_checkpoint_store(self.job)
        healthy = [m.step for m in store.manifests() if m.health is HealthMark.HEALTHY]
        latest, block = store.latest(), store.block_state()
        newest = max(healthy, default=None)
        ok = block is None and latest is not None and latest == newest
        return Check(
            "latest_healthy",
            ok,
            f"latest {latest}, newest healthy {newest}, block {'held' if block else 'none'}",
        )

    # -- the job and its incidents -----------------------------------------------------------
    def _phase(self) -> Check:
        phase = self.run.status.get("phase")
        why = self.run.error or self.run.status.get("reason") or ""
        return Check(
            "job_phase",
            phase == self.expect.job_phase,
            f"{phase} (expected {self.expect.job_phase}) {why}".strip(),
        )

    def _false_alarms(self) -> Check:
        if not self.false_alarms:
            return Check("no_false_alarm", True, "no incident before the first fault")
        i = self.false_alarms[0]
        return Check("no_false_alarm", False, f"{len(self.false_alarms)} incident(s) before any fault, e.g. #{i.id} "
                                              f"{i.phenotype} at step {i.onset_step}")  # fmt: skip

    def _incident(self) -> Check:
        p = self.primary
        if not self.expect.incident:
            return Check(
                "incident",
                p is None,
                "none after the fault" if p is None else f"#{p.id} {p.phenotype} at {p.onset_step}",
            )
        if p is None:
            return Check("incident", False, f"no incident at or after step {self.fault_step}")
        return Check("incident", True, f"#{p.id} onset {p.onset_step}, detected {p.detected_step}")

    def _diagnosis(self) -> Check:
        d = self.primary.diagnosis if self.primary else None
        if d is None:
            return Check("diagnosis", False, "no diagnosis recorded")
        e, wrong = self.expect, []
        if e.phenotype and d.phenotype not in e.phenotype:
            wrong.append(f"phenotype {d.phenotype.value} not in {[p.value for p in e.phenotype]}")
        if e.top_cause and d.top_cause not in e.top_cause:
            got = d.top_cause.value if d.top_cause else None
            wrong.append(f"top cause {got} not in {[c.value for c in e.top_cause]}")
        if e.first_rank is not None and d.first_rank != e.first_rank:
            wrong.append(f"first rank {d.first_rank} != {e.first_rank}")
        missing = [a for a in e.attributes if a not in d.attributes]
        if missing:
            wrong.append(f"attributes {d.attributes} lack {missing}")
        top = d.top_cause.value if d.top_cause else None
        summary = (
            f"{d.phenotype.value}, top cause {top}, first rank {d.first_rank}, attributes {d.attributes}"
        )
        return Check("diagnosis", not wrong, "; ".join(wrong) or summary)

    def _state(self) -> Check:
        got = self.store.get(self.primary.id).state if self.primary else None
        accepted = [s.value for s in self.expect.incident_state]
        return Check(
            "incident_state",
            got is not None and got.value in accepted,
            f"{got.value if got else None} (accepted {accepted})",
        )

    def _action(self, action: str) -> Check:
        done = [e for e in _taken(self.timeline, action) if e.status is EventStatus.DONE]
        if action == "observe":
            # An observation counts only if its window ran and passed: a window cut off by the
            # end of training is recorded as done but verified nothing.
            done = [e for e in done if (e.result or {}).get("passed") is True]
        if done:
            return Check(f"did:{action}", True, f"done at step {done[0].step}")
        failed = _taken(self.timeline, action)
        why = f"{failed[0].status.value}: {failed[0].result}" if failed else "never taken"
        return Check(f"did:{action}", False, why)

    def _attempted(self, action: str) -> Check:
        hits = _taken(self.timeline, action)
        if not hits:
            return Check(f"tried:{action}", False, "never started")
        return Check(f"tried:{action}", True, f"{hits[0].status.value} at step {hits[0].step}")

    def _not_taken(self, action: str) -> Check:
        hits = [(i.id, e) for i in self.incidents for e in _taken(self.store.timeline(i.id), action)]
        if not hits:
            return Check(f"not:{action}", True, "never taken")
        iid, ev = hits[0]
        return Check(
            f"not:{action}", False, f"taken in incident #{iid} at step {ev.step} ({ev.status.value})"
        )

    # -- artifacts -----------------------------------------------------------------------------
    def _report(self) -> Check:
        if self.primary is None:
            return Check("report", False, "no incident to report on")
        from supervisor.incidents.render import render_report

        html = render_report(self.store, self.primary.id, "html")
        path = self.run.out_dir / f"incident-{self.primary.id}.html"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(html, encoding="utf-8")
        self.run.reports.append(path)
        ok = "<html" in html.lower() and (self.primary.phenotype or "") in html
        return Check("report", ok, str(path))

    def _exported(self) -> Check:
        if self.primary is None:
            return Check("exported", False, "no incident")
        from supervisor.incidents.export import export_key
        from supervisor.storage import open_backend

        key = export_key(self.job.name, self.primary.id)
        backend = open_backend(self.job.storage.path)
        return Check("exported", backend.stat(key) is not None, f"{backend.uri}/{key}")

    def _event(self, kind: EventKind) -> Check:
        hits = [e for e in self.timeline if e.kind is kind]
        return Check(
            f"event:{kind.value}", bool(hits), f"at step {hits[0].step}" if hits else "not in the timeline"
        )

    def _resumed_from(self, step: int) -> Check:
        got = series.first_resume(self.records)
        return Check("resumed_from", got == step, f"first restart resumed from step {got} (expected {step})")

    def _quarantined(self, step: int) -> Check:
        from supervisor.checkpoint import CheckpointStore
        from supervisor.storage import open_backend

        store = CheckpointStore(open_backend(self.job.storage.path), self.job.name)
        saves = store.saves(step)
        caught = [(m, why) for m in saves if (why := _caught_corrupt(m)) is not None]
        if not caught:
            marks = [m.health.value for m in saves] or "no save at all"
            return Check(f"quarantined:{step}", False, f"no save of step {step} failed a check ({marks})")
        manifest, why = caught[0]
        # saves() ends with the live manifest; the kept ones are the re-saved step's history.
        where = "live" if manifest is saves[-1] else "kept beside a re-save"
        return Check(f"quarantined:{step}", True, f"{where}: {why}")

    # -- the loss curve ------------------------------------------------------------------------
    def _recovered(self) -> Check:
        p = self.primary
        if p is None or p.onset_step is None:
            return Check("recovered", False, "no incident to recover from")
        b = series.band(self.first, p.onset_step)
        if b is None:
            return Check("recovered", False, f"too few steps before the onset ({p.onset_step}) for a band")
        end = self._resolved_step()
        if end is None:
            return Check("recovered", False, "the incident was never resolved")
        observed = any(e.kind is EventKind.OBSERVATION for e in self.timeline)
        first, last = (end - OBSERVE_SPAN + 1, end) if observed else (end + 1, end + OBSERVE_SPAN)
        med = series.window_median(self.last, first, last)
        if med is None:
            return Check("recovered", False, f"no loss recorded over steps {first}-{last}")
        ok = med <= b.upper
        return Check("recovered", ok, f"median loss {med:.4g} over steps {first}-{last} vs band <= {b.upper:.4g} "
                                      f"(pre-incident median {b.median:.4g})")  # fmt: skip

    def _resolved_step(self) -> int | None:
        for e in self.timeline:
            if e.kind is EventKind.STATE_CHANGED and (e.payload or {}).get("to") == "resolved":
                return e.step
        return None

    def _final_loss(self, tol: float) -> Check:
        ref = self.run.reference_loss
        got = series.final_loss(self.last, self.job.max_steps)
        if ref is None or got is None:
            return Check("final_loss", False, f"final loss {got} vs clean reference {ref}: missing")
        rel = (got - ref) / ref
        ok = math.isfinite(rel) and abs(rel) <= tol
        return Check("final_loss", ok, f"{got:.4g} vs clean {ref:.4g} ({rel:+.1%}, tolerance {tol:.0%})")


def _caught_corrupt(manifest: Any) -> str | None:
    """Why a quarantined save was found corrupt: its verification failed, or the ranks' restore
    check refused it after loading (a byte flipped after the verification ran). A save
    quarantined for another reason (an abandoned timeline) was never found corrupt: None."""
    from supervisor.checkpoint.store import RESTORE_CHECK_FAILED

    if manifest.health is not HealthMark.QUARANTINED:
        return None
    failed = next((v for v in manifest.verifications if not v.ok), None)
    if failed is not None:
        return failed.problems[0] if failed.problems else "verification failed"
    refused = [c.reason for c in manifest.history if c.reason.startswith(RESTORE_CHECK_FAILED)]
    return refused[0] if refused else None

"""Issue 13 point 4 on the real controller (tests/runtime/harness.py): an observation window
passed, the incident was resolved, and the fault came back -- the same incident is reopened
(same id, next attempt), and the policy's ``recurrence.max_attempts`` bounds the attempts."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, saver, spikes_once

REOPEN = str(Path(__file__).parent / "policies" / "reopen.yaml")
STATE_WRITES = ("open_incident", "reopen", "transition")


def spy_state_writes(store: Any) -> list[tuple[str, str]]:
    """Each call that writes an incident's state, with the function that asked for it."""
    seen: list[tuple[str, str]] = []
    for name in STATE_WRITES:

        def wrapped(*args: Any, _real: Any = getattr(store, name), _name: str = name, **kw: Any) -> Any:
            caller = sys._getframe(1)
            if not caller.f_code.co_filename.endswith("store.py"):  # not the store's own inner calls
                seen.append((_name, _writer(caller)))
            return _real(*args, **kw)

        setattr(store, name, wrapped)
    return seen


def _writer(frame: FrameType) -> str:
    """``plans.move`` is the helper every move goes through: the writer is who called it."""
    while frame.f_code.co_name == "move" and frame.f_code.co_filename.endswith("plans.py") and frame.f_back:
        frame = frame.f_back
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"


@pytest.mark.slow
def test_a_fault_back_after_its_window_reopens_the_incident_until_attempts_run_out(tmp_path: Path) -> None:
    # Onset 130, rolled back to 100, observed to 150 (onset + margin), resolved; back at 170,
    # 230 and 262 (irregular: no period to find): attempts 2, 3 and 4 reopen incident 1, and
    # the fourth occurrence escalates (recurrence.max_attempts=3).
    job = make_job(tmp_path, "back", max_steps=400, policy=REOPEN, resources={"num_workers": 1})
    ranks = FakeRanks(1, 400, spikes_once(130, 170, 230, 262), grads_follow_loss=True)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    store = ctl.incidents
    writes = spy_state_writes(store)

    def only() -> object:
        [inc] = store.list_incidents(job="back")
        return inc

    ranks.run(ctl, lambda: only().state is IncidentState.RESOLVED if store.list_incidents() else False,
              checkpoint_every=25)  # fmt: skip
    first = only()
    rollback = next(e for e in store.timeline(first.id) if e.kind is EventKind.ROLLED_BACK)
    assert (rollback.result or {}).get("to_step", rollback.payload.get("to_step")) == 100
    window = store.last_done(first.id, EventKind.OBSERVATION).result["window"]
    assert window[-1] >= 150 and ranks.step < 170  # the window covered the onset + margin, then resolved

    ranks.run(ctl, lambda: only().state is not IncidentState.RESOLVED, checkpoint_every=25)
    again = only()  # the same id: no second incident
    assert again.id == first.id and again.state is IncidentState.OPEN and again.onset_step == 170
    assert again.closed_at is None
    [reopened] = [e for e in store.timeline(first.id)
                  if e.payload.get("reopened") and e.kind is EventKind.STATE_CHANGED]  # fmt: skip
    assert (reopened.payload["from"], reopened.payload["to"], reopened.payload["attempt"]) == (
        "resolved", "open", 2)  # fmt: skip
    assert "recurrence.reopen_within_steps=300" in reopened.payload["reason"]
    assert "attempt 2" in reopened.payload["reason"]

    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)
    final = only()
    assert final.id == first.id and final.state is IncidentState.ESCALATED, ctl.status()
    attempts = [e.payload["attempt"] for e in store.timeline(first.id)
                if e.kind is EventKind.STATE_CHANGED and e.payload.get("reopened")]  # fmt: skip
    assert attempts == [2, 3, 4]
    plans = [e.payload for e in store.timeline(first.id) if e.kind is EventKind.NOTE and "plan" in e.payload]
    assert [p["attempt"] for p in plans] == [1, 2, 3, 4] and plans[-1]["escalate"]
    assert "recurrence.max_attempts=3" in plans[-1]["escalate"]
    assert ctl.phase is JobPhase.ESCALATED
    # One writer of every incident's state: the controller carried out each open, reopen and move.
    assert {w for _, w in writes} == {"controller.py:apply"}, writes
    assert [n for n, _ in writes].count("reopen") == 3 and ("open_incident", "controller.py:apply") in writes
    # Each timeline keeps its own rows: re-plans after rollbacks never overwrite the original run.
    original = {r["step"]: r["loss"] for r in store.series(first.id, replay=0) if "rank" not in r}
    rerun = {r["step"]: r["loss"] for r in store.series(first.id, replay=1) if "rank" not in r}
    assert original[130] > 10 > rerun[130]  # the spike in the original run; step 130 re-ran calm
    # The record reads as one incident: each occurrence detected, each reopen with its reason.
    from supervisor.incidents.postmortem import build_postmortem

    texts = [t for _, t in build_postmortem(store, first.id).timeline]
    assert sum(t.startswith("Detected a loss spike") for t in texts) == 4
    assert any(t.startswith("Incident resolved → open") and "attempt 3" in t for t in texts), texts


def test_each_step_of_the_history_belongs_to_the_run_it_was_trained_on() -> None:
    from supervisor.runtime.incidents import timeline_of

    # Rolled back to 100 (replay 1), then to 150 (replay 2): 101..150 stayed replay 1's steps.
    assert [timeline_of(s, [100, 150]) for s in (90, 100, 101, 150, 151)] == [0, 0, 1, 1, 2]
    assert timeline_of(120, []) == 0


@pytest.mark.slow
def test_a_periodic_fault_back_after_resolution_reopens_instead_of_joining_the_closed_incident(
    tmp_path: Path,
) -> None:
    # Onsets 130, 210, 290: regular, so the detector chains the third onto the first (one
    # periodic incident, its key already the resolved incident's). Before the fix that update only
    # refreshed the resolved incident's diagnosis: no plan, and the job "finished" with the fault
    # unhandled. It is the fault coming back: reopened (attempt 3), planned, handled.
    job = make_job(tmp_path, "chain", max_steps=340, policy=REOPEN, resources={"num_workers": 1})
    ranks = FakeRanks(1, 340, spikes_once(130, 210, 290), grads_follow_loss=True)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    store = ctl.incidents
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)
    [inc] = store.list_incidents(job="chain")
    timeline = store.timeline(inc.id)
    reopens = [(e.step, e.payload["attempt"]) for e in timeline
               if e.kind is EventKind.STATE_CHANGED and e.payload.get("reopened")]  # fmt: skip
    assert reopens == [(210, 2), (290, 3)], reopens
    assert inc.onset_step == 290 and inc.state is IncidentState.RESOLVED
    rollbacks = [(e.result or {}).get("to_step", e.payload.get("to_step")) for e in timeline
                 if e.kind is EventKind.ROLLED_BACK]  # fmt: skip
    # Every occurrence acted on, the periodic one included, each rolled back to before its own onset.
    assert rollbacks == [100, 175, 250], rollbacks  # onset - margin 30, on the 25-step checkpoints
    assert ctl.phase is JobPhase.FINISHED


def test_a_plan_remade_before_it_acted_is_the_same_attempt(tmp_path: Path) -> None:
    # Issue 13 "bounded attempts": a plan re-made because the diagnosis changed class before its
    # first irreversible action is not a recovery attempt of its own. Before the fix each re-make
    # counted one, so two re-makes in three steps used up recurrence.max_attempts and escalated.
    from dataclasses import replace

    from supervisor.core.model import Severity

    policy = tmp_path / "two.yaml"
    policy.write_text(
        "version: 1\nname: two\ndescription: two rules by severity\n"
        "defaults: {max_attempts: 3, cooldown_steps: 0, max_observation_failures: 2, on_failure: escalate}\n"
        "observation: {onset_margin_steps: 5, throughput: false}\n"
        "recurrence: {reopen_within_steps: 300, max_attempts: 2}\n"
        "rules:\n"
        "  - name: big\n    match: {severity_at_least: high}\n"
        "    actions: [alert, freeze, snapshot, {apply: {grad_clip: 0.25}}, {observe: {steps: 50}}, resume]\n"
        "  - name: any\n    match: {severity_at_least: low}\n"
        "    actions: [alert, freeze, snapshot, {apply: {grad_clip: 0.5}}, {observe: {steps: 50}}, resume]\n"
    )
    job = make_job(tmp_path, "remade", max_steps=260, policy=str(policy))
    ranks = FakeRanks(2, 260, spikes_once(130))
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    ranks.run(ctl, lambda: ctl.state.active is not None)
    active = ctl.state.active
    assert active is not None and not active.irreversible
    first_rule = active.plan.rule
    d = ctl.flow.active_diagnosis
    for flip in (Severity.LOW if first_rule == "big" else Severity.CRITICAL, d.severity):  # there and back
        ctl.flow._maybe_replan(ctl.state.active, replace(d, severity=flip), ctl._now())
        ctl.apply_all(ctl.flow._take())  # its effects (the plan's note), as the loop carries them out
    assert ctl.state.active.plan_no == 3  # both re-makes happened
    assert ctl.state.attempts_of[str(active.incident_id)] == 1
    assert ctl.state.attempts.get(first_rule) == 1 and sum(ctl.state.attempts.values()) == 1
    notes = [e.payload for e in ctl.incidents.timeline(active.incident_id)
             if e.kind is EventKind.NOTE and "plan" in e.payload]  # fmt: skip
    assert [n["attempt"] for n in notes] == [1, 1, 1] and not any(n["escalate"] for n in notes)

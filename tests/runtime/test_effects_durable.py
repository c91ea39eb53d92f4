"""Issue 29: every effect durable before it is acknowledged, its consequences included.

On the real controller with fake workers (tests/runtime/harness.py): a fix recorded done and
the override record the detector needs to recognise it reach the disk together; a restarted
supervisor rebuilds what it did from its own records; a worker generation restarted inside
the observation window applies the fix again, and the detector knows it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.restarts import GroupEvent
from supervisor.runtime.state import RuntimeState
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, spike_at

HOLD = str(Path(__file__).parent / "policies" / "hold.yaml")


def setup(tmp_path: Path, max_steps: int = 200) -> tuple[Any, FakeRanks, FakeWorkers, Controller]:
    job = make_job(tmp_path, "fx", max_steps=max_steps, policy=HOLD)
    ranks = FakeRanks(2, max_steps, spike_at(80))
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ctl.boot()
    return job, ranks, workers, ctl


def fix_done(ctl: Controller) -> bool:
    active = ctl.state.active
    if active is None:
        return False
    event = ctl.incidents.last_done(active.incident_id, EventKind.FIX_APPLIED)
    return event is not None


def overrides(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [iv for iv in (state or {}).get("interventions", []) if iv.get("kind") == "override"]


def test_a_fix_recorded_done_has_its_override_record_on_disk(tmp_path: Path) -> None:
    """Killed in the first moments of the observation window (before the next periodic write):
    the state file must already hold what the detector needs to recognise the fix."""
    job, ranks, workers, ctl = setup(tmp_path)
    ranks.run(ctl, lambda: fix_done(ctl))
    on_disk = RuntimeState.load(ctl.state_path)
    assert on_disk is not None
    [iv] = overrides(on_disk.analyzer)
    assert iv["grad_clip"] == 0.5 and iv["reason"].startswith("fix of incident")
    inc = ctl.state.active.incident_id  # type: ignore[union-attr]
    again = Controller(job, FAST, attach=True, workers=workers)  # the kill: nothing else is written
    again.boot()
    assert [iv.grad_clip for iv in again.flow.analyzer.interventions if iv.kind == "override"] == [0.5]
    ranks.resend(again)
    ranks.run(again, lambda: again.incidents.get(inc).state.is_terminal)
    assert again.incidents.get(inc).state is IncidentState.RESOLVED
    assert sum(1 for a in again.incidents.artifacts(inc) if a.kind == "plan") == 1


def test_a_restarted_supervisor_rebuilds_its_fixes_from_the_incident_store(tmp_path: Path) -> None:
    """A state file written before the fix's override (an older writer, a torn moment): the fix
    recorded done in the incident store is noted again before any record is read, once."""
    job, ranks, workers, ctl = setup(tmp_path)
    ranks.run(ctl, lambda: fix_done(ctl))
    raw = json.loads(ctl.state_path.read_text())
    raw["analyzer"]["interventions"] = [
        iv for iv in raw["analyzer"]["interventions"] if iv.get("kind") != "override"
    ]
    ctl.state_path.write_text(json.dumps(raw))
    again = Controller(job, FAST, attach=True, workers=workers)
    again.boot()
    known = [iv for iv in again.flow.analyzer.interventions if iv.kind == "override"]
    assert [(iv.grad_clip, iv.reason) for iv in known] == [(0.5, "fix of incident 1")]
    assert again.flow.rebuild_interventions() == []  # known now: never noted twice


def test_a_worker_generation_restarted_in_the_window_gets_the_fix_and_the_detector_knows(
    tmp_path: Path,
) -> None:
    """A worker SIGKILLed just after the observation began: the group restarts before the fix's
    step, the new generation applies the fix again from its resume point, and the detector's
    record of the fix moves with it (the restart's rewind took the old one back)."""
    job, ranks, workers, ctl = setup(tmp_path)
    ranks.run(ctl, lambda: fix_done(ctl) and not ranks.frozen)
    ranks.train(ctl, 2)
    workers.events.append(GroupEvent("lost", (1,), "worker actor died"))
    ctl.iterate()  # the restart decision
    ctl.iterate()  # the relaunch
    resume = workers.launches[-1][1]
    resumed_at = max(resume or 0, 0)
    known = [iv for iv in ctl.flow.analyzer.interventions if iv.kind == "override"]
    assert [(iv.step, iv.grad_clip) for iv in known] == [(resumed_at, 0.5)]
    on_disk = RuntimeState.load(ctl.state_path)
    assert on_disk is not None and [iv["step"] for iv in overrides(on_disk.analyzer)] == [resumed_at]
    applied = [e for e in ctl.incidents.timeline(1) if e.kind is EventKind.FIX_APPLIED]
    assert [e.status for e in applied] == [EventStatus.DONE]

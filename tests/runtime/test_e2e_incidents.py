"""End to end on a real local Ray with real tinylm training: loss incidents handled by the policy."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from supervisor.checkpoint.lifecycle import open_checkpoint_store
from supervisor.client import api
from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.incidents.paths import open_incident_store
from tests.runtime.conftest import FAST, TINY, make_job

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

LEAN = str(Path(__file__).parent / "policies" / "lean.yaml")


def kinds(events: list) -> list[str]:
    return [e.kind.value for e in events if e.kind not in (EventKind.STATE_CHANGED, EventKind.DIAGNOSED)]


def test_divergence_rolled_back_fixed_observed_and_finished(tmp_path: Path) -> None:
    job = make_job(tmp_path, "diverge", max_steps=240, policy=LEAN,
                   faults=[{"kind": "oversized_update", "step": 130, "factor": 300.0}])  # fmt: skip
    handle = api.launch(job, FAST)
    final = api.wait(handle, 600)
    assert final["phase"] == "finished" and final["exit_code"] == 0, f"{final}"
    assert final["step"] == 240
    store = open_incident_store(job)
    [incident] = [
        i for i in store.list_incidents(job=job.name) if i.phenotype in ("divergence", "slow_recovery")
    ]
    assert incident.state is IncidentState.RESOLVED
    timeline = store.timeline(incident.id)
    # The LR jump opens the incident at once (a transient: alert only); once the loss confirms it
    # the incident is planned again as a divergence, and that plan carries out the whole recovery.
    last_plan = max(e.action_id.split("-a")[0] for e in timeline if e.action_id)
    actions = [e for e in timeline if e.action_id and e.action_id.startswith(last_plan + "-a")]
    assert [e.kind.value for e in actions] == [
        "alert_sent", "froze", "snapshot", "latest_blocked", "rolled_back", "fix_applied", "observation", "resumed",
    ]  # fmt: skip
    earlier = [e.kind.value for e in timeline if e.action_id and not e.action_id.startswith(last_plan + "-a")]
    assert set(earlier) <= {"alert_sent"}, earlier  # an earlier plan only alerted: nothing else ran twice
    assert all(e.status is EventStatus.DONE for e in actions)
    ids = [e.id for e in timeline]
    assert ids == sorted(ids)
    rolled = next(e for e in actions if e.kind is EventKind.ROLLED_BACK)
    onset = incident.onset_step
    assert onset is not None and 125 <= onset <= 140
    assert rolled.result["to_step"] <= onset - 30 and rolled.result["to_step"] % 20 == 0
    assert rolled.result["from_step"] > onset
    observation = next(e for e in actions if e.kind is EventKind.OBSERVATION)
    assert observation.result["passed"] and all(c["ok"] for c in observation.result["checks"].values())
    ckpts = open_checkpoint_store(job)
    snap = next(e for e in actions if e.kind is EventKind.SNAPSHOT)
    # The snapshot is live at its step, or kept beside the new timeline's save of that step, or
    # collected by the run-time retention once its incident closed (a closed incident's snapshot
    # is not protected; see checkpoint/lifecycle.py): never anything but diagnostic.
    marks = [m.health for m in ckpts.saves(snap.result["acked_at_step"])]
    assert snap.status is EventStatus.DONE and set(marks) <= {HealthMark.DIAGNOSTIC}, marks
    assert ckpts.block_state() is None  # released when the incident resolved
    ray.kill(handle)


def test_transient_bad_batch_is_quarantined_without_rollback(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    settings = FAST.model_copy(update={"trace_path": str(trace)})
    small = {**TINY, "data": {"max_bytes_per_source": 12_000}}  # an epoch is ~30 steps: samples recur
    job = make_job(tmp_path, "transient", max_steps=200, policy=LEAN, config=small,
                   faults=[{"kind": "garbage_batch", "step": 110, "rank": 1}])  # fmt: skip
    handle = api.launch(job, settings)
    final = api.wait(handle, 600)
    assert final["phase"] == "finished" and final["exit_code"] == 0, f"{final}"
    store = open_incident_store(job)
    incidents = store.list_incidents(job=job.name)
    events = [e for i in incidents for e in store.timeline(i.id)]
    assert not any(e.kind is EventKind.ROLLED_BACK for e in events)
    fix = [e for e in events if e.kind is EventKind.FIX_APPLIED][-1]
    assert fix.status is EventStatus.DONE
    excluded = set(fix.payload["exclude_samples"])
    assert excluded
    records = [
        json.loads(line) for f in sorted(tmp_path.glob("trace*.jsonl")) for line in f.read_text().splitlines()
    ]
    applied_at = min(
        r["step"]
        for r in records
        if any(f"directive_applied:{fix.action_id}" in e for e in r.get("events", []))
    )
    before = {s for r in records if r["step"] < 110 for s in r.get("samples", [])}
    after = [s for r in records if r["step"] > applied_at for s in r.get("samples", [])]
    assert excluded & before, "the suspect samples were seen before the fault (they recur every epoch)"
    assert after and not excluded & set(after), "quarantined samples came back"
    ray.kill(handle)


def test_supervisor_killed_during_rollback_attach_finishes_without_second_rollback(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    settings = FAST.model_copy(update={"trace_path": str(trace)})
    job = make_job(tmp_path, "attach", max_steps=240, policy=LEAN,
                   faults=[{"kind": "oversized_update", "step": 130, "factor": 300.0}])  # fmt: skip
    handle = api.launch(job, settings)
    store = open_incident_store(job)
    pending = wait_for_event(store, job.name, EventKind.ROLLED_BACK, EventStatus.PENDING, timeout_s=300)
    ray.kill(handle, no_restart=True)  # the supervisor dies with the rollback in flight
    assert store.event(pending.id).status is EventStatus.PENDING
    handle = api.attach(job, settings)
    final = api.wait(handle, 600)
    assert final["phase"] == "finished" and final["exit_code"] == 0, f"{final}"
    timeline = store.timeline(pending.incident_id)
    rollbacks = [e for e in timeline if e.kind is EventKind.ROLLED_BACK]
    assert [e.id for e in rollbacks] == [pending.id] and rollbacks[0].status is EventStatus.DONE
    assert any(e.kind is EventKind.SUPERVISOR_RESUMED for e in timeline)
    assert store.get(pending.incident_id).state is IncidentState.RESOLVED
    records = [
        json.loads(line) for f in sorted(tmp_path.glob("trace*.jsonl")) for line in f.read_text().splitlines()
    ]
    loads = {(r["rank"], e) for r in records for e in r.get("events", []) if e.startswith("rolled_back:")}
    assert len(loads) == job.resources.num_workers, loads  # each rank loaded the checkpoint exactly once
    ray.kill(handle)


def wait_for_event(store: Any, job: str, kind: EventKind, status: EventStatus, timeout_s: float) -> Any:
    """Poll the incident store (a second reader of the live database) until such an event exists."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for incident in store.list_incidents(job=job):
            for e in store.timeline(incident.id):
                if e.kind is kind and e.status is status:
                    return e
        time.sleep(0.005)
    raise AssertionError(f"no {status.value} {kind.value} event within {timeout_s}s")

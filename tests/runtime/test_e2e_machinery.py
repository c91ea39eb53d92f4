"""End to end on a real local Ray with real tinylm training: clean runs and machinery faults."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest
import ray

from supervisor.checkpoint.lifecycle import open_checkpoint_store
from supervisor.client import api
from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, EventStatus
from supervisor.incidents.paths import open_incident_store
from supervisor.runtime.group import WorkerGroup
from tests.runtime.conftest import FAST, make_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def test_clean_run_finishes_with_checkpoints_marked(tmp_path: Path) -> None:
    job = make_job(tmp_path, "clean", max_steps=60)
    handle = api.launch(job, FAST)
    final = api.wait(handle, 240)
    assert final["phase"] == "finished" and final["exit_code"] == 0, f"{final}"
    assert final["step"] == 60 and final["incidents_total"] == 0
    store = open_checkpoint_store(job)
    marks = {m.step: m.health for m in store.manifests()}
    assert marks[20] == HealthMark.HEALTHY and marks[40] == HealthMark.HEALTHY
    assert store.latest() == 60
    assert WorkerGroup.names(job.name) == []  # workers are gone once the job ended
    ray.kill(handle)


def test_worker_sigkilled_resumes_from_newest_verified_checkpoint(tmp_path: Path) -> None:
    # keep: 20, so the run-time retention (keep the newest K healthy) leaves the resume point to inspect
    job = make_job(tmp_path, "killed", max_steps=200, checkpoint={"every_steps": 20, "keep": 20})
    handle = api.launch(job, FAST)
    wait_for(lambda: api.status(handle), lambda s: s["step"] >= 70, 240)
    group = WorkerGroup.find(job, FAST)
    assert group is not None
    # The ranks run at the node's own priority (`runtime.niceness` 0), not at Ray's +15 for actors.
    here = os.getpriority(os.PRIO_PROCESS, 0)
    assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in group.pids()] == [here, here]
    os.kill(group.pids()[1], signal.SIGKILL)
    final = api.wait(handle, 300)
    assert final["phase"] == "finished", f"{final}"
    assert final["generation"] == 1 and final["group_restarts"] == 1 and final["step"] == 200
    incidents = open_incident_store(job)
    [restart] = [e for i in incidents.list_incidents(job=job.name) for e in incidents.timeline(i.id)
                 if e.kind is EventKind.WORKER_RESTARTED]  # fmt: skip
    assert restart.status is EventStatus.DONE
    resume = restart.result["resume_step"]
    assert resume is not None and resume >= 60 and resume % 20 == 0
    assert "lost" in restart.payload["reason"]
    manifest = open_checkpoint_store(job).manifest(resume)
    assert manifest.health in (HealthMark.VERIFIED, HealthMark.HEALTHY)
    ray.kill(handle)


def test_hung_worker_is_detected_and_the_group_restarted(tmp_path: Path) -> None:
    job = make_job(
        tmp_path, "hung", max_steps=150, telemetry={"min_history": 50, "window": 200, "hang_timeout_s": 6}
    )
    handle = api.launch(job, FAST)
    wait_for(lambda: api.status(handle), lambda s: s["step"] >= 50, 240)
    group = WorkerGroup.find(job, FAST)
    assert group is not None
    pid = group.pids()[0]
    os.kill(pid, signal.SIGSTOP)  # alive but silent: a hang, not a death
    try:
        final = api.wait(handle, 300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert final["phase"] == "finished" and final["group_restarts"] == 1, f"{final}"
    incidents = open_incident_store(job)
    reasons = [e.payload.get("reason", "") for i in incidents.list_incidents(job=job.name)
               for e in incidents.timeline(i.id) if e.kind is EventKind.WORKER_RESTARTED]  # fmt: skip
    assert len(reasons) == 1 and "hang" in reasons[0]
    ray.kill(handle)

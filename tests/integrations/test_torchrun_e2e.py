"""The torchrun-style script end to end: plain torchrun, supervised with an LR fault, a killed rank."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from click.testing import CliRunner

from supervisor.checkpoint.lifecycle import open_checkpoint_store
from supervisor.cli.main import cli
from supervisor.client import api
from supervisor.incidents import EventKind, IncidentState
from supervisor.incidents.paths import open_incident_store
from supervisor.ranks.process_logs import generations, read_segments
from tests.integrations.conftest import command_job, final_loss, plain_torchrun, settings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

STEPS = 150


def test_lr_fault_rolled_back_in_place_and_final_loss_matches_plain_torchrun(tmp_path: Path) -> None:
    job = command_job(tmp_path, "tr-lr", "examples.torchrun.train", STEPS,
                      faults=[{"kind": "lr_spike", "step": 70, "factor": 40}])  # fmt: skip
    handle = api.launch(job, settings(tmp_path / "sup.jsonl"))
    # The clean reference runs under plain torchrun while the supervised job trains (its loss
    # does not depend on timing; the two overlap their idle time).
    clean = plain_torchrun(tmp_path, "examples.torchrun.train", STEPS)
    assert len(clean) == 2
    analysed = CliRunner().invoke(cli, ["analyze", *map(str, clean)])
    assert analysed.exit_code == 0, analysed.output  # the clean trace analyses clean

    final = api.wait(handle, 900)
    ray.kill(handle)
    assert final["phase"] == "finished" and final["step"] == STEPS, final
    incidents = open_incident_store(job)
    # The incident the fault caused: the one rolled back (its phenotype is the diagnosis's business).
    [incident] = [i for i in incidents.list_incidents(job=job.name)
                  if any(e.kind is EventKind.ROLLED_BACK for e in incidents.timeline(i.id))]  # fmt: skip
    assert incident.state is IncidentState.RESOLVED
    kinds = [e.kind for e in incidents.timeline(incident.id) if e.action_id]
    assert kinds[:6] == [EventKind.ALERT_SENT, EventKind.FROZE, EventKind.SNAPSHOT, EventKind.LATEST_BLOCKED,
                         EventKind.ROLLED_BACK, EventKind.FIX_APPLIED]  # fmt: skip
    assert EventKind.OBSERVATION in kinds and EventKind.RESUMED in kinds
    rolled = next(e for e in incidents.timeline(incident.id) if e.kind is EventKind.ROLLED_BACK)
    assert rolled.result["to_step"] < 70 <= rolled.result["from_step"]
    supervised = final_loss(sorted(tmp_path.glob("sup*.jsonl")))
    reference = final_loss(clean)
    assert abs(supervised - reference) <= 0.05 * reference, (supervised, reference)
    # Per-rank output is kept in storage and shown by `supervisor logs`.
    backend = open_checkpoint_store(job).backend
    assert generations(backend, job.name) == {0: [0, 1]}
    assert b"done at step" in read_segments(backend, job.name, 0, 0)[1]


def test_killed_rank_process_restarts_group_from_newest_verified_checkpoint(tmp_path: Path) -> None:
    job = command_job(tmp_path, "tr-kill", "examples.torchrun.train", 70, checkpoint={"every_steps": 10},
                      faults=[{"kind": "worker_kill", "step": 45, "rank": 1}])  # fmt: skip
    handle = api.launch(job, settings())
    final = api.wait(handle, 600)
    ray.kill(handle)
    assert final["phase"] == "finished" and final["step"] == 70, final
    assert final["generation"] == 1 and final["group_restarts"] == 1
    incidents = open_incident_store(job)
    restarted = [e for i in incidents.list_incidents(job=job.name) for e in incidents.timeline(i.id)
                 if e.kind is EventKind.WORKER_RESTARTED]  # fmt: skip
    [event] = restarted
    assert "exited" in event.payload["reason"] or "killed" in event.payload["reason"], event.payload
    resume = event.result["resume_step"]
    assert (
        resume is not None and resume % 10 == 0 and 20 <= resume < 45
    )  # verified ones only, never in flight
    backend = open_checkpoint_store(job).backend
    assert sorted(generations(backend, job.name)) == [0, 1]
    logs = CliRunner().invoke(cli, ["logs", str(tmp_path / "store"), "--job", job.name, "--rank", "0"])
    assert logs.exit_code == 0 and "done at step 70" in logs.output, logs.output  # the newest generation

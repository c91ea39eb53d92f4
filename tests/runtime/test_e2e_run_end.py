"""End to end on a real local Ray with real tinylm training: the demo's LR fault in the last steps
of a run (issue 25's late-spike run, issue 29 point 2) is handled, and the run ends on a healthy
`latest` at its last step, with its time lost counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.checkpoint.lifecycle import open_checkpoint_store
from supervisor.client import api
from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, IncidentState
from supervisor.incidents.paths import open_incident_store
from tests.runtime.conftest import FAST, make_job

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


def test_the_demo_fault_five_steps_before_the_end_finishes_on_a_healthy_latest(tmp_path: Path) -> None:
    job = make_job(tmp_path, "late", max_steps=200, policy="default", checkpoint={"every_steps": 50, "keep": 3},
                   faults=[{"kind": "lr_spike", "step": 195, "factor": 40}])  # fmt: skip
    final = api.wait(api.launch(job, FAST), 600)
    assert final["phase"] == "finished" and final["exit_code"] == 0, f"{final}"
    [inc] = open_incident_store(job).list_incidents(job=job.name)
    assert inc.state is IncidentState.RESOLVED
    timeline = open_incident_store(job).timeline(inc.id)
    rolled = next(e for e in timeline if e.kind is EventKind.ROLLED_BACK)
    assert rolled.result["to_step"] < 195
    store = open_checkpoint_store(job)
    assert store.latest() == 200 and store.manifest(200).health is HealthMark.HEALTHY
    lost = final["time_lost"]
    assert lost["steps_retrained"] == rolled.result["from_step"] - rolled.result["to_step"]
    assert 0 < lost["effective_training_time_ratio"] < 1

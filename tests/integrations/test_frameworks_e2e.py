"""HF Trainer and Lightning jobs end to end: an LR fault detected, rolled back, observed, and the
run finishing within 5% of the same script's clean run under plain torchrun.

Lightning rolls back in place (the supervisor's own checkpoints). The Trainer run saves its own
``checkpoint-N/`` every 20 steps: they are adopted, so the rollback restarts the worker group,
which resumes through ``trainer.train(resume_from_checkpoint=...)`` and gets the fix there."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from supervisor.client import api
from supervisor.incidents import EventKind, IncidentState
from supervisor.incidents.paths import open_incident_store
from tests.integrations.conftest import command_job, final_loss, plain_torchrun, settings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

STEPS, FAULT = 130, 65


@pytest.mark.parametrize("module", ["examples.hf_trainer.train", "examples.lightning.train"])
def test_lr_fault_rolled_back_in_place_and_final_loss_matches_clean_run(tmp_path: Path, module: str) -> None:
    pytest.importorskip("transformers" if "hf" in module else "lightning")
    clean = plain_torchrun(tmp_path, module, STEPS)
    hf = "hf" in module
    name = "hf-lr" if hf else "pl-lr"
    job = command_job(tmp_path, name, module, STEPS, extra="--save-every 20" if hf else "",
                      faults=[{"kind": "lr_spike", "step": FAULT, "factor": 40}])  # fmt: skip
    handle = api.launch(job, settings(tmp_path / "sup.jsonl"))
    final = api.wait(handle, 900)
    ray.kill(handle)
    assert final["phase"] == "finished" and final["step"] == STEPS, final
    incidents = open_incident_store(job)
    # The incident the fault caused: the one rolled back (its phenotype is the diagnosis's business).
    [incident] = [i for i in incidents.list_incidents(job=job.name)
                  if any(e.kind is EventKind.ROLLED_BACK for e in incidents.timeline(i.id))]  # fmt: skip
    assert incident.state is IncidentState.RESOLVED
    timeline = incidents.timeline(incident.id)
    kinds = [e.kind for e in timeline if e.action_id]
    for kind in (
        EventKind.FROZE,
        EventKind.ROLLED_BACK,
        EventKind.FIX_APPLIED,
        EventKind.OBSERVATION,
        EventKind.RESUMED,
    ):
        assert kind in kinds, kinds
    rolled = next(e for e in timeline if e.kind is EventKind.ROLLED_BACK)
    assert rolled.result["to_step"] < FAULT <= rolled.result["from_step"]
    assert rolled.result["mode"] == ("restart" if hf else "in_place"), rolled.result
    assert final["generation"] == (1 if hf else 0), final
    if hf:  # the target was the Trainer's own checkpoint, adopted; the new group resumed from it
        from supervisor.checkpoint.lifecycle import open_checkpoint_store

        assert "framework checkpoint" in rolled.result["mode_why"], rolled.result
        store = open_checkpoint_store(job)  # retention kept the newest: the new timeline's, adopted too
        assert [store.manifest(s).source for s in (120, 130)] == [
            f"{name}/hf/checkpoint-{s}" for s in (120, 130)
        ]
    observed = next(e for e in timeline if e.kind is EventKind.OBSERVATION)
    assert observed.result["passed"], observed.result
    supervised, reference = final_loss(sorted(tmp_path.glob("sup*.jsonl"))), final_loss(clean)
    assert abs(supervised - reference) <= 0.05 * reference, (supervised, reference)

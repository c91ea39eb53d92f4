"""HF Trainer and Lightning jobs end to end: an LR fault detected, rolled back in place, observed,
and the run finishing within 5% of the same script's clean run under plain torchrun."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime import api
from supervisor.runtime.stores import open_incident_store
from tests.integrations.conftest import command_job, final_loss, plain_torchrun, settings

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

STEPS, FAULT = 130, 65


@pytest.mark.parametrize("module", ["examples.hf_trainer.train", "examples.lightning.train"])
def test_lr_fault_rolled_back_in_place_and_final_loss_matches_clean_run(tmp_path: Path, module: str) -> None:
    pytest.importorskip("transformers" if "hf" in module else "lightning")
    clean = plain_torchrun(tmp_path, module, STEPS)
    name = "hf-lr" if "hf" in module else "pl-lr"
    job = command_job(
        tmp_path, name, module, STEPS, faults=[{"kind": "lr_spike", "step": FAULT, "factor": 40}]
    )
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
    observed = next(e for e in timeline if e.kind is EventKind.OBSERVATION)
    assert observed.result["passed"], observed.result
    supervised, reference = final_loss(sorted(tmp_path.glob("sup*.jsonl"))), final_loss(clean)
    assert abs(supervised - reference) <= 0.05 * reference, (supervised, reference)

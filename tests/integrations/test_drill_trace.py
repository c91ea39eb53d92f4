"""A drill's clean reference of a watched loop (torchrun script, HF, Lightning) writes its trace."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from supervisor import sdk
from supervisor.drills.glue import TRACE_ENV, trace_file
from supervisor.integrations.drills import inject_faults
from tests.integrations.conftest import command_job


def test_fault_free_plan_still_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRACE_ENV, "1")
    job = command_job(tmp_path, "ref", "examples.torchrun.train", 2)  # no faults: a drill's reference
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.watch(model, opt, transport=transport, max_steps=2)
    plan = inject_faults(probe, SimpleNamespace(job=job, rank=0, world_size=1, checkpoint_store=None))
    assert not plan  # nothing to inject ...
    while probe.proceed():
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        probe.record(loss)
    probe.close()
    # ... but the records reach the drill's trace: the final loss the faulted drills are judged against.
    lines = trace_file(Path(job.storage.path), job.name, 0).read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if "loss" in json.loads(x)] == [1, 2]

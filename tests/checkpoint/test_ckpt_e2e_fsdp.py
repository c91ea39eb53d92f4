"""Acceptance, end to end: a 2-rank FSDP2 tinylm job (gloo, CPU) under the supervisor on a real
local Ray, an injected LR fault, rolled back in place from an asynchronous DCP checkpoint.

Every rank's restored shard is compared with the checksum that rank recorded in the manifest
when it saved, and the run ends within 5% of the same job's clean run."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import ray

from supervisor.checkpoint.lifecycle import open_checkpoint_store
from supervisor.client import api
from supervisor.incidents import EventKind, EventStatus
from supervisor.incidents.paths import open_incident_store
from tests.runtime.conftest import FAST, TINY, make_job, ray_local  # noqa: F401 - the Ray fixture

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

OBSERVE = {
    "loss_within_mads": 6.0,
    "grad_norm_ratio_max": 3.0,
    "update_ratio_max": 3.0,
    "throughput_min_ratio": 0.2,
}
POLICY = {
    "version": 1,
    "name": "rewarm",
    "description": "roll back with a 20-step margin and re-warm the LR (no lasting LR cut)",
    "defaults": {"max_attempts": 2, "cooldown_steps": 500, "max_observation_failures": 2, "on_failure": "escalate"},
    "rules": [
        {"name": name, "match": match,
         "actions": ["alert", "freeze", "snapshot", "block_latest", {"rollback": {"margin_steps": 20}},
                     {"apply": {"warmup_steps": 10}}, {"observe": {"steps": 50, "pass": OBSERVE}}, "resume"]}
        for name, match in (("divergence", {"phenotype": ["divergence", "slow_recovery"]}),
                            ("nonfinite", {"attributes": ["nonfinite"]}))
    ],
    "fallback": ["alert", {"escalate": {"message": "not covered"}}],
}  # fmt: skip


def launch(tmp_path: Path, name: str, faults: list[dict]) -> tuple[Any, Any, Path]:
    """Start the 150-step FSDP2 job under the supervisor; (job, supervisor handle, trace path)."""
    policy = tmp_path / "rewarm.yaml"
    if not policy.exists():  # written once: the other job's supervisor may be reading it
        policy.write_text(json.dumps(POLICY))  # JSON is YAML
    trace = tmp_path / name / "trace.jsonl"
    job = make_job(tmp_path / name, name, max_steps=150, policy=str(policy), faults=faults,
                   config={**TINY, "parallel": "fsdp2"},
                   checkpoint={"every_steps": 20, "keep": 20})  # the rollback target stays to be read  # fmt: skip
    return job, api.launch(job, FAST.model_copy(update={"trace_path": str(trace)})), trace


def finish(handle: Any) -> None:
    final = api.wait(handle, 900)
    ray.kill(handle)
    assert final["phase"] == "finished" and final["exit_code"] == 0, f"{final}"


def records(trace: Path, rank: int) -> list[dict]:
    lines = trace.with_name(f"trace.rank{rank}.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines]


def final_loss(trace: Path) -> float:
    """Mean loss of the last 10 steps over both ranks (the last timeline's records)."""
    last = {}
    for rank in (0, 1):
        for r in records(trace, rank):
            if "loss" in r:
                last[(r["step"], rank)] = r["loss"]
    return statistics.fmean(v for (step, _), v in last.items() if step > 140)


def test_fsdp2_lr_fault_rolled_back_in_place_shards_restored_loss_as_clean(tmp_path: Path) -> None:
    # The clean twin runs beside the faulted job (separate job, storage and workers on the same
    # Ray): its final loss does not depend on timing, and the two overlap their idle time.
    job, handle, trace = launch(tmp_path, "fsdp-fault", [{"kind": "lr_spike", "step": 90, "factor": 40}])
    _, clean_handle, clean_trace = launch(tmp_path, "fsdp-clean", [])
    finish(handle)
    finish(clean_handle)
    incidents = open_incident_store(job)
    rolled = [e for i in incidents.list_incidents(job=job.name) for e in incidents.timeline(i.id)
              if e.kind is EventKind.ROLLED_BACK]  # fmt: skip
    assert rolled and rolled[0].status is EventStatus.DONE, rolled
    to_step = rolled[0].result["to_step"]
    assert to_step <= 70 and rolled[0].result["ranks"] == [0, 1]
    manifest = open_checkpoint_store(job).manifest(to_step)
    assert manifest.layout == "dcp" and manifest.world_size == 2
    saved = {int(r): s["shard_checksum"] for r, s in manifest.extra["rank_summaries"].items()}
    assert saved[0] != saved[1]  # two different shards
    for rank in (0, 1):
        restored = [
            e for r in records(trace, rank) for e in r.get("events", []) if e.startswith("shard_restored:")
        ]
        assert restored == [f"shard_restored:{to_step}:{saved[rank]}"]  # this rank's shard, bit for bit
    clean, recovered = final_loss(clean_trace), final_loss(trace)
    assert abs(recovered - clean) <= 0.05 * clean, (recovered, clean)

"""FSDP2 (fully_shard, gloo on CPU): what the probe measures there, that it does not deadlock, and that
an in-place rollback restores every rank's own shard from a DCP checkpoint."""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from tests.sdk import ddp_worker, fsdp_rollback_worker


def test_fsdp2_two_ranks(tmp_path):
    mp.spawn(ddp_worker.run_fsdp, args=(2, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (
        [json.loads(x) for x in (tmp_path / f"trace.rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)
    )
    assert [r["step"] for r in r0] == [r["step"] for r in r1] == list(range(1, 7))
    exact = float((tmp_path / "exact_norm.rank0").read_text())
    for a, b in zip(r0, r1, strict=True):
        if a["step"] != 4:
            assert a["grad_norm"] == b["grad_norm"]  # global (DTensor full_tensor)
        assert a["param_norm"] == b["param_norm"]  # shard estimates all-reduced
        assert "param_checksum" not in a
    assert r0[-1]["param_norm"] == pytest.approx(exact, rel=0.02)
    assert r0[1]["attrs"]["shard_checksum"] != r1[1]["attrs"]["shard_checksum"]
    # The NaN on rank 1 only: every rank saw the non-finite global grad norm, replayed, skipped.
    assert r1[3]["nonfinite_at"] == "forward:blocks.0.mlp" and r0[3]["nonfinite_at"] == "unknown"
    assert "step_skipped_nonfinite" in r0[3]["events"] and "step_skipped_nonfinite" in r1[3]["events"]


@pytest.mark.slow  # 2 gloo ranks, FSDP2, 10 steps with 3 checkpoints: ~15 s alone
def test_fsdp2_rollback_in_place_restores_each_shard_and_replays_identically(tmp_path):
    mp.spawn(fsdp_rollback_worker.run, args=(2, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        lines = (tmp_path / f"trace.rank{rank}.jsonl").read_text().splitlines()
        everything = [json.loads(x) for x in lines]
        recs = [r for r in everything if "loss" in r]  # control messages (acks while parked) carry none
        steps = [r["step"] for r in recs]
        assert steps == [1, 2, 3, 4, 5, 6, 4, 5, 6, 7]
        first, again = recs[3:6], recs[6:9]
        assert [r["loss"] for r in again] == [r["loss"] for r in first]  # bit-identical replay on each rank
        shards = json.loads((tmp_path / f"shards.rank{rank}.json").read_text())
        assert shards["restored"] == shards["saved"]  # this rank's shard is the checkpoint's, not rank 0's
        events = [e for r in everything for e in r.get("events", [])]
        assert "rolled_back:6:3" in events and "checkpoint_saved:3" in events
    s0, s1 = (json.loads((tmp_path / f"shards.rank{r}.json").read_text()) for r in (0, 1))
    assert s0["saved"] != s1["saved"]  # really sharded: the ranks hold different halves


@pytest.mark.slow  # 2 gloo ranks, FSDP2, 53 steps and two replays: ~20 s alone
def test_fsdp2_replay_on_the_ranks_tells_a_reproducing_batch_from_an_ordinary_one(tmp_path):
    mp.spawn(fsdp_rollback_worker.run_replay, args=(2, str(tmp_path)), nprocs=2, join=True)
    root = tmp_path / "storage" / "fsdp" / "replays"
    junk, normal = (json.loads((root / f"{name}.json").read_text()) for name in ("junk", "normal"))
    assert junk["verdict"] == "data" and junk["on_ranks"] and junk["world_size"] == 2, junk
    assert normal["verdict"] == "transient_or_system", normal
    assert junk["checkpoint_step"] == normal["checkpoint_step"] == 50
    assert not set(junk["control_samples"]) & set(junk["suspect_samples"])
    for rank in (0, 1):
        out = json.loads((tmp_path / f"replay.rank{rank}.json").read_text())
        assert out["after"] == out["before"]  # the live shard came back after the replays
        recs = [json.loads(x) for x in (tmp_path / f"trace.rank{rank}.jsonl").read_text().splitlines()]
        events = {e for r in recs for e in r.get("events", [])}
        assert {"directive_applied:junk:replay", "directive_applied:normal:replay"} <= events
        assert max(r["step"] for r in recs if "loss" in r) == 53  # training went on after the replays

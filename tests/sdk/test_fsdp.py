"""FSDP2 (fully_shard, gloo on CPU): what the probe measures there, and that it does not deadlock."""

from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

from tests.sdk import ddp_worker


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

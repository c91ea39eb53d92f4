"""Two real DDP ranks (gloo): per-rank records, fingerprints, canaries, directives in lockstep."""

from __future__ import annotations

import json

import torch.multiprocessing as mp

from tests.sdk import ddp_worker


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_ranks(tmp_path):
    mp.spawn(ddp_worker.run, args=(2, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = read(tmp_path / "trace.rank0.jsonl"), read(tmp_path / "trace.rank1.jsonl")
    steps0, steps1 = [r["step"] for r in r0], [r["step"] for r in r1]
    # Stop delivered to rank 0 before step 9, proposed at the boundary after it, applied at the next.
    assert steps0 == steps1 == list(range(1, 11))  # stop applied at the same boundary on both ranks
    assert [r["rank"] for r in r1] == [1] * 10 and r0[0]["samples"] != r1[0]["samples"]
    by_step = {a["step"]: (a, b) for a, b in zip(r0, r1, strict=False)}
    # Healthy replicas agree bit-for-bit; the perturbation on rank 1 after step 5 shows from step 6.
    for step in (2, 4):
        a, b = by_step[step]
        assert a["param_checksum"] == b["param_checksum"]
        assert a["grad_norm"] == b["grad_norm"]  # grads are all-reduced
        assert a["attrs"]["canary_loss"] == b["attrs"]["canary_loss"]
    for step in (6, 8):
        a, b = by_step[step]
        assert a["param_checksum"] != b["param_checksum"]
        assert a["attrs"]["canary_loss"] != b["attrs"]["canary_loss"]
    for recs in (r0, r1):  # rank 0 alone received the directives; both applied them at the same step
        # delivered during step 5, proposed at the boundary after it, applied after step 6
        assert "directive_applied:ap:apply" in recs[5]["events"]
        assert "directive_applied:st:stop" in recs[9]["events"]
        assert recs[6]["lr"] == 0.5e-3 and recs[5]["lr"] == 1e-3

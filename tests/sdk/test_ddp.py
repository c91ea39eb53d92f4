"""Two real DDP ranks (gloo): per-rank records, fingerprints, canaries, directives in lockstep."""

from __future__ import annotations

import json

import torch.multiprocessing as mp

from tests.sdk import ddp_worker


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def applied(recs, event):
    return [r["step"] for r in recs if event in r.get("events", [])]


def test_two_ranks(tmp_path):
    mp.spawn(ddp_worker.run, args=(2, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = read(tmp_path / "trace.rank0.jsonl"), read(tmp_path / "trace.rank1.jsonl")
    steps0, steps1 = [r["step"] for r in r0], [r["step"] for r in r1]
    # A directive delivered to rank 0 during step n is proposed at the boundary after it and applied
    # at the next (apply: step 6, stop: step 10). On a loaded machine a promise that comes after its
    # rank passed the boundary aborts the proposal, and rank 0 proposes it again at a later boundary
    # (sdk/agreement.py): the boundary moves, the same on both ranks.
    (ap,), (st,) = applied(r0, "directive_applied:ap:apply"), applied(r0, "directive_applied:st:stop")
    assert applied(r1, "directive_applied:ap:apply") == [ap] and applied(r1, "directive_applied:st:stop") == [
        st
    ]
    assert 6 <= ap < st and 10 <= st < 20  # both acted, the stop before max_steps
    assert steps0 == steps1 == list(range(1, st + 1))  # stop applied at the same boundary on both ranks
    assert [r["rank"] for r in r1] == [1] * st and r0[0]["samples"] != r1[0]["samples"]
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
        assert recs[ap]["lr"] == 0.5e-3 and recs[ap - 1]["lr"] == 1e-3  # the step after it trains at half LR

"""The sampler's MoE model under DDP: an expert the router sends no token to must still take part
in the gradient all-reduce, or the ranks wait in different collectives (a hang at the first such
step, found by the sampler's clean cell 321829: moe, Lion, accumulation 3, fp16, 2 gloo ranks)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from bench.sampler.models import MoELM


def test_an_expert_without_tokens_still_gets_a_gradient():
    torch.manual_seed(0)
    net = MoELM(256, 32)
    starved = 3
    net.moe.router.register_forward_hook(
        lambda _m, _i, out: out.masked_fill(torch.arange(out.shape[-1]) == starved, -1e4)
    )
    x = torch.randint(0, 256, (4, 16))
    net(x).float().sum().backward()
    grads = {n: p.grad for n, p in net.moe.experts[starved].named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    assert all(float(g.abs().sum()) == 0.0 for g in grads.values() if g is not None)
    assert (
        net.moe.experts[0][0].weight.grad is not None
        and float(net.moe.experts[0][0].weight.grad.abs().sum()) > 0
    )


@pytest.mark.slow
def test_two_ranks_finish_when_one_rank_routes_no_token_to_an_expert(tmp_path):
    import torch.multiprocessing as mp

    from tests.bench import moe_ddp_worker as w

    ctx = mp.spawn(w.run, args=(2, str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 120  # a few seconds when it works; a hang never ends
    try:
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail("the two ranks hung: they waited in different collectives")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    for rank in (0, 1):
        done = json.loads((tmp_path / f"done.rank{rank}.json").read_text())
        assert done["max_diff"] == 0.0  # both replicas applied the same (all-reduced) gradients

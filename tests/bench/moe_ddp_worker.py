"""One rank of the two-rank MoE test (spawned by test_sampler_moe.py; DDP over gloo).

The loop of ``bench.sampler.job``: three micro-batches per step, the first two under
``no_sync``. At step 2 the router of rank 1 alone sends no token of the last micro-batch to
expert 3 (its logit pushed to -1e4), as a real batch can; rank 0 routes as usual.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from bench.sampler.models import MoELM
from tests.sdk.ddp_worker import _in_gloo_group

STEPS, PARTS, STARVED_STEP, STARVED_EXPERT = 3, 3, 2, 3


def run(rank: int, world_size: int, tmp: str) -> None:
    _in_gloo_group(_body, rank, world_size, tmp)


def _body(rank: int, tmp: str) -> None:
    torch.manual_seed(0)
    net = MoELM(256, 32)
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    starve = {"on": False}

    def router_out(_m: Any, _i: Any, out: torch.Tensor) -> torch.Tensor | None:
        if not starve["on"]:
            return None
        return out.masked_fill(torch.arange(out.shape[-1]) == STARVED_EXPERT, -1e4)

    net.moe.router.register_forward_hook(router_out)
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, STEPS + 1):
        for i in range(PARTS):
            starve["on"] = rank == 1 and step == STARVED_STEP and i == PARTS - 1
            x = torch.randint(0, 256, (4, 16), generator=gen)
            sync = ddp.no_sync() if i < PARTS - 1 else _Null()
            with sync:
                logits = ddp(x)
                loss = torch.nn.functional.cross_entropy(
                    logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1)
                )
                (loss / PARTS).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    with open(f"{tmp}/done.rank{rank}.json", "w") as fh:
        json.dump({"max_diff": float((gathered[0] - gathered[1]).abs().max())}, fh)


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None

"""One rank of the two-rank accumulation test (spawned by test_accumulation.py; DDP over gloo)."""

from __future__ import annotations

import json
from typing import Any

import torch

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from tests.sdk.ddp_worker import _in_gloo_group

SEQ, BATCH, MICRO, LR = 32, 8, 2, 0.1


def model() -> TinyLM:
    torch.manual_seed(0)
    return TinyLM(TinyLMConfig(seq_len=SEQ, d_model=32, n_layers=2, n_heads=2))


def batch_of(rank: int, world_size: int) -> dict[str, Any]:
    """This rank's first batch, with unequal tokens per sample and per rank (targets masked)."""
    dataset = build_dataset(seq_len=SEQ, max_bytes_per_source=40_000, seed=0)
    loader = sdk.SupervisedLoader(
        dataset, BATCH, seed=0, collate_fn=collate, rank=rank, world_size=world_size
    )
    batch = next(iter(loader))
    targets = batch["targets"].clone()
    for i in range(BATCH):
        targets[i, SEQ - (3 + 2 * rank) * i - 1 :] = -100
    batch["targets"] = targets
    return batch


def run(rank: int, world_size: int, tmp: str) -> None:
    _in_gloo_group(_body, rank, world_size, tmp)


def _body(rank: int, tmp: str) -> None:
    net = model()
    before = [p.detach().clone() for p in net.parameters()]
    ddp = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR)
    probe = sdk.init(ddp, opt, loss_fn=lm_loss, trace=f"{tmp}/trace.jsonl", fingerprint_every=0)
    batch = batch_of(rank, 2)
    with probe.step(batch, micro_batches=MICRO) as s:
        for mb in s.micro_batches():
            s.backward(lm_loss(ddp, mb))
        s.optimizer_step()
    probe.close()
    delta = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(net.parameters(), before, strict=True)])
    with open(f"{tmp}/delta.rank{rank}.json", "w") as fh:
        json.dump(delta.tolist(), fh)

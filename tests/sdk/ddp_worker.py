"""One rank of the two-rank DDP test (spawned by test_ddp.py; gloo on CPU)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk
from tests.sdk.conftest import poisoned


def _in_gloo_group(body: Callable[[int, str], None], rank: int, world_size: int, tmp: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=rank, world_size=world_size)
    try:
        body(rank, tmp)
        dist.barrier()  # no rank tears gloo down while its peer still has an operation in flight
    finally:
        # Models and probes hold the process group inside reference cycles: free them while the
        # interpreter is whole, not at exit, where gloo's threads can abort the process.
        gc.collect()
        dist.destroy_process_group()


def run(rank: int, world_size: int, tmp: str) -> None:
    _in_gloo_group(_ddp_body, rank, world_size, tmp)


def run_fsdp(rank: int, world_size: int, tmp: str) -> None:
    _in_gloo_group(_fsdp_body, rank, world_size, tmp)


def _supervised(model: torch.nn.Module, tmp: str, **settings: Any) -> tuple[Any, Any]:
    """AdamW, this rank's share of the text, and a probe writing the rank's trace under ``tmp``."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = sdk.SupervisedLoader(build_dataset(seq_len=32, max_bytes_per_source=20_000), 4, seed=0,
                                  collate_fn=collate)  # fmt: skip
    probe = sdk.init(model, opt, loader=loader, loss_fn=lm_loss, trace=f"{tmp}/trace.jsonl",
                     fingerprint_every=2, **settings)  # fmt: skip
    return loader, probe


def _ddp_body(rank: int, tmp: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=2))
    )
    loader, probe = _supervised(model, tmp, canary_every=2, max_steps=20)
    for batch in loader:
        if rank == 0 and probe.step_count == 4:
            probe.transport.deliver(sdk.ApplyOverrides(lr_scale=0.5, id="ap"))  # type: ignore[attr-defined]
        if rank == 0 and probe.step_count == 8:
            probe.transport.deliver(sdk.Stop(id="st"))  # type: ignore[attr-defined]
        if rank == 1 and probe.step_count == 5:
            with torch.no_grad():  # a silent one-rank fault: replicas now differ (every hidden unit,
                # so the canary's fixed batch sees it whatever its tokens activate)
                model.module.blocks[0].mlp.fc.weight.mul_(1.05)
        with probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
    probe.close()


def _fsdp_body(rank: int, tmp: str) -> None:
    """FSDP2 (fully_shard) on gloo: global norms, per-shard checksum, a one-rank NaN without deadlock."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=2))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    loader, probe = _supervised(model, tmp, max_steps=6, grad_clip=1.0)
    for batch in loader:
        with poisoned(model.blocks[0].mlp, rank == 1 and probe.step_count == 3), probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
    probe.close()
    full = torch.stack([p.full_tensor().norm() for p in model.parameters()]).norm().item()
    with open(f"{tmp}/exact_norm.rank{rank}", "w") as f:
        f.write(repr(full))

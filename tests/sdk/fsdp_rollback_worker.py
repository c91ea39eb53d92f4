"""One rank of test_fsdp.py's rollback test: FSDP2, asynchronous DCP checkpoints, a rollback in place."""

from __future__ import annotations

import hashlib
import json

import torch

from tests.sdk import ddp_worker


def run(rank: int, world_size: int, tmp: str) -> None:
    ddp_worker._in_gloo_group(_rollback_body, rank, world_size, tmp)


def _rollback_body(rank: int, tmp: str) -> None:
    """FSDP2 with asynchronous checkpoints every 3 steps; after step 6 rank 0 asks for a rollback to 3."""
    from torch.distributed.fsdp import fully_shard

    from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
    from supervisor import sdk
    from supervisor.checkpoint import CheckpointStore
    from supervisor.storage import LocalBackend

    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=2))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    store = CheckpointStore(LocalBackend(f"{tmp}/storage"), "fsdp")
    loader, probe = ddp_worker._supervised(model, tmp, checkpoint=store, checkpoint_every=3, max_steps=7)
    shards: dict[str, str] = {}
    for batch in loader:
        if probe.step_count == 3:  # the boundary before this batch saved step 3 (first pass) or restored it
            shards["saved" if "saved" not in shards else "restored"] = shard_checksum(model)
        if rank == 0 and probe.step_count == 5 and "asked" not in shards:
            shards["asked"] = ""
            probe.transport.deliver(sdk.RollbackInPlace(step=3, id="rb"))  # type: ignore[attr-defined]
        with probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
    probe.close()
    with open(f"{tmp}/shards.rank{rank}.json", "w") as f:
        json.dump(shards, f)


def shard_checksum(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.to_local().detach().contiguous().numpy().tobytes())
    return digest.hexdigest()

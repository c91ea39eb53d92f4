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
        if rank == 0 and probe.step_count == 4 and "asked" not in shards:  # applied after step 6
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


def run_replay(rank: int, world_size: int, tmp: str) -> None:
    ddp_worker._in_gloo_group(_replay_body, rank, world_size, tmp)


def _replay_body(rank: int, tmp: str) -> None:
    """FSDP2 trained 50 steps on text only (a junk source held out), checkpointed; then rank 0 asks
    for two replays from that checkpoint: the junk samples, and ordinary ones."""
    import random

    from torch.distributed.fsdp import fully_shard

    from examples.tinylm.data import build_dataset, collate
    from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
    from supervisor import sdk
    from supervisor.checkpoint import CheckpointStore
    from supervisor.sdk.directives import Exclusions, Replay
    from supervisor.storage import LocalBackend

    rng = random.Random(7)
    junk = "".join(chr(rng.randrange(0x400, 0x7FF)) for _ in range(2048))  # bytes the text never holds
    dataset = build_dataset(32, 20_000, 0, {"junk": {"junk.bin": junk}})
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=1, n_heads=2))
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2)
    loader = sdk.SupervisedLoader(dataset, 8, seed=0, collate_fn=collate)
    loader.exclude(Exclusions(sources=("junk",)))
    store = CheckpointStore(LocalBackend(f"{tmp}/storage"), "fsdp")
    probe = sdk.init(model, opt, loader=loader, loss_fn=lm_loss, trace=f"{tmp}/trace.jsonl", checkpoint=store,
                     checkpoint_every=50, max_steps=53)  # fmt: skip
    ids = [(loader.sample_id(i), loader.source(i)) for i in range(len(dataset))]
    junk_ids = tuple(s for s, src in ids if src == "junk")[:4]
    normal_ids = tuple(s for s, src in ids if src != "junk")[-4:]
    out: dict[str, str] = {}
    for batch in loader:
        if probe.step_count == 51 and "before" in out:
            out["after"] = shard_checksum(model)  # the boundary after step 51 ran both replays
        if rank == 0 and probe.step_count == 49 and "asked" not in out:  # applied after step 51
            out["asked"] = ""
            probe.transport.deliver(  # type: ignore[attr-defined]
                Replay(step=50, suspects=junk_ids, id="junk"),
                Replay(step=50, suspects=normal_ids, id="normal"),
            )
        with probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
        if probe.step_count == 51:
            out["before"] = shard_checksum(model)
    probe.close()
    with open(f"{tmp}/replay.rank{rank}.json", "w") as f:
        json.dump(out, f)

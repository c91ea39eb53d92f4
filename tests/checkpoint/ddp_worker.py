"""One rank of the 2-rank gloo test in test_ckpt_distributed.py (spawned; writes its results as JSON)."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from supervisor.checkpoint import CheckpointStore
from supervisor.checkpoint.training_state import load_training_state, save_training_state
from supervisor.errors import CheckpointError
from supervisor.storage import LocalBackend


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def run(rank: int, world_size: int, workdir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{workdir}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        out = _exercise(rank, world_size, workdir)
        (Path(workdir) / f"rank{rank}.json").write_text(json.dumps(out))
        dist.barrier()  # no rank tears gloo down while its peer still has an operation in flight
    finally:
        # The DDP modules hold the process group and sit in reference cycles; free them now, while
        # the interpreter is whole, rather than at exit, where gloo's threads can abort the process.
        gc.collect()
        dist.destroy_process_group()


def _exercise(rank: int, world_size: int, workdir: str) -> dict:
    out: dict = {"rank": rank}
    store = CheckpointStore(LocalBackend(Path(workdir) / "storage"), "ddp")
    model = torch.nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    torch.manual_seed(100 + rank)
    for _ in range(2):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    manifest = save_training_state(
        store,
        2,
        rank=rank,
        world_size=world_size,
        model=model,
        optimizer=opt,
        data_state={"cursor": 8 * (rank + 1)},
        extra={"global_batch_size": 8},
    )
    out["manifest_ranks"] = (
        sorted({f.rank for f in manifest.files if f.rank is not None}) if manifest else None
    )

    fresh = torch.nn.parallel.DistributedDataParallel(_model())
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    loaded = load_training_state(
        store,
        2,
        rank=rank,
        world_size=world_size,
        model=fresh,
        optimizer=fresh_opt,
        expect={"global_batch_size": 8},
    )
    out["report"] = loaded.report
    out["cursor"] = loaded.data_state["cursor"] if loaded.data_state else None
    out["params_equal"] = all(
        torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters(), strict=True)
    )

    # A rank whose storage fails: every rank must raise, none may hang, nothing is committed.
    broken = CheckpointStore(LocalBackend(Path(workdir) / "not-a-dir"), "ddp") if rank == 1 else store
    try:
        save_training_state(broken, 3, rank=rank, world_size=world_size, model=model, optimizer=opt)
        out["failure"] = None
    except CheckpointError as exc:
        out["failure"] = exc.one_line()
    out["steps"] = store.steps()
    return out


if __name__ == "__main__":
    run(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])

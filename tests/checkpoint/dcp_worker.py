"""One rank of the DCP tests in test_ckpt_dcp.py (a subprocess per rank; gloo on CPU; FSDP2).

    python dcp_worker.py MODE RANK WORLD WORKDIR [STEP]

save     train 4 steps; a synchronous save at step 2, an asynchronous one at step 4 while training
         goes on to step 6; writes each saved step's full parameters and the async blocked time
restore  FSDP2 on this world size: load STEP in place into a fresh model; writes the full parameters
die      synchronous save at step 1; at step 2 an asynchronous save in which rank 1 is SIGKILLed in
         its background write, after its DCP shard is on disk and before the commit
resume   a new generation: restore step 1, train to step 2, asynchronous save there, which commits
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples.tinylm.model import TinyLM, TinyLMConfig  # noqa: E402
from supervisor.checkpoint import CheckpointStore  # noqa: E402
from supervisor.checkpoint.saver import Checkpointer  # noqa: E402
from supervisor.checkpoint.training_state import load_training_state  # noqa: E402
from supervisor.storage import LocalBackend  # noqa: E402


class DyingBackend(LocalBackend):
    """Rank 1's storage in ``die``: the process is SIGKILLed when it writes step 2's small-state file."""

    def write_file(self, key: str, write: Any, digest: Any) -> Any:
        if "step_00000002/state.rank00001" in key:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().write_file(key, write, digest)


def build(world_size: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=16, d_model=32, n_layers=2, n_heads=2))
    if world_size > 1:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, step: int) -> None:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randint(0, 256, (2, 16), generator=gen)
    logits = model(x)
    torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1)
    ).backward()
    opt.step()
    opt.zero_grad()


def full_params(model: torch.nn.Module) -> dict[str, list[float]]:
    out = {}
    for name, value in model.state_dict().items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = tensor.detach().reshape(-1).tolist()
    return out


def main(mode: str, rank: int, world: int, workdir: Path, step: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{workdir}/pg-{mode}", rank=rank, world_size=world)
    try:
        out = globals()[f"_{mode}"](rank, world, workdir, step)
        if out is not None:
            (workdir / f"{mode}.rank{rank}.json").write_text(json.dumps(out))
        dist.barrier()
    finally:
        gc.collect()
        dist.destroy_process_group()


def _store(workdir: Path, backend: type[LocalBackend] = LocalBackend) -> CheckpointStore:
    return CheckpointStore(backend(workdir / "storage"), "fsdp")


def _save(rank: int, world: int, workdir: Path, _: int) -> dict[str, Any]:
    model, opt = build(world)
    saver = Checkpointer(_store(workdir), rank=rank, world_size=world)
    out: dict[str, Any] = {}
    for step in range(1, 7):
        train_step(model, opt, rank, step)
        if step in (2, 4):
            out[f"params{step}"] = full_params(model)
            handle = saver.save(step, model=model, optimizer=opt, data_state={"cursor": step * 10 + rank},
                                blocking=step == 2)  # fmt: skip
            out[f"blocked{step}"] = handle.blocked_s
    done = saver.close()
    out["async_committed"] = done is not None and (done.result() is not None) == (rank == 0)
    return out


def _restore(rank: int, world: int, workdir: Path, step: int) -> dict[str, Any]:
    model, opt = build(world)
    loaded = load_training_state(
        _store(workdir), step, rank=rank, world_size=world, model=model, optimizer=opt
    )
    return {"params": full_params(model), "cursor": (loaded.data_state or {}).get("cursor"),
            "report": loaded.report, "moments": len(opt.state)}  # fmt: skip


def _die(rank: int, world: int, workdir: Path, _: int) -> None:
    model, opt = build(world)
    saver = Checkpointer(
        _store(workdir, DyingBackend if rank == 1 else LocalBackend), rank=rank, world_size=world
    )
    train_step(model, opt, rank, 1)
    saver.save(1, model=model, optimizer=opt, blocking=True)
    train_step(model, opt, rank, 2)
    saver.save(2, model=model, optimizer=opt, blocking=False)
    (workdir / f"staged.rank{rank}").write_text("2")
    saver.wait()  # rank 1 dies in its background write; rank 0 waits in the commit until killed
    (workdir / f"unexpected.rank{rank}").write_text("the save of step 2 returned")


def _resume(rank: int, world: int, workdir: Path, _: int) -> dict[str, Any]:
    model, opt = build(world)
    store = _store(workdir)
    load_training_state(store, 1, rank=rank, world_size=world, model=model, optimizer=opt)
    saver = Checkpointer(store, rank=rank, world_size=world)
    train_step(model, opt, rank, 2)
    saver.save(2, model=model, optimizer=opt, blocking=False)
    handle = saver.close()
    assert handle is not None
    manifest = handle.result()
    return {"committed": manifest is not None and manifest.step == 2} if rank == 0 else {}


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]),
         int(sys.argv[5]) if len(sys.argv) > 5 else 0)  # fmt: skip

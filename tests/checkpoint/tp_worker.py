"""One rank of test_ckpt_tp.py: a tensor-parallel MLP (``parallelize_module``, ColwiseParallel /
RowwiseParallel on a 1-D CPU DeviceMesh, gloo) trained under the SDK with asynchronous DCP
checkpoints every 2 steps; after step 3 rank 0 asks for a rollback in place to step 2, which every
rank applies after step 5 (a directive acts one boundary after rank 0 received it).

Both ranks see the same batches (tensor parallelism splits the layers, not the data). The layer
norm stays a plain replicated tensor beside the DTensor weights, as in a TP model without
sequence parallelism: the checkpoint holds both kinds.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist

from tests.sdk import ddp_worker

DIM, HIDDEN = 16, 32


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(DIM)
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def full(values: dict[str, Any]) -> dict[str, list[float]]:
    """Every tensor whole (a DTensor's shards gathered), flattened to lists."""
    out = {}
    for name, value in values.items():
        tensor = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[name] = tensor.detach().reshape(-1).tolist()
    return out


def moments(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, list[float]]:
    """AdamW's first moment per parameter name, whole."""
    return full({name: opt.state[p]["exp_avg"] for name, p in model.named_parameters()})


def run(rank: int, world_size: int, tmp: str) -> None:
    ddp_worker._in_gloo_group(_body, rank, world_size, tmp)


def _body(rank: int, tmp: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from supervisor import sdk
    from supervisor.checkpoint import CheckpointStore
    from supervisor.sdk import StepLoss
    from supervisor.storage import LocalBackend

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    transport = sdk.MemoryTransport()
    store = CheckpointStore(LocalBackend(f"{tmp}/storage"), "tp")
    probe = sdk.init(model, opt, transport=transport, checkpoint=store, checkpoint_every=2, max_steps=6)
    out: dict[str, Any] = {}
    norms: list[float] = []
    while probe.proceed():
        if probe.step_count == 2:  # the boundary before this step saved step 2 (first pass) or restored it
            key = "saved" if "saved" not in out else "restored"
            out[key] = {"params": full(model.state_dict()), "moments": moments(model, opt)}
        if rank == 0 and probe.step_count == 3 and "asked" not in out:  # applied after step 5
            out["asked"] = True
            transport.deliver(sdk.RollbackInPlace(step=2, id="rb"))
        x = torch.randn(4, DIM, generator=torch.Generator().manual_seed(probe.step_count + 1))
        with probe.step({"x": x}) as s:
            err = model(x).square()
            s.backward(StepLoss(err.sum(), torch.tensor(err.numel())))
            grads = full({n: p.grad for n, p in model.named_parameters()})
            norms.append(sum(v * v for g in grads.values() for v in g) ** 0.5)  # whole grads, by hand
            s.optimizer_step()
    probe.close()
    out["records"] = [r for r in transport.records if not r.get("control")]
    out["grad_norms"] = norms
    out["events"] = [e for r in transport.records for e in r.get("events", [])]
    out["dtensors"] = sorted(n for n, p in model.named_parameters() if hasattr(p, "to_local"))
    with open(f"{tmp}/tp.rank{rank}.json", "w") as f:
        json.dump(out, f)

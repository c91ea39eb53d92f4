"""Train the tiny LM under the supervisor SDK: the job entrypoint ``examples.tinylm.train:main``.

A plain loop — AdamW, linear warmup then cosine decay, gradient clipping — with the SDK's
lines marked ``# sdk``. Run offline (no supervisor) with::

    python -m examples.tinylm.train --steps 200 --trace /tmp/tinylm.jsonl

and analyze the trace later (``supervisor analyze /tmp/tinylm.jsonl``).

``config`` keys (all optional): ``model`` (``TinyLMConfig`` fields), ``parallel`` (``ddp``, the
default, or ``fsdp2``: ``fully_shard`` per block), ``device`` (``cpu``, the default, or ``cuda``
with the job's ``gpus_per_worker: 1``), ``batch_size``, ``lr``,
``min_lr_ratio``, ``warmup_steps``, ``weight_decay``, ``betas``, ``grad_clip``, ``seed``,
``max_steps``, ``data`` (``max_bytes_per_source``, ``extra_texts``; ``streaming``, ``loader_workers``,
``prefetch_factor``, ``shards``, ``stream_dir``: see ``examples.tinylm.data.loader_source``), ``probe``
(``ProbeSettings`` fields), ``trace`` (offline trace path).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.distributed as dist

from examples.tinylm.data import build_dataset, loader_source
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from examples.tinylm.replay import replay_hooks  # the supervisor's `replay` action
from supervisor import sdk
from supervisor.drills.glue import attach, plan_dataset, plan_for_worker  # drills

DEFAULTS: dict[str, Any] = {
    "batch_size": 8,
    "lr": 3e-3,
    "min_lr_ratio": 0.1,
    "warmup_steps": 20,
    "weight_decay": 0.1,
    "betas": (0.9, 0.95),
    "grad_clip": 1.0,
    "seed": 0,
    "max_steps": 200,
}


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Any:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build(config: dict[str, Any], max_steps: int) -> tuple[torch.nn.Module, Any, Any, Any]:
    """Model (DDP-wrapped, or FSDP2-sharded, when distributed), AdamW, warmup+cosine scheduler, dataset."""
    cfg = {**DEFAULTS, **config}
    torch.manual_seed(cfg["seed"])
    mcfg = TinyLMConfig.from_dict(
        {**cfg, **(cfg.get("model") or {})}
    )  # `d_model: 128` or `model: {d_model: 128}`
    device = torch.device(cfg.get("device", "cpu"))
    model: torch.nn.Module = TinyLM(mcfg).to(device)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        if cfg.get("parallel", "ddp") == "fsdp2":  # sharded parameters, gradients and optimizer state
            from torch.distributed.fsdp import fully_shard

            for block in model.blocks:  # type: ignore[union-attr]
                fully_shard(block)
            fully_shard(model)
        else:
            model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index or 0] if device.type == "cuda" else None
            )
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg["weight_decay"]},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=cfg["lr"], betas=tuple(cfg["betas"]))
    factor = warmup_cosine(cfg["warmup_steps"], max_steps, cfg["min_lr_ratio"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    data = cfg.get("data") or {}
    dataset = build_dataset(
        mcfg.seq_len, data.get("max_bytes_per_source", 1_000_000), cfg["seed"], data.get("extra_texts")
    )
    return model, optimizer, scheduler, dataset


def main(config: dict[str, Any] | None = None, ctx: Any = None) -> dict[str, Any]:
    """Train; returns a summary (steps done, last loss). ``ctx`` comes from the supervisor runtime."""
    config = config or {}
    cfg = {**DEFAULTS, **config}
    max_steps = int(getattr(ctx, "max_steps", None) or cfg["max_steps"])
    model, optimizer, scheduler, dataset = build(config, max_steps)
    faults = plan_for_worker(ctx)  # drills: fault injection, a no-op unless job.yaml lists `faults:`
    dataset = plan_dataset(faults, dataset)  # drills: mixture_shift
    source, loader_options = loader_source(
        dataset, cfg.get("data") or {}, cfg["seed"]
    )  # a stream of it if data.streaming
    loader = sdk.SupervisedLoader(
        source,
        cfg["batch_size"],
        seed=cfg["seed"],
        rank=getattr(ctx, "rank", None),
        world_size=getattr(ctx, "world_size", None),
        **loader_options,  # collate_fn, num_workers (data.loader_workers), ...
    )  # sdk
    probe = sdk.init(
        model,
        optimizer,
        scheduler=scheduler,
        loader=loader,
        loss_fn=lm_loss,
        ctx=ctx,
        trace=cfg.get("trace"),
        grad_clip=cfg["grad_clip"],
        max_steps=max_steps,
        **cfg.get("probe", {}),
    )  # sdk
    attach(faults, probe)  # drills
    device = next(model.parameters()).device
    for batch in loader:
        batch = to_device(faults.begin_step(probe.step_count + 1, batch), device)  # drills
        with probe.step(batch) as s:  # sdk
            s.backward(lm_loss(model, batch))  # sdk: replaces loss.backward()
            with faults.optimizer_step(probe.step_count + 1, model, optimizer):  # drills
                s.optimizer_step()  # sdk: replaces clip + optimizer.step() + scheduler.step() + zero_grad()
    probe.close()  # sdk
    return {"steps": probe.step_count}


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch's tensors on the model's device (config ``device``: ``cpu``, the default, or ``cuda``)."""
    if device.type == "cpu":
        return batch
    return {k: v.pin_memory().to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()}  # fmt: skip


def _cli() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--trace", default="tinylm_trace.jsonl")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    out = main(
        {
            "max_steps": args.steps,
            "trace": args.trace,
            "model": {"d_model": args.d_model, "n_layers": args.layers},
        }
    )
    print(out)


__all__ = ["build", "main", "replay_hooks"]

if __name__ == "__main__":
    _cli()

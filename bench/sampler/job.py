"""The sampler's training job, written as a new user would from the README: ``bench.sampler.job:main``.

A plain loop with the SDK's lines marked ``# sdk`` and the drill hooks marked ``# drills``
(fault injection from ``job.faults``, a no-op otherwise): model ``family`` (bench.sampler.models),
``optimizer`` (adamw | sgd | lion), ``schedule`` (warmup_cosine | wsd | constant | inv_sqrt),
``accumulation`` micro-batches per optimizer step, ``precision`` (fp32 | bf16 autocast | fp16
autocast with a GradScaler), clip 1.0, DDP over the ranks the runtime starts.

Gradient accumulation is written in the loop (docs/sdk.md's ``s.report`` + ``s.optimizer_step``):
the loader yields the whole step's batch (``micro_batch * accumulation`` rows, so sample IDs,
sources and exclusions stay per step); the loop splits it, reports each micro-batch's loss
sums to the probe and backpropagates ``loss_sum / tokens of the whole step`` (exact
token weighting), under ``no_sync`` except for the last micro-batch.

Two bugs of the job's own code, for the sampler (as in bench/matrix/job.py): ``lr_bug``
(``{step, factor}``, the schedule is ``factor`` x too high from ``step`` on in every timeline)
and ``bad_source`` (``{source, step}``: that source serves random bytes from ``step`` on).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from bench.matrix.data import build as build_data
from bench.matrix.job import ReplayHooks, bad_source
from bench.sampler.models import build_model, token_loss
from bench.sampler.optim import make_optimizer, schedule
from examples.tinylm.data import TextDataset, collate
from supervisor import sdk
from supervisor.drills.glue import attach, plan_dataset, plan_for_worker, replay_view

DEFAULTS: dict[str, Any] = {
    "family": "llama",
    "optimizer": "adamw",
    "schedule": "warmup_cosine",
    "accumulation": 1,
    "precision": "fp32",
    "lr": None,  # per optimizer: bench.sampler.optim.LR
    "warmup_steps": 15,
    "grad_clip": 1.0,
    "micro_batch": 16,
    "seq_len": 32,
    "d_model": 32,
    "bytes_per_source": 60_000,
    "extra_source": "web",
    "seed": 0,
    "lr_bug": None,
    "bad_source": None,
}
VOCAB = 256
AMP = {"bf16": torch.bfloat16, "fp16": torch.float16}


def build(config: dict[str, Any], max_steps: int) -> tuple[torch.nn.Module, Any, Any, TextDataset]:
    cfg = {**DEFAULTS, **config}
    torch.manual_seed(int(cfg["seed"]))
    model: torch.nn.Module = build_model(cfg["family"], VOCAB, int(cfg["seq_len"]), int(cfg["d_model"]))
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer(cfg["optimizer"], model.parameters(), cfg["lr"])
    factor = schedule(cfg["schedule"], max_steps, int(cfg["warmup_steps"]), cfg.get("lr_bug"))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    dataset = build_data("stdlib", int(cfg["seq_len"]), int(cfg["bytes_per_source"]), int(cfg["seed"]),
                         cfg["extra_source"])  # fmt: skip
    return model, optimizer, scheduler, dataset


def micro_batches(batch: dict[str, Any], parts: int) -> list[dict[str, Any]]:
    """``batch`` cut into ``parts`` consecutive row slices (the last may be shorter)."""
    n = len(batch["input_ids"])
    size = -(-n // parts)
    return [
        {"input_ids": batch["input_ids"][i : i + size], "targets": batch["targets"][i : i + size]}
        for i in range(0, n, size)
    ]


def main(config: dict[str, Any] | None = None, ctx: Any = None) -> dict[str, Any]:
    cfg = {**DEFAULTS, **(config or {})}
    max_steps = int(getattr(ctx, "max_steps", None) or cfg.get("max_steps") or 150)
    accumulation = int(cfg["accumulation"])
    model, optimizer, scheduler, dataset = build(cfg, max_steps)
    amp = AMP.get(cfg["precision"])
    scaler = torch.amp.GradScaler("cpu") if cfg["precision"] == "fp16" else None
    faults = plan_for_worker(ctx, vocab_size=VOCAB)  # drills
    dataset = plan_dataset(faults, dataset)  # drills: mixture_shift
    loader = sdk.SupervisedLoader(
        dataset,
        int(cfg["micro_batch"]) * accumulation,  # one step's rows: split into micro-batches below
        seed=int(cfg["seed"]),
        collate_fn=collate,
        rank=getattr(ctx, "rank", None),
        world_size=getattr(ctx, "world_size", None),
    )  # sdk
    probe = sdk.init(
        model,
        optimizer,
        scheduler=scheduler,
        scaler=scaler,
        loader=loader,
        loss_fn=token_loss,
        ctx=ctx,
        grad_clip=cfg["grad_clip"],
        max_steps=max_steps,
    )  # sdk
    attach(faults, probe)  # drills
    ddp = model if isinstance(model, torch.nn.parallel.DistributedDataParallel) else None
    for batch in loader:
        batch = faults.begin_step(probe.step_count + 1, batch)  # drills
        batch = bad_source(cfg, probe.step_count + 1, batch)  # the job's data bug (sampler)
        with probe.step(batch) as s:  # sdk
            parts = micro_batches(batch, accumulation)
            tokens = (batch["targets"] != -100).sum().clamp_min(1)
            for i, mb in enumerate(parts):
                sync = ddp.no_sync() if ddp is not None and i < len(parts) - 1 else contextlib.nullcontext()
                with sync:
                    with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
                        out = token_loss(model, mb)
                    s.report(out)  # sdk: this micro-batch's loss sums go into the step's record
                    loss = out.loss_sum / tokens
                    (scaler.scale(loss) if scaler is not None else loss).backward()
            with faults.optimizer_step(probe.step_count + 1, model, optimizer):  # drills
                s.optimizer_step()  # sdk: unscale, clip, step, scaler.update, scheduler, zero_grad
    probe.close()  # sdk
    return {"steps": probe.step_count}


def replay_hooks(config: dict[str, Any], job: Any = None) -> Any:
    """Fresh model, optimizer and dataset built as a single-process run of this job (fp32), in the
    matrix's ``ReplayHooks`` (the same batch rebuilding, ``bad_source`` and token-weighted loss)."""
    model, optimizer, _scheduler, dataset = build(config, int(config.get("max_steps", 150)))
    hooks = ReplayHooks(model=model, optimizer=optimizer, dataset=dataset, config={**DEFAULTS, **config})
    return replay_view(hooks, job) if job is not None else hooks

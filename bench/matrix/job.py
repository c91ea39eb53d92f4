"""The matrix's training job, written as a user would from the README: ``bench.matrix.job:main``.

A plain loop (model family and optimizer from ``config``, linear warmup then cosine decay,
gradient clipping) with the SDK's lines marked ``# sdk`` and the drill hooks marked
``# drills`` (fault injection from ``job.faults``, a no-op otherwise).

``config``: ``family`` (gru | encoder | convnet), ``optimizer`` (adamw | sgd), ``lr``,
``warmup_steps``, ``min_lr_ratio``, ``grad_clip``, ``batch_size``, ``seq_len``, ``d_model``,
``data`` (stdlib | synthetic), ``bytes_per_source``, ``extra_source`` (a small fourth source),
``seed``, and two bugs in the job's own code, for the matrix: ``lr_bug`` (``{step, factor}``):
a schedule bug, so the LR is ``factor`` x too high from ``step`` on in every timeline, rollbacks
included (the persistent LR bug); ``bad_source`` (``{source, step}``): from ``step`` on, every
sample of that source reads as random bytes (its files overwritten with binary data), in every
timeline and in a replay, until the supervisor keeps the source out (the bad source).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bench.matrix.data import build as build_data
from bench.matrix.models import build_model, token_loss
from examples.tinylm.data import TextDataset, collate
from supervisor import sdk
from supervisor.drills.batchio import garbage_rows, stable_seed
from supervisor.drills.glue import attach, plan_for_worker, replay_view

DEFAULTS: dict[str, Any] = {
    "family": "gru",
    "optimizer": "adamw",
    "lr": None,  # per optimizer below
    "warmup_steps": 20,
    "min_lr_ratio": 0.1,
    "grad_clip": 1.0,
    "batch_size": 8,
    "seq_len": 64,
    "d_model": 64,
    "data": "stdlib",
    "bytes_per_source": 150_000,
    "extra_source": None,
    "seed": 0,
    "lr_bug": None,
    "bad_source": None,
}
LR = {"adamw": 3e-3, "sgd": 0.3}
VOCAB = 256


def schedule(cfg: dict[str, Any], total: int) -> Any:
    warmup, floor = int(cfg["warmup_steps"]), float(cfg["min_lr_ratio"])
    bug = cfg.get("lr_bug") or {}

    def factor(step: int) -> float:
        if step < warmup:
            f = (step + 1) / warmup
        else:
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            f = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        # LambdaLR counts scheduler steps from 0; optimizer step k uses factor(k - 1).
        if bug and step + 1 >= int(bug["step"]):
            f *= float(bug["factor"])
        return f

    return factor


def build(config: dict[str, Any], max_steps: int) -> tuple[torch.nn.Module, Any, Any, TextDataset]:
    cfg = {**DEFAULTS, **config}
    torch.manual_seed(cfg["seed"])
    model: torch.nn.Module = build_model(cfg["family"], VOCAB, cfg["seq_len"], cfg["d_model"])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    lr = float(cfg["lr"] or LR[cfg["optimizer"]])
    if cfg["optimizer"] == "adamw":
        optimizer: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    elif cfg["optimizer"] == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        raise ValueError(f"config.optimizer: {cfg['optimizer']!r} (valid: adamw, sgd)")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(cfg, max_steps))
    dataset = build_data(
        cfg["data"], cfg["seq_len"], cfg["bytes_per_source"], cfg["seed"], cfg["extra_source"]
    )
    return model, optimizer, scheduler, dataset


def main(config: dict[str, Any] | None = None, ctx: Any = None) -> dict[str, Any]:
    cfg = {**DEFAULTS, **(config or {})}
    max_steps = int(getattr(ctx, "max_steps", None) or cfg.get("max_steps") or 200)
    model, optimizer, scheduler, dataset = build(cfg, max_steps)
    faults = plan_for_worker(ctx, vocab_size=VOCAB)  # drills
    loader = sdk.SupervisedLoader(
        dataset,
        cfg["batch_size"],
        seed=cfg["seed"],
        collate_fn=collate,
        rank=getattr(ctx, "rank", None),
        world_size=getattr(ctx, "world_size", None),
    )  # sdk
    probe = sdk.init(
        model,
        optimizer,
        scheduler=scheduler,
        loader=loader,
        loss_fn=token_loss,
        ctx=ctx,
        grad_clip=cfg["grad_clip"],
        max_steps=max_steps,
    )  # sdk
    attach(faults, probe)  # drills
    for batch in loader:
        batch = faults.begin_step(probe.step_count + 1, batch)  # drills
        batch = bad_source(cfg, probe.step_count + 1, batch)  # the job's data bug (matrix)
        with probe.step(batch) as s:  # sdk
            s.backward(token_loss(model, batch))  # sdk
            with faults.optimizer_step(probe.step_count + 1, model, optimizer):  # drills
                s.optimizer_step()  # sdk
    probe.close()  # sdk
    return {"steps": probe.step_count}


def bad_source(cfg: dict[str, Any], step: int | None, batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with the rows of ``cfg["bad_source"]["source"]`` turned to random bytes from its
    ``step`` on (``step=None``: the source is bad now). Seeded by sample ID: the same sample is the
    same garbage wherever it is read again."""
    bug = cfg.get("bad_source")
    if not bug or (step is not None and step < int(bug["step"])):
        return batch
    rows = [r for r, src in enumerate(batch.get("sources") or []) if src == bug["source"]]
    ids = batch.get("sample_ids") or [f"{step}:{r}" for r in range(len(batch["input_ids"]))]
    return garbage_rows(batch, rows, VOCAB, [stable_seed("bad_source", ids[r]) for r in rows])


@dataclass
class ReplayHooks:
    """What the supervisor's `replay` action needs to rebuild this job in one process."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    dataset: TextDataset
    config: dict[str, Any]

    def __post_init__(self) -> None:
        self._index = {self.dataset.sample_id(i): i for i in range(len(self.dataset))}

    def batch(self, sample_ids: list[str]) -> dict[str, Any]:
        missing = [s for s in sample_ids if s not in self._index]
        if missing or not sample_ids:
            raise KeyError(f"samples not in the dataset: {missing[:3] or 'none given'}")
        batch = collate([self.dataset[self._index[s]] for s in sample_ids])
        sources = [self.dataset.source(self._index[s]) for s in sample_ids]
        return bad_source(self.config, None, {**batch, "sample_ids": list(sample_ids), "sources": sources})

    def control_batch(self, n: int, exclude: set[str]) -> tuple[dict[str, Any], list[str]]:
        stride = max(1, len(self.dataset) // (4 * max(n, 1)))
        ids = [self.dataset.sample_id(i) for i in range(0, len(self.dataset), stride)]
        chosen = [sid for sid in ids if sid not in exclude][:n]
        return self.batch(chosen), chosen

    @staticmethod
    def loss(model: torch.nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return token_loss(model, batch).loss


def replay_hooks(config: dict[str, Any], job: Any = None) -> Any:
    """Fresh model, optimizer and dataset built as a single-process run of this job."""
    model, optimizer, _scheduler, dataset = build(config, int(config.get("max_steps", 200)))
    hooks = ReplayHooks(model=model, optimizer=optimizer, dataset=dataset, config={**DEFAULTS, **config})
    return replay_view(hooks, job) if job is not None else hooks

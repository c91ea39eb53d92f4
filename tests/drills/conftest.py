"""A tiny causal LM and a training step that calls every fault hook, in the documented order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from supervisor.drills.faults import FaultPlan

VOCAB = 40
SEQ = 12


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, 16)
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        self.head = torch.nn.Linear(16, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        h = h + self.down(torch.relu(self.up(h)))
        return self.head(h)


def make_model(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM()


def make_batch(step: int, rows: int = 4) -> dict[str, Any]:
    """A learnable batch: each row counts upward mod VOCAB from a step-dependent start."""
    starts = torch.arange(rows) * 3 + step
    x = (starts[:, None] + torch.arange(SEQ + 1)[None, :]) % VOCAB
    return {
        "input_ids": x[:, :-1].clone(),
        "labels": x[:, 1:].clone(),
        "sample_ids": [f"s{step}-{r}" for r in range(rows)],
        "sources": ["code" if r % 2 == 0 else "docs" for r in range(rows)],
    }


@dataclass
class StepOut:
    loss: float
    record: dict[str, Any]


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, plan: FaultPlan, step: int, batch: Any,
               base_lr: float = 1e-2) -> StepOut:  # fmt: skip
    plan.maybe_crash(step)
    batch = plan.batch(step, batch)
    for g in opt.param_groups:
        g["lr"] = base_lr * plan.lr_scale(step)
    model.train()
    logits = model(batch["input_ids"])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1))
    opt.zero_grad()
    loss.backward()
    plan.before_optimizer_step(step, model, opt)
    opt.step()
    plan.after_optimizer_step(step, model, opt)
    tokens, value = batch["labels"].numel(), loss.item()
    record = {"step": step, "loss": value, "loss_sum": value * tokens, "tokens": tokens, "events": []}
    return StepOut(value, plan.record(step, record))


@pytest.fixture
def model() -> TinyLM:
    return make_model()

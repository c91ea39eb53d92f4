"""Shared pieces for SDK tests: a tiny real LM on a small slice of real text."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from examples.tinylm.data import TextDataset, build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig, lm_loss
from supervisor import sdk

SEQ = 32


@pytest.fixture(scope="session")
def dataset() -> TextDataset:
    return build_dataset(seq_len=SEQ, max_bytes_per_source=40_000, seed=0)


def make_run(
    dataset: Any, *, seed: int = 0, batch_size: int = 4, lr: float = 3e-3, **settings: Any
) -> tuple[Any, ...]:
    """(model, optimizer, scheduler, loader, probe, transport) with a MemoryTransport."""
    torch.manual_seed(seed)
    model = TinyLM(TinyLMConfig(seq_len=SEQ, d_model=32, n_layers=2, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    loader = sdk.SupervisedLoader(dataset, batch_size, seed=seed, collate_fn=collate, rank=0, world_size=1)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.init(
        model, opt, scheduler=sched, loader=loader, loss_fn=lm_loss, transport=transport, **settings
    )
    return model, opt, sched, loader, probe, transport


def train(model: Any, loader: Any, probe: Any, steps: int) -> list[float]:
    """Run ``steps`` steps of the supervised loop; returns the host losses seen by the probe."""
    losses = []
    for batch in loader:
        with probe.step(batch) as s:
            out = lm_loss(model, batch)
            s.backward(out)
            s.optimizer_step()
        losses.append(out.loss.item())
        if len(losses) >= steps:
            break
    return losses


@contextmanager
def poisoned(module: torch.nn.Module, when: bool) -> Iterator[None]:
    """Within the block, ``module``'s output is NaN when ``when`` holds (a non-finite step)."""
    hook = module.register_forward_hook(lambda m, i, out: out * math.nan) if when else None
    try:
        yield
    finally:
        if hook is not None:
            hook.remove()


def records(probe: Any, transport: Any) -> list[dict[str, Any]]:
    probe.flush()
    assert transport.flush(5.0)
    return [r for r in transport.records if not r.get("control")]

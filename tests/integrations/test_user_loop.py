"""sdk.watch: a loop that keeps its own clip, optimizer step and scheduler, reported with probe.record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from examples.tinylm.data import build_dataset, collate
from examples.tinylm.model import TinyLM, TinyLMConfig
from supervisor import sdk
from supervisor.checkpoint.store import CheckpointStore
from supervisor.sdk.directives import ApplyOverrides, RollbackInPlace
from supervisor.storage import open_backend

pytestmark = pytest.mark.slow  # real training steps: seconds each on a loaded 2-core machine


def setup(store: Any = None, **settings: Any) -> tuple[Any, ...]:
    torch.manual_seed(0)
    model = TinyLM(TinyLMConfig(seq_len=32, d_model=32, n_layers=1, n_heads=2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    probe = sdk.watch(model, opt, scheduler=sched, transport=transport, checkpoint=store, **settings)
    data = build_dataset(seq_len=32, max_bytes_per_source=20_000, seed=0)
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=collate, shuffle=False)
    return model, opt, sched, probe, transport, loader


def user_step(model: Any, opt: Any, sched: Any, probe: Any, batch: dict[str, Any]) -> None:
    """The user's own step, as a torchrun script writes it; the probe only reports it."""
    targets = batch["targets"]
    loss = F.cross_entropy(model(batch["input_ids"]).flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    sched.step()
    opt.zero_grad()
    probe.record(loss, grad_norm=norm, tokens=(targets != -100).sum())


def test_records_measure_the_users_step_and_overrides_never_reach_the_scheduler() -> None:
    model, opt, sched, probe, transport, loader = setup(max_steps=6)
    batches = iter(loader)
    transport.deliver(ApplyOverrides(lr_scale=0.25, id="a1"))
    while probe.proceed():
        user_step(model, opt, sched, probe, next(batches))
    probe.close()
    recs = [r for r in transport.records if "loss" in r]
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    # The step ran at 1/4 of the scheduled LR, and the scheduler's own value is untouched.
    assert abs(recs[2]["lr"] - 0.25 * 1e-2 / 3) < 1e-9
    assert abs(opt.param_groups[0]["lr"] - 1e-2 / 7) < 1e-12
    assert all(r["grad_norm"] > 0.5 for r in recs)  # the norm the user's clip measured, before clipping
    assert all(r["update_norm"] > 0 for r in recs[1:]) and all(r["tokens"] > 0 for r in recs)
    assert any(e.startswith("directive_applied:a1") for r in transport.records for e in r.get("events", []))


def test_rollback_in_place_restores_the_users_objects(tmp_path: Path) -> None:
    store = CheckpointStore(open_backend(str(tmp_path)), "job")
    model, opt, sched, probe, transport, loader = setup(store, checkpoint_every=3, max_steps=8)
    batches = iter(loader)
    saved: dict[str, torch.Tensor] = {}
    sent = checked = False
    while probe.proceed():
        if sent and not checked:  # the boundary that carried out the rollback
            assert probe.step_count == 3
            assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
            checked = True
        if probe.step_count == 3 and not saved:
            saved = {k: v.clone() for k, v in model.state_dict().items()}
        if probe.step_count == 5 and not sent:
            transport.deliver(RollbackInPlace(step=3, id="rb"))
            sent = True
        user_step(model, opt, sched, probe, next(batches))
    probe.close()
    steps = [r["step"] for r in transport.records if "loss" in r]
    assert checked and steps == [1, 2, 3, 4, 5, 6, 4, 5, 6, 7, 8]
    assert sched.last_epoch == 8  # the scheduler went back to step 3 and stepped 5 more times
    events = [e for r in transport.records for e in r.get("events", [])]
    assert "rolled_back:6:3" in events and any(e.startswith("checkpoint_saved") for e in events)

"""save_training_state / load_training_state with real torch objects: local and S3."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

from supervisor.checkpoint import CheckpointStore, verify
from supervisor.checkpoint.training_state import load_training_state, save_training_state
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError


def _setup(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    return model, opt, sched, scaler


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, sched: Any, steps: int) -> list[float]:
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16)  # draws from the torch RNG: restored RNG -> identical batches
        noise = random.random() + float(np.random.rand())
        loss = (model(x) ** 2).mean() + noise * 1e-3
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_restore_continues_bitwise_identically(store: CheckpointStore) -> None:
    model, opt, sched, scaler = _setup()
    _train(model, opt, sched, 3)
    manifest = save_training_state(
        store,
        3,
        rank=0,
        world_size=1,
        model=model,
        optimizer=opt,
        scheduler=sched,
        scaler=scaler,
        data_state={"cursor": 24, "exclusions": {"src:bad"}},
        extra={"global_batch_size": 8, "grad_accum_steps": 1},
        metrics={"loss": 0.5},
    )
    assert manifest is not None and manifest.metrics == {"loss": 0.5}
    assert set(manifest.components) == {
        "model",
        "optimizer",
        "scheduler",
        "scaler",
        "rng",
        "data_cursor",
        "exclusions",
    }
    expected = _train(model, opt, sched, 4)

    model2, opt2, sched2, scaler2 = _setup(seed=1)
    _train(model2, opt2, sched2, 1)  # live optimizer state exists: restore must copy into it
    ptrs = [p.data_ptr() for p in model2.parameters()]
    state_ptrs = [opt2.state[p]["exp_avg"].data_ptr() for p in model2.parameters()]
    loaded = load_training_state(
        store,
        3,
        rank=0,
        world_size=1,
        model=model2,
        optimizer=opt2,
        scheduler=sched2,
        scaler=scaler2,
        expect={"global_batch_size": 8, "grad_accum_steps": 1},
    )
    assert loaded.report == []
    assert loaded.data_state == {"cursor": 24, "exclusions": {"src:bad"}}
    assert loaded.extra["global_batch_size"] == 8
    assert [p.data_ptr() for p in model2.parameters()] == ptrs  # restored into the live tensors
    assert [opt2.state[p]["exp_avg"].data_ptr() for p in model2.parameters()] == state_ptrs
    assert scaler2.get_scale() == 1024.0 and sched2.last_epoch == 3
    assert _train(model2, opt2, sched2, 4) == expected


def test_report_names_geometry_changes_and_effective_lr(store: CheckpointStore) -> None:
    model, opt, sched, _ = _setup()
    _train(model, opt, sched, 2)
    save_training_state(
        store,
        2,
        rank=0,
        world_size=1,
        model=model,
        optimizer=opt,
        scheduler=sched,
        data_state={"cursor": 16},
        extra={"global_batch_size": 256, "grad_accum_steps": 4},
    )
    model2, opt2, _, _ = _setup()
    loaded = load_training_state(
        store,
        2,
        rank=0,
        world_size=1,
        model=model2,
        optimizer=opt2,
        expect={"global_batch_size": 128, "grad_accum_steps": 2},
    )
    report = "\n".join(loaded.report)
    assert "global_batch_size changed: checkpoint 256, now 128" in report
    assert "grad_accum_steps changed: checkpoint 4, now 2" in report
    assert "effective learning rate per sample x2" in report
    assert "scheduler state but no scheduler was given" in report


def test_report_flags_zeroed_optimizer_moments(store: CheckpointStore) -> None:
    model, opt, sched, _ = _setup()
    _train(model, opt, sched, 2)
    save_training_state(store, 2, rank=0, world_size=1, model=model, optimizer=opt, scheduler=sched)
    manifest = store.manifest(2)
    manifest.extra["rank_summaries"]["0"]["moments"]["exp_avg"] += (
        1  # the saver saw one more non-zero moment than exists
    )
    store.save_manifest(manifest)
    model2, opt2, sched2, _ = _setup()
    loaded = load_training_state(
        store, 2, rank=0, world_size=1, model=model2, optimizer=opt2, scheduler=sched2
    )
    assert any("optimizer moment 'exp_avg'" in e for e in loaded.report)


def test_quarantined_checkpoint_refuses_to_load(store: CheckpointStore) -> None:
    model, opt, sched, _ = _setup()
    save_training_state(store, 1, rank=0, world_size=1, model=model, optimizer=opt)
    store.mark(1, HealthMark.QUARANTINED, "bad shard")
    with pytest.raises(CheckpointError, match="quarantined: bad shard"):
        load_training_state(store, 1, rank=0, world_size=1, model=model, optimizer=opt)


def test_deep_verification_catches_an_unloadable_file_with_matching_checksum(store: CheckpointStore) -> None:
    model, opt, _, _ = _setup()
    save_training_state(store, 1, rank=0, world_size=1, model=model, optimizer=opt)
    manifest = store.manifest(1)
    entry = next(f for f in manifest.files if "model" in f.components)
    replacement = store.write_file(
        1, "model", lambda f: f.write(b"not a torch file" * 64), components=["model"]
    )
    store.save_manifest(
        manifest.model_copy(update={"files": [replacement if f is entry else f for f in manifest.files]})
    )
    assert verify(store, 1, record=False).ok  # bytes intact...
    deep = verify(store, 1, deep=True)
    assert not deep.ok and "not loadable" in deep.problems[0]  # ...but not a checkpoint

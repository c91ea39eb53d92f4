"""The HF and Lightning callbacks in one process (no Ray): records, overrides and in-place rollback."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

from supervisor import sdk
from supervisor.checkpoint.store import CheckpointStore
from supervisor.sdk.directives import ApplyOverrides, RollbackInPlace
from supervisor.storage import open_backend

STEPS = 8

pytestmark = pytest.mark.slow


class Director:
    """Delivers a lr_scale override after step 2 and a rollback to step 3 after step 5, once each."""

    def __init__(self, transport: Any) -> None:
        self.transport, self.sent = transport, set()

    def send(self, batch: list[dict[str, Any]]) -> None:
        for rec in batch:
            step = rec.get("step")
            if step == 2 and "apply" not in self.sent:
                self.sent.add("apply")
                self.transport.deliver(ApplyOverrides(lr_scale=0.5, id="a1"))
            if step == 5 and "rollback" not in self.sent:
                self.sent.add("rollback")
                self.transport.deliver(RollbackInPlace(step=3, id="rb"))
        self.transport.send(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def check(records: list[dict[str, Any]]) -> None:
    recs = [r for r in records if "loss" in r]
    steps = [r["step"] for r in recs]
    assert steps[:5] == [1, 2, 3, 4, 5] and steps[-1] == STEPS and steps.count(4) == 2, steps
    assert all(r["tokens"] > 0 and r["grad_norm"] > 0 and r["loss"] > 0 for r in recs)
    events = [e for r in records for e in r.get("events", [])]
    assert any(e.startswith("rolled_back:") and e.endswith(":3") for e in events), events
    by_step = {r["step"]: r for r in recs[:5]}
    assert by_step[4]["lr"] < by_step[2]["lr"]  # the override halves the LR the step used


def test_hf_trainer_callback(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from examples.hf_trainer.train import ByteLM
    from supervisor.integrations.hf import SupervisorCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))  # fmt: skip
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=4,
                             learning_rate=1e-3, max_grad_norm=0.1, save_strategy="no", report_to=[],
                             use_cpu=True, logging_steps=100, disable_tqdm=True)  # fmt: skip
    transport = Director(sdk.MemoryTransport(flush_interval_s=0.01))
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    cb = SupervisorCallback(transport=transport, checkpoint=store, checkpoint_every=3, max_steps=STEPS)
    trainer = Trainer(model=model, args=args, train_dataset=ByteLM(32, 20_000, 0), callbacks=[cb])
    trainer.train()
    assert trainer.state.global_step == STEPS  # followed the rollback back to step 3, then on to the end
    assert args.max_grad_norm == 0.0 and cb.fp is not None and cb.fp.probe.settings.grad_clip == 0.1
    recs = [r for r in transport.records if "loss" in r]
    assert recs[0]["tokens"] == 4 * 31  # token-weighted: labels shifted by the model
    assert any(r["grad_norm"] > 0.1 for r in recs)  # the norm before the (taken-over) clip
    check(transport.records)


def test_lightning_callback(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    from examples.lightning.train import LitLM
    from examples.tinylm.data import build_dataset, collate
    from supervisor.integrations.lightning import SupervisorCallback

    pl.seed_everything(0, verbose=False)
    args = argparse.Namespace(d_model=32, layers=1, seq_len=32, lr=1e-3, warmup=2, steps=STEPS)
    loader = torch.utils.data.DataLoader(build_dataset(32, 20_000, 0), batch_size=4, collate_fn=collate)
    transport = Director(sdk.MemoryTransport(flush_interval_s=0.01))
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    cb = SupervisorCallback(transport=transport, checkpoint=store, checkpoint_every=3, max_steps=STEPS)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])  # fmt: skip
    trainer.fit(LitLM(args), loader)
    assert trainer.global_step == STEPS
    check(transport.records)


# -- framework checkpoints: adopted once written, and the resume path of a restarted run ----------------
def ctx_for(store: CheckpointStore, resume: int | None) -> Any:
    """What a restarted rank's process gets from the supervisor: its store and the resume step."""
    from types import SimpleNamespace

    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    return SimpleNamespace(rank=0, world_size=1, transport=transport, checkpoint_store=store, resume_step=resume,
                           job=None)  # fmt: skip


def losses(ctx: Any) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in ctx.transport.records if "loss" in r}


def events(ctx: Any) -> list[str]:
    return [e for r in ctx.transport.records for e in r.get("events", [])]


def test_hf_checkpoints_adopted_and_restart_resumes_through_trainer(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from examples.hf_trainer.train import ByteLM
    from supervisor.checkpoint.verify import verify
    from supervisor.errors import ConfigError
    from supervisor.integrations.hf import SupervisorCallback, resume_checkpoint

    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")

    def run(ctx: Any, seed: int, resume: str | None = None) -> Trainer:
        torch.manual_seed(seed)  # a restarted process builds a fresh model: the checkpoint must overwrite it
        model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                                           bos_token_id=0, eos_token_id=0))  # fmt: skip
        args = TrainingArguments(output_dir=str(tmp_path / "store" / "job" / "hf"), max_steps=6,
                                 per_device_train_batch_size=4, learning_rate=1e-3, save_strategy="steps",
                                 save_steps=3, report_to=[], use_cpu=True, logging_steps=100, disable_tqdm=True,
                                 seed=0)  # fmt: skip
        cb = SupervisorCallback(ctx=ctx, checkpoint_every=2, max_steps=6)
        trainer = Trainer(model=model, args=args, train_dataset=ByteLM(32, 20_000, 0), callbacks=[cb])
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    first = ctx_for(store, None)
    run(first, seed=0)
    # Trainer checkpoints are the job's: adopted at 3 and 6, and no SDK save at 2 or 4 (every 2 is off).
    assert store.steps() == [3, 6], store.steps()
    manifest = store.manifest(3)
    assert manifest.source == "job/hf/checkpoint-3" and manifest.extra["framework"] == "transformers"
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json"} <= {
        f.name for f in manifest.files
    }
    # Deep, as before a rollback: the RNG and TrainingArguments pickles are the Trainer's to load.
    assert verify(store, 3, deep=True).ok and "checkpoint_saved:3" in events(first)

    restarted = ctx_for(store, 3)
    path = resume_checkpoint(restarted)
    assert path == str(tmp_path / "store" / "job" / "hf" / "checkpoint-3")
    run(restarted, seed=1, resume=path)
    again, before = losses(restarted), losses(first)
    assert sorted(again) == [4, 5, 6] and "resumed" in events(restarted)
    for step in again:  # the Trainer's resume path: weights, optimizer, scheduler, RNG and data position
        assert again[step] == pytest.approx(before[step], rel=1e-4), (step, again, before)

    with pytest.raises(ConfigError, match="resume_from_checkpoint=resume_checkpoint"):
        run(ctx_for(store, 3), seed=1)  # the script did not hand the checkpoint to the Trainer


def test_lightning_checkpoints_adopted_and_restart_resumes_through_fit(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from examples.lightning.train import LitLM
    from examples.tinylm.data import build_dataset, collate
    from supervisor.checkpoint.verify import verify
    from supervisor.integrations.lightning import SupervisorCallback, resume_checkpoint

    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    outside = tmp_path / "ckpt"  # not under the storage path: adopted as an uploaded copy

    def run(ctx: Any, seed: int, resume: str | None = None) -> None:
        pl.seed_everything(seed, verbose=False)
        args = argparse.Namespace(d_model=32, layers=1, seq_len=32, lr=1e-3, warmup=2, steps=6)
        loader = torch.utils.data.DataLoader(build_dataset(32, 20_000, 0), batch_size=4, collate_fn=collate)
        saves = ModelCheckpoint(dirpath=outside, every_n_train_steps=3, save_top_k=-1)
        trainer = pl.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[SupervisorCallback(ctx=ctx, max_steps=6), saves])  # fmt: skip
        trainer.fit(LitLM(args), loader, ckpt_path=resume)
        assert trainer.global_step == 6

    first = ctx_for(store, None)
    run(first, seed=0)
    assert store.steps() == [3, 6], store.steps()
    manifest = store.manifest(3)
    assert manifest.source == "job/framework" and manifest.extra["kind"] == "file"
    assert [f.name for f in manifest.files] == ["epoch=0-step=3.ckpt"] and "checkpoint_saved:3" in events(
        first
    )

    assert verify(store, 3, deep=True).ok
    restarted = ctx_for(store, 3)
    path = resume_checkpoint(restarted)
    assert path == str(tmp_path / "store" / "job" / "framework" / "epoch=0-step=3.ckpt")
    run(restarted, seed=1, resume=path)
    again, before = losses(restarted), losses(first)
    assert sorted(again) == [4, 5, 6] and "resumed" in events(restarted)
    # Lightning restarts a plain DataLoader's epoch, so step 4 sees batch 0 again: the restored
    # weights score it well below the fresh model's step 1, and the scheduler continues at step 4.
    assert again[4] < before[1] - 0.05, (again, before)
    lrs = [{r["step"]: r["lr"] for r in c.transport.records if "loss" in r} for c in (first, restarted)]
    assert lrs[1][4] == pytest.approx(lrs[0][4]), lrs

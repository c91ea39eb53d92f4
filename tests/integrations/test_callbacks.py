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

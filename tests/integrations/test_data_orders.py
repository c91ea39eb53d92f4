"""Exclusions and skips in loops a framework owns (one process, no Ray): the HF ``SupervisedTrainer``
and Lightning with the sized ``SupervisedLoader`` name each step's samples, skip batches in place,
and a run restarted through the framework's resume path gets its data position back from the
checkpoint and the re-delivered fixes before its first step (the excluded samples never come back).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from supervisor import sdk
from supervisor.checkpoint.store import CheckpointStore
from supervisor.sdk.directives import ApplyOverrides, Continue, Exclusions, Freeze
from supervisor.storage import open_backend

pytestmark = pytest.mark.slow

STEPS = 6


def ctx_for(store: CheckpointStore, resume: int | None, *directives: Any) -> Any:
    """What a (restarted) rank's process gets: its store, the resume step, the directives waiting for it."""
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    for d in directives:
        transport.deliver(d)
    return SimpleNamespace(rank=0, world_size=1, transport=transport, checkpoint_store=store, resume_step=resume,
                           job=None)  # fmt: skip


class SkipOnce:
    """Wraps a transport: when step 1's record goes out (it is sent as step 2 is reported), delivers
    ``skip_batches=1``; the boundary after step 2 carries it out in place."""

    def __init__(self, transport: Any) -> None:
        self.transport, self.sent = transport, False

    def send(self, batch: list[dict[str, Any]]) -> None:
        if not self.sent and any(r.get("step") == 1 and "loss" in r for r in batch):
            self.sent = True
            self.transport.deliver(ApplyOverrides(skip_batches=1, id="skip"))
        self.transport.send(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def steps_of(ctx: Any) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in ctx.transport.records if "loss" in r}


def restart_directives(excluded: list[str]) -> list[Any]:
    """What the runtime re-delivers to a group restarted by a rollback: the freeze, the fix, the release."""
    fix = ApplyOverrides(lr_scale=0.5, exclusions=Exclusions(samples=tuple(excluded)), id="fix")
    return [Freeze(reason="incident", id="frz"), fix, Continue(id="go")]


def check_orders(first: Any, again: Any) -> None:
    before, after = steps_of(first), steps_of(again)
    # In place: the skip at the boundary after step 2 dropped one global batch, so step 3 trained batch 3.
    assert [before[s]["attrs"]["batch"] for s in (1, 2, 3, 4)] == [0, 1, 3, 4], before
    assert all(len(before[s]["samples"]) == 4 for s in before)
    # Restarted from step 3: the checkpoint's cursor resumes the data exactly (step 4 = batch 4) ...
    assert sorted(after) == [4, 5, 6] and after[4]["samples"] == before[4]["samples"], (before, after)
    # ... the fix was applied before the first step trained (acknowledged at step 3, LR halved at 4) ...
    acks = [(r["step"], e) for r in again.transport.records for e in r.get("events", []) if "directive_" in e]
    assert (3, "directive_applied:frz:freeze") in acks and (3, "directive_applied:fix:apply") in acks, acks
    assert after[4]["lr"] == pytest.approx(0.5 * before[4]["lr"])
    # ... and the excluded samples (step 5's in the first run) never came back.
    excluded = set(before[5]["samples"][:2])
    seen = {s for r in after.values() for s in r["samples"]}
    assert not excluded & seen and after[5]["samples"] != before[5]["samples"], (excluded, after)
    assert len(after[5]["samples"]) == 4  # the batch is filled up from the following samples


def test_hf_supervised_trainer_exclusions_and_skips(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

    from examples.hf_trainer.train import ByteLM
    from supervisor.integrations.hf import SupervisedTrainer, SupervisorCallback, resume_checkpoint

    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")

    def run(ctx: Any, resume: str | None = None) -> None:
        torch.manual_seed(0)
        model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                                           bos_token_id=0, eos_token_id=0))  # fmt: skip
        args = TrainingArguments(output_dir=str(tmp_path / "store" / "job" / "hf"), max_steps=STEPS,
                                 per_device_train_batch_size=4, learning_rate=1e-3, save_strategy="steps",
                                 save_steps=3, report_to=[], use_cpu=True, logging_steps=100, disable_tqdm=True,
                                 seed=0)  # fmt: skip
        trainer = SupervisedTrainer(model=model, args=args, train_dataset=ByteLM(32, 20_000, 0),
                                    callbacks=[SupervisorCallback(ctx=ctx, max_steps=STEPS)])  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        assert trainer.state.global_step == STEPS

    first = ctx_for(store, None)
    first.transport = SkipOnce(first.transport)
    run(first)
    manifest = store.manifest(3)  # the loader's cursor and exclusions are part of the adopted checkpoint
    assert "supervisor_data.rank0.pt" in {f.name for f in manifest.files}
    assert {"data_cursor", "exclusions"} <= set(manifest.components)
    excluded = steps_of(first)[5]["samples"][:2]
    again = ctx_for(store, 3, *restart_directives(excluded))
    run(again, resume=resume_checkpoint(again))
    check_orders(first, again)


def test_lightning_supervised_loader_exclusions_and_skips(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    from examples.lightning.train import LitLM
    from examples.tinylm.data import build_dataset, collate
    from supervisor.errors import ConfigError
    from supervisor.integrations.lightning import SupervisedLoader, SupervisorCallback, resume_checkpoint

    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")

    def run(ctx: Any, loader: Any, resume: str | None = None) -> None:
        pl.seed_everything(0, verbose=False)
        args = argparse.Namespace(d_model=16, layers=1, seq_len=32, lr=1e-3, warmup=2, steps=STEPS)
        saves = ModelCheckpoint(
            dirpath=tmp_path / "store" / "job" / "ckpt", every_n_train_steps=3, save_top_k=-1
        )
        trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[SupervisorCallback(ctx=ctx, max_steps=STEPS), saves])  # fmt: skip
        trainer.fit(LitLM(args), loader, ckpt_path=resume)
        assert trainer.global_step == STEPS

    data = build_dataset(32, 20_000, 0)
    first = ctx_for(store, None)
    first.transport = SkipOnce(first.transport)
    run(first, SupervisedLoader(data, 4, collate_fn=collate))
    assert {"data_cursor", "exclusions"} <= set(store.manifest(3).components)
    excluded = steps_of(first)[5]["samples"][:2]
    again = ctx_for(store, 3, *restart_directives(excluded))
    run(again, SupervisedLoader(data, 4, collate_fn=collate), resume=resume_checkpoint(again))
    check_orders(first, again)

    # The SDK's loader has no length: Lightning would draw a batch ahead of the directives. Refused at start.
    with pytest.raises(ConfigError, match="integrations.lightning.SupervisedLoader"):
        run(ctx_for(store, None), sdk.SupervisedLoader(data, 4, collate_fn=collate))

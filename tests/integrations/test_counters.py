"""The counters a framework user reads next to the supervisor's records: checked against the data.

- Lightning's loggers: after an in-place rollback the step they are given moves back with the
  kept timeline (docs/integrations.md), so the logger's last step is the run's last step, not
  that plus the re-trained steps.
- The Hugging Face ``epoch`` (logs, ``trainer_state.json``): passes over the dataset, computed
  from the samples the supervised loader handed out, not ``step / max_steps``.
One process, no Ray.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import torch

from supervisor import sdk
from supervisor.checkpoint.store import CheckpointStore
from supervisor.storage import open_backend
from tests.integrations.test_callbacks import STEPS, Director


def test_lightning_logger_steps_move_back_with_a_rollback(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import Logger

    from examples.lightning.train import LitLM
    from examples.tinylm.data import build_dataset, collate
    from supervisor.integrations.lightning import SupervisorCallback

    class Logged(LitLM):
        def training_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
            out = super().training_step(batch, batch_idx)
            self.log("train_loss", out["loss"])
            return out

    class Steps(Logger):
        """What a CSV / TensorBoard logger is handed: the step of each metrics row."""

        def __init__(self) -> None:
            super().__init__()
            self.steps: list[int] = []

        name, version = "steps", 0  # type: ignore[assignment]

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            if "train_loss" in metrics and step is not None:
                self.steps.append(step)

        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            pass

    pl.seed_everything(0, verbose=False)
    args = argparse.Namespace(d_model=16, layers=1, seq_len=16, lr=1e-3, warmup=2, steps=STEPS)
    loader = torch.utils.data.DataLoader(build_dataset(16, 3_000, 0), batch_size=4, collate_fn=collate)
    transport = Director(sdk.MemoryTransport(flush_interval_s=0.01))  # rollback 5 -> 3 after step 5
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    cb, logger = SupervisorCallback(transport=transport, checkpoint=store, checkpoint_every=3), Steps()
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, logger=logger, log_every_n_steps=1,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[cb])  # fmt: skip
    trainer.fit(Logged(args), loader)

    record_steps = [r["step"] for r in transport.records if "loss" in r and not r.get("control")]
    assert record_steps.count(4) == 2 and record_steps[-1] == STEPS  # the rollback happened
    # Lightning hands its loggers the 0-based index of each optimizer step; after the rollback the
    # index follows the kept timeline, row for row with the records.
    assert logger.steps == [s - 1 for s in record_steps], (logger.steps, record_steps)
    assert trainer.fit_loop.epoch_loop._batches_that_stepped == STEPS


def test_hf_epoch_counts_passes_over_the_data(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

    from examples.hf_trainer.train import ByteLM
    from supervisor.integrations.hf import SupervisedTrainer, SupervisorCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))  # fmt: skip
    dataset, batch, accumulate, steps = ByteLM(16, 1_000, 0), 8, 2, 12
    epochs: dict[int, float] = {}

    class Logs(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                epochs[state.global_step] = logs["epoch"]

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=batch,
                             gradient_accumulation_steps=accumulate, learning_rate=1e-3, save_strategy="no",
                             report_to=[], use_cpu=True, logging_steps=1, disable_tqdm=True)  # fmt: skip
    cb = SupervisorCallback(transport=sdk.MemoryTransport(flush_interval_s=0.01), max_steps=steps)
    trainer = SupervisedTrainer(model=model, args=args, train_dataset=dataset, callbacks=[Logs(), cb])
    trainer.train()

    per_step = batch * accumulate  # samples one optimizer step consumes (one rank)
    assert len(dataset) < steps * per_step  # the run passes into its second epoch
    assert sorted(epochs) == list(range(1, steps + 1))
    for step, epoch in epochs.items():
        assert epoch == pytest.approx(step * per_step / len(dataset), abs=1e-4), (step, epoch)
    assert trainer.state.epoch == pytest.approx(steps * per_step / len(dataset), abs=1e-4)

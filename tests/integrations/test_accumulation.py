"""Gradient accumulation under the framework adapters: every recorded loss and grad norm is the true one.

Each run trains a few optimizer steps of a tiny model built from a config (no download) with
the framework's own accumulation setting; the test keeps the parameters at the start of every
optimizer step and the micro-batches the framework fed, then computes the same step without
the SDK on a copy of the model: the token-weighted loss over all of the step's micro-batches,
and the norm of the gradient the framework applies (before clipping). Records must agree, for
accumulation 1, 2 and 4, in fp32 and under bf16 autocast. One process, no Ray.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from supervisor import sdk

STEPS = 3
CASES = [(1, "fp32"), (2, "fp32"), (4, "fp32"), (2, "bf16"), (4, "bf16")]


class Witness:
    """Keeps each optimizer step's starting parameters and the micro-batches its forwards saw."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.steps: list[tuple[dict[str, torch.Tensor], list[dict[str, Any]]]] = []
        self.autocast: set[bool] = set()
        self._new = True

    def forward(self, inputs: dict[str, Any]) -> None:
        if self._new:
            state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}
            self.steps.append((state, []))
            self._new = False
        self.steps[-1][1].append({k: v.detach().clone() for k, v in inputs.items() if torch.is_tensor(v)})

    def stepped(self, *_: Any) -> None:
        self._new = True

    def casts(self, *_: Any) -> None:
        """A forward pre-hook: whether the framework runs the forward under autocast."""
        self.autocast.add(torch.is_autocast_enabled("cpu"))


def autocast(precision: str) -> Any:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def close(got: float, want: float, precision: str) -> bool:
    return got == pytest.approx(want, rel=1e-5 if precision == "fp32" else 2e-3)


def recorded(transport: Any) -> list[dict[str, Any]]:
    return [r for r in transport.records if "loss" in r and not r.get("control")]


# -- Hugging Face Trainer ---------------------------------------------------------------------------
def hf_reference(
    config: Any, state: dict[str, torch.Tensor], micro: list[dict[str, Any]], precision: str
) -> tuple[float, float]:
    """The step without the SDK: token-weighted loss of all micro-batches, and the gradient the Trainer
    applies: each micro-batch's token-loss sum over the ``num_items_in_batch`` it hands the model
    (transformers 5 counts unshifted labels for a GPT-2 config, so that gradient is the true mean's
    times shifted/unshifted tokens: the record must carry the applied one, the one that is clipped)."""
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(config)
    model.load_state_dict(state)
    model.train()
    total = sum(int((m["labels"][..., 1:] != -100).sum()) for m in micro)
    items = [float(m.get("num_items_in_batch", total)) for m in micro]
    loss_sum = 0.0
    for m, n in zip(micro, items, strict=True):
        with autocast(precision):
            logits = model(input_ids=m["input_ids"], attention_mask=m.get("attention_mask")).logits
        token_sum = F.cross_entropy(
            logits[:, :-1].float().flatten(0, 1),
            m["labels"][:, 1:].flatten(),
            ignore_index=-100,
            reduction="sum",
        )
        (token_sum / n).backward()
        loss_sum += float(token_sum)
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )
    return loss_sum / total, float(norm)


@pytest.mark.parametrize(("accumulate", "precision"), CASES)
def test_hf_trainer_records_the_true_loss_and_grad_norm(
    tmp_path: Path, accumulate: int, precision: str
) -> None:
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments

    from examples.hf_trainer.train import ByteLM
    from supervisor.integrations.common import inner_optimizer
    from supervisor.integrations.hf import SupervisedTrainer, SupervisorCallback

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    witness = Witness(model)
    model.register_forward_pre_hook(
        lambda m, a, kw: witness.forward(kw) if m.training else None, with_kwargs=True
    )
    model.transformer.register_forward_pre_hook(witness.casts)  # inside accelerate's autocast wrapper

    class Hooks(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            inner_optimizer(kw["optimizer"]).register_step_post_hook(witness.stepped)

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=2,
                             gradient_accumulation_steps=accumulate, learning_rate=1e-2, max_grad_norm=0.5,
                             save_strategy="no", report_to=[], use_cpu=True, bf16=precision == "bf16",
                             logging_steps=1, disable_tqdm=True, seed=0)  # fmt: skip
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    cb = SupervisorCallback(transport=transport, max_steps=STEPS)
    trainer = SupervisedTrainer(
        model=model, args=args, train_dataset=ByteLM(16, 3_000, 0), callbacks=[Hooks(), cb]
    )
    trainer.train()

    recs = recorded(transport)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert len(witness.steps) == STEPS and all(len(micro) == accumulate for _, micro in witness.steps)
    assert witness.autocast == {precision == "bf16"}
    for rec, (state, micro) in zip(recs, witness.steps, strict=True):
        loss, norm = hf_reference(config, state, micro, precision)
        assert rec["tokens"] == sum(int((m["labels"][..., 1:] != -100).sum()) for m in micro)
        assert close(rec["loss"], loss, precision), (rec["step"], rec["loss"], loss)
        assert close(rec["grad_norm"], norm, precision), (rec["step"], rec["grad_norm"], norm)
        assert len(rec["samples"]) == 2 * accumulate  # every micro-batch's samples name the step
    assert recs[0]["grad_norm"] > 0.5  # measured before the (taken-over) clip


# -- Lightning ----------------------------------------------------------------------------------------
def lightning_reference(module: Any, state: dict[str, torch.Tensor], micro: list[dict[str, Any]], precision: str,
                        accumulate: int) -> tuple[float, float]:  # fmt: skip
    """The step without the SDK: token-weighted loss; Lightning's gradient (each micro-batch's mean
    loss over ``accumulate_grad_batches``)."""
    model = copy.deepcopy(module.model)
    model.load_state_dict({k.removeprefix("model."): v for k, v in state.items()})
    model.train()
    loss_sum, tokens = 0.0, 0
    for m in micro:
        with autocast(precision):
            logits = model(m["input_ids"])
        targets = m["targets"]
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100)
        (loss / accumulate).backward()
        n = int((targets != -100).sum())
        loss_sum, tokens = loss_sum + float(loss.detach()) * n, tokens + n
    norm = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None])
    )
    return loss_sum / tokens, float(norm)


@pytest.mark.parametrize(("accumulate", "precision"), CASES)
def test_lightning_records_the_true_loss_and_grad_norm(
    tmp_path: Path, accumulate: int, precision: str
) -> None:
    pytest.importorskip("lightning")
    import lightning.pytorch as pl

    from examples.lightning.train import LitLM
    from examples.tinylm.data import build_dataset, collate
    from supervisor.integrations.common import inner_optimizer
    from supervisor.integrations.lightning import SupervisedLoader, SupervisorCallback

    pl.seed_everything(0, verbose=False)
    module = LitLM(argparse.Namespace(d_model=16, layers=1, seq_len=16, lr=1e-2, warmup=1, steps=STEPS))
    witness = Witness(module)
    module.model.register_forward_pre_hook(witness.casts)

    class Hooks(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            inner_optimizer(trainer.optimizers[0]).register_step_post_hook(witness.stepped)

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            witness.forward(batch)

    loader = SupervisedLoader(build_dataset(16, 3_000, 0), batch_size=2, seed=0, collate_fn=collate)
    transport = sdk.MemoryTransport(flush_interval_s=0.01)
    cb = SupervisorCallback(transport=transport, max_steps=STEPS)
    trainer = pl.Trainer(max_steps=STEPS, accelerator="cpu", devices=1, accumulate_grad_batches=accumulate,
                         precision="bf16-mixed" if precision == "bf16" else "32-true", gradient_clip_val=0.5,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Hooks(), cb])  # fmt: skip
    trainer.fit(module, loader)

    recs = recorded(transport)
    assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
    assert len(witness.steps) == STEPS and all(len(micro) == accumulate for _, micro in witness.steps)
    assert witness.autocast == {precision == "bf16"}
    for rec, (state, micro) in zip(recs, witness.steps, strict=True):
        loss, norm = lightning_reference(module, state, micro, precision, accumulate)
        assert rec["tokens"] == sum(int((m["targets"] != -100).sum()) for m in micro)
        assert close(rec["loss"], loss, precision), (rec["step"], rec["loss"], loss)
        assert close(rec["grad_norm"], norm, precision), (rec["step"], rec["grad_norm"], norm)
        assert len(rec["samples"]) == 2 * accumulate
    assert recs[0]["grad_norm"] > 0.5  # measured before Lightning's gradient_clip_val

"""Hugging Face ``Trainer`` under the supervisor: one callback (``pip install spike-supervisor[hf]``).

    from supervisor.integrations.hf import SupervisorCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[SupervisorCallback()])
    trainer.train()

Per rank and per optimizer step it reports the token-weighted loss (summed over the
micro-batches of gradient accumulation, from the model's ``loss`` and ``labels``), the grad
norm before clipping, the LR the step used and the sampled update ratio. At the step
boundary (``on_step_end``) it carries out the supervisor's directives in place: freeze
(parks every rank), snapshot, rollback (model, optimizer and scheduler state loaded into
the live objects; ``state.global_step`` follows so ``max_steps`` still means optimizer steps
of the kept timeline), LR scale / re-warm and clip overrides, stop.

Checkpoints: with ``save_strategy="steps"`` each ``checkpoint-N/`` the Trainer writes is
adopted by the supervisor's store once written (``on_save``): manifest, checksums, health
marks; these are then the job's checkpoints and a rollback to one restarts the worker group,
which resumes through the Trainer's own path when the script passes
``trainer.train(resume_from_checkpoint=resume_checkpoint())``. Without Trainer checkpoints
the supervisor's own are saved every ``checkpoint.every_steps`` and loaded in place.

To see the grad norm *before* clipping, the callback takes over ``max_grad_norm``: it sets
the Trainer's to 0 (no clip there) and clips to the same value itself, just before
``optimizer.step()``. The Trainer's own checkpoints (``save_steps``), logs and reporting
integrations are untouched. Outside a supervisor (plain ``python`` / ``torchrun``) the same
callback writes a local trace (``trace=`` or ``$SUPERVISOR_TRACE``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from supervisor.integrations.common import FrameworkProbe, LossTap, resume_checkpoint

#: What a Trainer ``checkpoint-N/`` holds (``scheduler.pt`` and per-rank RNG state beside them).
COMPONENTS = ("model", "optimizer", "scheduler", "rng")


class SupervisorCallback(TrainerCallback):
    """Telemetry, directives and recovery for a ``transformers.Trainer`` run."""

    def __init__(self, trace: str | Path | None = None, **settings: Any) -> None:
        self.trace = trace
        self.settings = settings
        self.fp: FrameworkProbe | None = None
        self.tap: LossTap | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        model, optimizer = kw["model"], kw["optimizer"]
        clip = args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else None
        if clip is not None:
            args.max_grad_norm = 0.0  # the probe clips, after measuring the norm (see module docstring)
        shifted = not getattr(getattr(model, "config", None), "is_encoder_decoder", False)
        self.tap = LossTap(model, shifted=shifted)
        # Under a supervisor the job's max_steps ends training; alone, the Trainer's own does.
        saves = str(getattr(args.save_strategy, "value", args.save_strategy)) == "steps"
        self.fp = FrameworkProbe(
            model, optimizer, kw.get("lr_scheduler"), framework="transformers", saves=saves,
            resumed_at=state.global_step, trace=self.trace, grad_clip=clip, **self.settings,
        )  # fmt: skip
        state.global_step = self.fp.step  # a resumed group continues the supervisor's timeline

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        # The Trainer calls this on every rank right after it wrote checkpoint-<global_step>/.
        if self.fp is not None:
            folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
            self.fp.adopt(state.global_step, folder, COMPONENTS)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> TrainerControl:
        assert self.fp is not None and self.tap is not None
        loss_sum, tokens = self.tap.take()
        stop = self.fp.step_end(loss_sum, tokens)
        state.global_step = self.fp.step  # moved back by an in-place rollback
        if stop:
            control.should_training_stop = True
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.fp is not None:
            self.fp.close()
        if self.tap is not None:
            self.tap.remove()


__all__ = ["SupervisorCallback", "resume_checkpoint"]

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
of the kept timeline), LR scale / re-warm and clip overrides, stop. A restarted worker group
resumes from the supervisor's verified checkpoint before its first step.

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

from supervisor.integrations.common import FrameworkProbe, LossTap


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
        self.fp = FrameworkProbe(
            model, optimizer, kw.get("lr_scheduler"), trace=self.trace, grad_clip=clip, **self.settings
        )
        state.global_step = self.fp.step  # a resumed group continues the supervisor's timeline

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

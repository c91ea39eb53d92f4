"""Lightning under the supervisor: one callback (``pip install spike-supervisor[lightning]``).

    from supervisor.integrations.lightning import SupervisorCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[SupervisorCallback()])
    trainer.fit(module, datamodule)

Per rank and per optimizer step it reports the loss ``training_step`` returned (token-weighted
when it returns ``{"loss": ..., "tokens": n}``, summed over accumulated batches), the grad
norm in ``on_before_optimizer_step`` (after AMP unscaling, before Lightning clips), the LR the
step used and the sampled update ratio. After each optimizer step (``on_train_batch_end``)
it carries out the supervisor's directives in place: freeze, snapshot, rollback (module,
optimizer and scheduler state loaded into the live objects; the loop's step counter follows
so ``max_steps`` still counts the kept timeline), LR scale / re-warm, a clip override
(applied before Lightning's own ``gradient_clip_val``), stop (``trainer.should_stop``).
A restarted worker group resumes from the supervisor's verified checkpoint in
``on_train_start``. The user's ``ModelCheckpoint`` and loggers are untouched.

Hazard: Lightning runs ``training_step`` and ``backward`` inside ``optimizer.step(closure)``,
so an optimizer pre-step hook fires before the gradients exist; the grad norm and the clip
override are therefore taken in ``on_before_optimizer_step``, where they are complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from supervisor.integrations.common import FrameworkProbe
from supervisor.logging import get_logger
from supervisor.sdk.metrics import grad_norm

log = get_logger("supervisor.integrations.lightning")


class SupervisorCallback(pl.Callback):
    """Telemetry, directives and recovery for a ``lightning.pytorch.Trainer`` run."""

    def __init__(self, trace: str | Path | None = None, **settings: Any) -> None:
        self.trace = trace
        self.settings = settings
        self.fp: FrameworkProbe | None = None
        self._norm: torch.Tensor | None = None
        self._loss_sum: torch.Tensor | None = None
        self._tokens: torch.Tensor | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"SupervisorCallback supports one optimizer (this module has {len(trainer.optimizers)})"
            )
        configs = trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        self.fp = FrameworkProbe(
            pl_module, trainer.optimizers[0], scheduler, trace=self.trace, **self.settings
        )
        _set_global_step(trainer, self.fp.step)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        assert self.fp is not None
        self._norm = grad_norm(self.fp.probe.params, self.fp.probe.steering.grad_clip)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self.fp is not None
        self._add_loss(outputs)
        if self._norm is None:  # gradient accumulation: no optimizer step after this batch
            return
        probe = self.fp.probe
        if self._loss_sum is not None:
            probe.record(loss_sum=self._loss_sum, tokens=self._tokens, grad_norm=self._norm)
        self._norm = self._loss_sum = self._tokens = None
        if not probe.proceed():
            trainer.should_stop = True
        _set_global_step(trainer, self.fp.step)  # moved back by an in-place rollback

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.fp is not None:
            self.fp.close()

    def _add_loss(self, outputs: Any) -> None:
        out = outputs if isinstance(outputs, dict) else {"loss": outputs}
        loss = out.get("loss")
        if not isinstance(loss, torch.Tensor):
            return
        tokens = out.get("tokens")
        n = tokens.detach() if isinstance(tokens, torch.Tensor) else torch.tensor(float(tokens or 1))
        part = loss.detach().double() * n.to(loss.device)
        self._loss_sum = part if self._loss_sum is None else self._loss_sum + part
        self._tokens = n if self._tokens is None else self._tokens + n


def _set_global_step(trainer: pl.Trainer, step: int) -> None:
    """Lightning counts optimizer steps in its loop's progress; make it match the probe's timeline."""
    if trainer.global_step == step:
        return
    try:
        progress = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
        progress.ready = progress.completed = step
    except AttributeError as exc:  # a Lightning version with another layout: say so, keep training
        log.warning("global_step_not_moved", step=step, error=repr(exc))

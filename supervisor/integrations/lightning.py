"""Lightning under the supervisor: one callback (``pip install spike-supervisor[lightning]``).

    from supervisor.integrations.lightning import SupervisorCallback

    trainer = L.Trainer(max_steps=1000, callbacks=[SupervisorCallback()])
    trainer.fit(module, datamodule)

Per rank and per optimizer step it reports the loss ``training_step`` returned (token-weighted
when it returns ``{"loss": ..., "tokens": n}``, over all the step's accumulated batches: each
micro-batch's own loss, not the ``1/accumulate_grad_batches`` share Lightning hands back), the grad
norm in ``on_before_optimizer_step`` (after AMP unscaling, before Lightning clips), the LR the
step used and the sampled update ratio. After each optimizer step (``on_train_batch_end``)
it carries out the supervisor's directives in place: freeze, snapshot, rollback (module,
optimizer and scheduler state loaded into the live objects; the loop's step counter follows
so ``max_steps`` still counts the kept timeline), LR scale / re-warm, a clip override
(applied before Lightning's own ``gradient_clip_val``), stop (``trainer.should_stop``). The step
Lightning gives its loggers moves back with a rollback too: the logger's rows follow the records.
The user's ``ModelCheckpoint`` and loggers are untouched.

Checkpoints: every ``.ckpt`` the Trainer writes (``ModelCheckpoint``, ``trainer.save_checkpoint``)
is adopted by the supervisor's store once ``Trainer.save_checkpoint`` returned (the file is
complete on every rank then): manifest, checksums, health marks. With a ``ModelCheckpoint``
saving every N training steps these are the job's checkpoints, and a rollback to one restarts
the worker group, which resumes through Lightning's own path when the script passes
``trainer.fit(module, data, ckpt_path=resume_checkpoint())``. Without one the supervisor saves
its own every ``checkpoint.every_steps`` and loads them in place.

Hazard: Lightning runs ``training_step`` and ``backward`` inside ``optimizer.step(closure)``,
so an optimizer pre-step hook fires before the gradients exist; the grad norm and the clip
override are therefore taken in ``on_before_optimizer_step``, where they are complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from supervisor.errors import ConfigError
from supervisor.integrations.common import FrameworkProbe, StepData, is_supervised_loader, resume_checkpoint
from supervisor.logging import get_logger
from supervisor.sdk import loader as sdk_loader
from supervisor.sdk.metrics import grad_norm

log = get_logger("supervisor.integrations.lightning")

#: What a Lightning ``.ckpt`` holds (module and optimizer state, LR schedulers, loop state).
COMPONENTS = ("model", "optimizer", "scheduler")


class SupervisedLoader(sdk_loader.SupervisedLoader):
    """The SDK's ``SupervisedLoader`` (same arguments), with a length, for ``trainer.fit``.

    Lightning draws one batch ahead of training from a loader without a length (to know the
    epoch's last batch), and that batch would escape the supervisor's directives at the step
    boundary; with a length it draws each batch when its step starts, so an exclusion, a skip
    or an in-place rollback takes effect at the very next batch and a checkpoint's cursor is
    exactly where training is. The length is one pass over the dataset (global batches); the
    loader itself runs on across epochs. Lightning saves and restores its cursor and exclusions
    in every ``.ckpt`` (``state_dict`` / ``load_state_dict``), so ``ckpt_path=`` resumes the data
    too. Map-style datasets only: a stream has no length.
    """

    def __init__(self, dataset: Any, batch_size: int, **kwargs: Any) -> None:
        if not sdk_loader.is_map_style(dataset):
            raise ConfigError(
                "supervisor.integrations.lightning.SupervisedLoader needs a map-style dataset (__len__ and "
                "__getitem__): Lightning draws a batch ahead of a loader without a length",
                field="train_dataloaders",
            )
        super().__init__(dataset, batch_size, **kwargs)

    def __len__(self) -> int:
        return max(1, len(self.dataset) // (self.batch_size * self.world_size))


class SupervisorCallback(pl.Callback):
    """Telemetry, directives and recovery for a ``lightning.pytorch.Trainer`` run."""

    def __init__(self, trace: str | Path | None = None, **settings: Any) -> None:
        self.trace = trace
        self.settings = settings
        self.fp: FrameworkProbe | None = None
        self._norm: torch.Tensor | None = None
        self._loss_sum: torch.Tensor | None = None
        self._tokens: torch.Tensor | None = None
        self._data = StepData()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(
                f"SupervisorCallback supports one optimizer (this module has {len(trainer.optimizers)})"
            )
        configs = trainer.lr_scheduler_configs
        scheduler = configs[0].scheduler if configs else None
        # A ModelCheckpoint saving full training state every N steps makes the job's checkpoints
        # (its step interval is only kept as ``_every_n_train_steps``); weights-only files cannot resume.
        saves = any(
            getattr(cb, "_every_n_train_steps", 0) and not getattr(cb, "save_weights_only", False)
            for cb in trainer.checkpoint_callbacks
        )
        loader = _supervised_loader(trainer)
        self.fp = FrameworkProbe(
            pl_module, trainer.optimizers[0], scheduler, framework="lightning", saves=saves,
            resumed_at=trainer.global_step, trace=self.trace, loader=loader, **self.settings,
        )  # fmt: skip
        _set_global_step(trainer, self.fp.step)
        self._watch_saves(trainer)
        if self.fp.begin():  # directives due before the first step (a restarted group's freeze and fixes)
            trainer.should_stop = True
        _set_global_step(trainer, self.fp.step)

    def _watch_saves(self, trainer: pl.Trainer) -> None:
        """Adopt each checkpoint once ``Trainer.save_checkpoint`` (which ends in a barrier) returned.

        Lightning tells callbacks about a save *before* the file is written
        (``on_save_checkpoint``), so the adapter wraps the trainer's own method instead.
        """
        save = trainer.save_checkpoint
        fp = self.fp

        def save_and_adopt(
            filepath: Any, weights_only: bool | None = None, storage_options: Any = None
        ) -> None:
            save(filepath, weights_only=weights_only, storage_options=storage_options)
            if fp is not None and trainer.training and not weights_only:
                data = ("data_cursor", "exclusions") if fp.probe.loader is not None else ()
                fp.adopt(trainer.global_step, filepath, COMPONENTS + data)

        trainer.save_checkpoint = save_and_adopt  # type: ignore[method-assign]

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.fp is not None and pl_module.automatic_optimization:
            _set_logger_step(trainer, self.fp.step)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        assert self.fp is not None
        self._norm = grad_norm(self.fp.probe.params, self.fp.probe.steering.grad_clip)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        assert self.fp is not None
        # Automatic optimization divides the loss it hands back by accumulate_grad_batches (the part
        # of the step's gradient this micro-batch makes); the record wants the micro-batch's own loss.
        self._add_loss(outputs, trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1)
        self._data.add(batch)
        if self._norm is None:  # gradient accumulation: no optimizer step after this batch
            return
        probe = self.fp.probe
        data = self._data.take()
        if self._loss_sum is not None:
            probe.record(loss_sum=self._loss_sum, tokens=self._tokens, grad_norm=self._norm, batch=data)
        self._norm = self._loss_sum = self._tokens = None
        if not probe.proceed():
            trainer.should_stop = True
        _set_global_step(trainer, self.fp.step)  # moved back by an in-place rollback

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.fp is not None:
            self.fp.close()

    def _add_loss(self, outputs: Any, normalized_by: int) -> None:
        out = outputs if isinstance(outputs, dict) else {"loss": outputs}
        loss = out.get("loss")
        if not isinstance(loss, torch.Tensor):
            return
        tokens = out.get("tokens")
        n = tokens.detach() if isinstance(tokens, torch.Tensor) else torch.tensor(float(tokens or 1))
        part = loss.detach().double() * normalized_by * n.to(loss.device)
        self._loss_sum = part if self._loss_sum is None else self._loss_sum + part
        self._tokens = n if self._tokens is None else self._tokens + n


def _supervised_loader(trainer: pl.Trainer) -> SupervisedLoader | None:
    """The run's training loader when it is a supervised one; a loader Lightning would draw ahead of
    is refused here, at the start, rather than letting a batch slip past an exclusion."""
    loader = trainer.train_dataloader
    if not is_supervised_loader(loader):
        return None
    if not isinstance(loader, SupervisedLoader):
        raise ConfigError(
            "trainer.fit got the SDK's SupervisedLoader: pass supervisor.integrations.lightning.SupervisedLoader "
            "(same arguments, with a length) so that Lightning does not draw a batch ahead of the supervisor",
            field="train_dataloaders",
        )
    return loader


def _set_logger_step(trainer: pl.Trainer, step: int) -> None:
    """The step Lightning hands its loggers (and ``log_every_n_steps`` counts) is a counter of its own,
    ``_batches_that_stepped``; before each batch it is set to the steps of the kept timeline, so after
    an in-place rollback the logger's rows go back with the records (the step that was rolled back
    was logged under its own number before the counter moved)."""
    loop = trainer.fit_loop.epoch_loop
    if getattr(loop, "_batches_that_stepped", step) != step:
        loop._batches_that_stepped = step


def _set_global_step(trainer: pl.Trainer, step: int) -> None:
    """Lightning counts optimizer steps in its loop's progress; make it match the probe's timeline."""
    if trainer.global_step == step:
        return
    try:
        progress = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step.total
        progress.ready = progress.completed = step
    except AttributeError as exc:  # a Lightning version with another layout: say so, keep training
        log.warning("global_step_not_moved", step=step, error=repr(exc))


__all__ = ["SupervisedLoader", "SupervisorCallback", "resume_checkpoint"]

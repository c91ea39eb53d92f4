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

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from supervisor.integrations.common import (
    META_KEYS,
    FrameworkProbe,
    LossTap,
    StepData,
    is_supervised_loader,
    resume_checkpoint,
)
from supervisor.sdk.context import dist_info
from supervisor.sdk.loader import SupervisedLoader

#: What a Trainer ``checkpoint-N/`` holds (``scheduler.pt`` and per-rank RNG state beside them).
COMPONENTS = ("model", "optimizer", "scheduler", "rng")


class SupervisorCallback(TrainerCallback):
    """Telemetry, directives and recovery for a ``transformers.Trainer`` run."""

    def __init__(self, trace: str | Path | None = None, **settings: Any) -> None:
        self.trace = trace
        self.settings = settings
        self.fp: FrameworkProbe | None = None
        self.tap: LossTap | None = None
        self.data = StepData()
        """The IDs of this step's batches (``SupervisedTrainer`` adds them as the Trainer draws them)."""

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
        loader = kw.get("train_dataloader")
        self.fp = FrameworkProbe(
            model, optimizer, kw.get("lr_scheduler"), framework="transformers", saves=saves,
            resumed_at=state.global_step, trace=self.trace, grad_clip=clip,
            loader=loader if is_supervised_loader(loader) else None, **self.settings,
        )  # fmt: skip
        state.global_step = self.fp.step  # a resumed group continues the supervisor's timeline
        if self.fp.begin():  # directives due before the first step (a restarted group's freeze and fixes)
            control.should_training_stop = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        # The Trainer calls this on every rank right after it wrote checkpoint-<global_step>/.
        if self.fp is not None:
            folder = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
            data = ("data_cursor", "exclusions") if self.fp.probe.loader is not None else ()
            self.fp.adopt(state.global_step, folder, COMPONENTS + data)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> TrainerControl:
        assert self.fp is not None and self.tap is not None
        loss_sum, tokens = self.tap.take()
        stop = self.fp.step_end(loss_sum, tokens, batch=self.data.take())
        state.global_step = self.fp.step  # moved back by an in-place rollback
        loader = self.fp.probe.loader
        passes = loader.epoch_progress() if loader is not None else None
        if passes is not None:
            # The Trainer computes ``epoch`` as step / max_steps for a loader without a length; the
            # supervised loader knows the passes over the dataset its cursor stands at.
            state.epoch = passes
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


#: Each rank's data cursor and exclusions, saved into every ``checkpoint-N/`` (torch pickle).
DATA_STATE = "supervisor_data.rank{rank}.pt"


class SupervisedTrainer(Trainer):
    """A ``Trainer`` whose training batches come from the SDK's ``SupervisedLoader``.

    The same constructor and ``train()`` as ``Trainer``. What it adds: every batch carries
    stable sample IDs into the records (the diagnosis names the samples of a spike), and the
    policy's ``exclude`` (samples, sources, batch ranges) and ``skip_batches`` are carried out by
    the loader -- in place, and in a run restarted through ``resume_from_checkpoint``, whose
    loader gets the checkpoint's cursor and exclusions plus the re-delivered new ones before its
    first batch. The loader shards each global batch over the ranks itself; its cursor and
    exclusions are saved per rank into every ``checkpoint-N/`` (``supervisor_data.rank<R>.pt``)
    and restored from it on resume, so the Trainer's own batch skipping is off
    (``ignore_data_skip``). A ``SupervisorCallback`` is added when none is given.

    The loader is built from ``train_dataset`` (map-style or streaming) with
    ``per_device_train_batch_size``, ``data_seed`` (else ``seed``), the data collator and the
    ``dataloader_*`` worker settings. ``max_steps`` must be set (the loader runs across epochs).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not any(isinstance(cb, SupervisorCallback) for cb in self.callback_handler.callbacks):
            self.add_callback(SupervisorCallback())
        self.args.ignore_data_skip = True  # the loader's cursor, saved with each checkpoint, resumes the data
        self.supervised_loader: SupervisedLoader | None = None
        self._resume_from: str | None = None

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            from transformers.trainer_utils import get_last_checkpoint

            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        self._resume_from = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_train_dataloader(self) -> Any:
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        if self.args.max_steps <= 0:
            raise ValueError(
                "SupervisedTrainer needs TrainingArguments(max_steps=...): its loader runs across epochs"
            )
        if self.supervised_loader is None:
            a, dataset, collate = self.args, self.train_dataset, self.data_collator
            if hasattr(dataset, "column_names") and hasattr(dataset, "remove_columns"):  # a datasets.Dataset
                dataset = self._remove_unused_columns(dataset, description="training")
            else:
                collate = self._get_collator_with_removed_columns(collate, description="training")
            self.supervised_loader = SupervisedLoader(
                dataset, self._train_batch_size, seed=a.data_seed if a.data_seed is not None else a.seed,
                collate_fn=collate, num_workers=a.dataloader_num_workers, pin_memory=a.dataloader_pin_memory,
                prefetch_factor=a.dataloader_prefetch_factor,
            )  # fmt: skip
        if self._resume_from is not None:
            self._load_data_state(Path(self._resume_from))
        return self.supervised_loader

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        cb = self._callback()
        if cb is not None:
            cb.data.add(inputs)
        inputs = {k: v for k, v in inputs.items() if k not in META_KEYS}  # not the model's arguments
        return super().training_step(model, inputs, num_items_in_batch)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self.supervised_loader is None:
            return
        # Every rank, before on_save (where the supervisor adopts the folder after a barrier).
        folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        folder.mkdir(parents=True, exist_ok=True)
        rank, _ = dist_info()
        tmp = folder / (DATA_STATE.format(rank=rank) + ".tmp")
        torch.save(self.supervised_loader.state_dict(), tmp)
        tmp.replace(folder / DATA_STATE.format(rank=rank))

    def _load_data_state(self, folder: Path) -> None:
        assert self.supervised_loader is not None
        rank, _ = dist_info()
        path = folder / DATA_STATE.format(rank=rank)
        if not path.is_file():
            raise ValueError(
                f"{folder}: no {path.name}: the checkpoint was not written by a SupervisedTrainer, so the data "
                "position cannot be resumed"
            )
        # Our own file, in a checkpoint the supervisor verified (checksums) before handing it over.
        self.supervised_loader.load_state_dict(torch.load(path, weights_only=False))

    def _callback(self) -> SupervisorCallback | None:
        return next((c for c in self.callback_handler.callbacks if isinstance(c, SupervisorCallback)), None)


__all__ = ["SupervisedTrainer", "SupervisorCallback", "resume_checkpoint"]

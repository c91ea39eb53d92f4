"""What the framework adapters share: the probe over live framework objects and the loss tap.

A framework owns the loop, the optimizer step and the scheduler; the adapter sees them at
its callbacks. ``FrameworkProbe`` builds a ``sdk.watch`` probe over the *inner* torch
optimizer and scheduler (accelerate and Lightning wrap them), so checkpoints, in-place
rollbacks and LR / clip overrides act on exactly the objects that train.

Two recovery modes (docs/integrations.md):
- *in place*: the supervisor's own checkpoints (``checkpoint.every_steps``) are loaded into
  the live objects at the step boundary;
- *restart*: the worker group is restarted from a checkpoint the framework wrote and the
  supervisor adopted, and the framework loads it through its own resume path
  (``resume_from_checkpoint=resume_checkpoint()`` / ``ckpt_path=resume_checkpoint()``); the
  policy's fixes reach the new processes as directives.
When the framework saves checkpoints itself, each one is adopted once written (manifest,
checksums, marks) and those are the job's checkpoints: the SDK's own periodic saves are off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from supervisor import sdk
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError, ConfigError, SupervisorError
from supervisor.integrations.drills import inject_faults
from supervisor.logging import get_logger
from supervisor.sdk.context import resolve_ctx

log = get_logger("supervisor.integrations")


def resume_checkpoint(ctx: Any = None) -> str | None:
    """The framework checkpoint this run resumes from, verified, as a local path; else None.

    Pass it to the framework: ``trainer.train(resume_from_checkpoint=resume_checkpoint())``
    (Hugging Face) or ``trainer.fit(module, data, ckpt_path=resume_checkpoint())`` (Lightning).
    None when the run starts fresh, runs without a supervisor, or resumes from the
    supervisor's own checkpoint (the callback loads that one itself).
    """
    from supervisor.checkpoint.adopt import local_copy
    from supervisor.checkpoint.verify import verify

    ctx = resolve_ctx(ctx)
    step, store = getattr(ctx, "resume_step", None), getattr(ctx, "checkpoint_store", None)
    if step is None or store is None:
        return None
    manifest = store.find(int(step))
    if manifest is None or manifest.source is None:
        return None
    # Verification before use: every rank checks the files it is about to load (not recorded:
    # the supervisor records its own verification of the target).
    result = verify(
        store, int(step), expected_world_size=getattr(ctx, "world_size", None), record=False, by="resume"
    )
    if not result.ok:
        raise CheckpointError(
            f"framework checkpoint of step {step} failed verification: {'; '.join(result.problems[:3])}",
            source=store.where(int(step)),
        )
    return str(local_copy(store, manifest))


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside framework wrappers (accelerate's AcceleratedOptimizer, LightningOptimizer)."""
    seen = 0
    while not type(optimizer).__module__.startswith("torch.optim") and hasattr(optimizer, "optimizer"):
        optimizer, seen = optimizer.optimizer, seen + 1
        if seen > 4:
            break
    return optimizer


def inner_scheduler(scheduler: Any) -> Any:
    """The torch LR scheduler inside accelerate's AcceleratedScheduler (its ``state_dict`` is the inner one's)."""
    inner = getattr(scheduler, "scheduler", None)
    return inner if inner is not None and hasattr(inner, "state_dict") else scheduler


class LossTap:
    """Token-weighted loss of each optimizer step, read from the model's forward outputs.

    A forward hook on the model sees every training micro-batch: Hugging Face models return
    ``loss`` and take ``labels`` (and ``num_items_in_batch`` when the Trainer normalizes over
    the whole accumulated batch). Sums stay on the device until the step's one sync.
    """

    def __init__(self, model: torch.nn.Module, *, shifted: bool = True) -> None:
        self.model = model
        self.shifted = shifted
        self.loss_sum: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is None and isinstance(output, tuple) and output and "labels" in kwargs:
            loss = output[0]  # return_dict=False: the Trainer takes the loss from the first element
        if not module.training or not isinstance(loss, torch.Tensor):
            return
        labels = kwargs.get("labels")
        if isinstance(labels, torch.Tensor):
            target = labels[..., 1:] if self.shifted and labels.dim() >= 2 else labels
            tokens = (target != -100).sum()
        else:
            tokens = torch.ones((), dtype=torch.long, device=loss.device)
        total = kwargs.get("num_items_in_batch")
        scale = total if total is not None else tokens
        self.add(
            loss.detach().double() * (scale.to(loss.device) if isinstance(scale, torch.Tensor) else scale),
            tokens,
        )

    def add(self, loss_sum: torch.Tensor, tokens: torch.Tensor) -> None:
        self.loss_sum = loss_sum if self.loss_sum is None else self.loss_sum + loss_sum
        self.tokens = tokens if self.tokens is None else self.tokens + tokens

    def take(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        out = self.loss_sum, self.tokens
        self.loss_sum = self.tokens = None
        return out

    def remove(self) -> None:
        self.handle.remove()


META_KEYS = sdk.META_KEYS
"""Keys a ``SupervisedLoader`` adds to a mapping batch (the model must not receive them)."""


class StepData:
    """The sample IDs and first global batch index of one optimizer step's (micro-)batches."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.batch_index: int | None = None

    def add(self, batch: Any) -> None:
        if not isinstance(batch, dict) or not batch.get("sample_ids"):
            return
        self.ids += [str(x) for x in batch["sample_ids"]]
        if self.batch_index is None and batch.get("batch_index") is not None:
            self.batch_index = int(batch["batch_index"])

    def take(self) -> dict[str, Any] | None:
        out = {"sample_ids": self.ids, "batch_index": self.batch_index} if self.ids else None
        self.ids, self.batch_index = [], None
        return out


def is_supervised_loader(loader: Any) -> bool:
    """A ``SupervisedLoader`` (or one built on it): takes exclusions and skips, and resumes by cursor."""
    from supervisor.sdk.loader import SupervisedLoader

    return isinstance(loader, SupervisedLoader)


class FrameworkProbe:
    """One rank's probe inside a framework's loop: ``step_end`` reports the step and runs the boundary.

    ``framework``: its name in adopted manifests; ``saves``: the framework writes checkpoints of
    its own (they are adopted and replace the SDK's periodic saves); ``resumed_at``: the step the
    framework's own state says training is at (it loaded a checkpoint when > 0).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: Any,
        scheduler: Any,
        *,
        framework: str,
        saves: bool,
        resumed_at: int,
        loader: Any = None,
        **settings: Any,
    ) -> None:
        self.framework = framework
        self.ctx = settings.get("ctx")
        self.probe = sdk.watch(
            model, inner_optimizer(optimizer), scheduler=inner_scheduler(scheduler), restore=False,
            loader=loader, **settings,
        )  # fmt: skip
        if loader is not None:
            # The framework draws the batches; the boundary runs from the callback (``step_end``), not
            # inside the loader. The loader still takes exclusions, skips and a restored cursor.
            loader.boundary = None
        if saves and self.probe.checkpoint is not None:
            self.probe.settings.checkpoint_every = None  # the framework's checkpoints are the job's
        self.plan = inject_faults(self.probe)
        self._resume(resumed_at)

    @property
    def step(self) -> int:
        return int(self.probe.step_count)

    def _resume(self, resumed_at: int) -> None:
        """Continue the supervisor's timeline from where the framework (or the SDK) resumed."""
        p = self.probe
        wanted = getattr(resolve_ctx(self.ctx), "resume_step", None) if p.checkpoint is not None else None
        if wanted is None:
            p.step_count = resumed_at  # fresh (0), or a run the user resumed on their own
            return
        manifest = p.checkpoint.find(int(wanted))
        if manifest is None or manifest.source is None:
            p.steering.restore(int(wanted))  # the SDK's own checkpoint: loaded in place, as in a rollback
            return
        if resumed_at != int(wanted):
            raise ConfigError(
                f"the supervisor restarted this run from the {self.framework} checkpoint of step {wanted}, but "
                f"the framework resumed at step {resumed_at}: pass the checkpoint to the framework's resume "
                "path, resume_from_checkpoint=resume_checkpoint() (Trainer.train) or ckpt_path=resume_checkpoint() "
                "(Trainer.fit), from supervisor.integrations",
                field="entrypoint",
            )
        p.step_count = p.steering.last_saved = resumed_at
        p.steering.load_state_dict(dict(manifest.extra.get("probe") or {}))  # overrides in force then
        p.next_events.append("resumed")
        log.info("resumed_through_framework", framework=self.framework, step=resumed_at, rank=p.rank)

    def adopt(self, step: int, path: str | Path, components: tuple[str, ...]) -> None:
        """The framework finished writing its checkpoint of ``step`` at ``path`` (every rank calls this).

        Rank 0 adopts it into the store (manifest, checksums; the supervisor then verifies and
        marks it like its own) and reports ``checkpoint_saved:<step>``. A failure is reported
        (``checkpoint_failed:<step>``) and training goes on: the framework's files are intact.
        """
        from supervisor.checkpoint.adopt import adopt_local

        p = self.probe
        if p.checkpoint is None:
            return  # no supervisor store (a plain run): the framework's checkpoint is just that
        if p.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.barrier()  # every rank's files (per-rank RNG state) are on disk before rank 0 lists them
        if p.rank != 0:
            return
        try:
            last = p.pending.record if p.pending is not None else {}
            previous = p.checkpoint.find(step)
            if previous is not None and previous.health not in (
                HealthMark.QUARANTINED,
                HealthMark.DIAGNOSTIC,
            ):
                # (an abandoned timeline's step is quarantined and a snapshot is evidence: both are
                # kept as the step's history when this one replaces them)
                log.info(
                    "adopt_skipped",
                    step=step,
                    why=f"the store holds a {previous.health.value} checkpoint here",
                )
                return
            adopt_local(
                p.checkpoint, step, path, components=components, world_size=p.world_size,
                metrics={k: last.get(k) for k in ("loss", "grad_norm")},
                extra={"framework": self.framework, "probe": p.steering.state_dict()},
            )  # fmt: skip
        except SupervisorError as exc:
            log.error("adopt_failed", step=step, path=str(path), error=exc.one_line())
            p.event(f"checkpoint_failed:{step}")
            return
        p.event(f"checkpoint_saved:{step}")

    def begin(self) -> bool:
        """The boundary before the first step; True when training must stop.

        A restarted group hears its re-delivered freeze and the policy's fixes (LR, clip,
        exclusions, skips) here, so not one step trains before them.
        """
        return not self.probe.proceed()

    def step_end(self, loss_sum: Any, tokens: Any, loss: Any = None, batch: Any = None) -> bool:
        """Report the step just finished, then the boundary; True when training must stop.

        ``batch``: ``{"sample_ids": [...], "batch_index": i}`` of the step's data (a
        ``SupervisedLoader``'s), so the diagnosis can name samples and the policy exclude them.
        """
        if loss_sum is not None and tokens is not None:
            self.probe.record(loss_sum=loss_sum, tokens=tokens, batch=batch)
        elif loss is not None:
            self.probe.record(loss, batch=batch)
        return not self.probe.proceed()

    def close(self) -> None:
        self.probe.close()

"""The fault plan of one rank: the hook points a training loop calls, and the injector registry.

A supervised loop makes two calls (``examples/tinylm/train.py``)::

    for batch in loader:
        batch = plan.begin_step(probe.step_count + 1, batch)
        with probe.step(batch) as s:
            s.backward(loss_fn(model, batch))
            with plan.optimizer_step(probe.step_count + 1, model, optimizer):
                s.optimizer_step()

and ``glue.attach(plan, probe)`` wires the rest. The individual hook points, in order
(each returns at once when no fault is set)::

    plan = FaultPlan.from_specs(config_faults, rank=rank, world_size=world, state_dir=dir)
    plan.install(model)                                  # forward hooks (overflow)
    for step in ...:
        plan.maybe_crash(step)                           # worker_kill
        loader_weights = plan.mixture(step)              # mixture_shift: None or {source: weight}
        batch = plan.batch(step, batch)                  # garbage / corrupt shard / periodic garbage
        lr = scheduled_lr * plan.lr_scale(step)          # lr_spike, oversized_update
        loss.backward(); all-reduce gradients
        plan.before_optimizer_step(step, model, opt)     # rank_grad_corruption, resume_without_optimizer
        clip + measure grad norm; opt.step()
        plan.after_optimizer_step(step, model, opt)
        record = plan.record(step, record)               # logging_bug, the `resumed` event
        ... save checkpoint -> plan.on_checkpoint_saved(step, files)   # corrupt_checkpoint

Gradients must already be synchronized when ``before_optimizer_step`` runs: corrupting
them there is what makes one replica drift from the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from supervisor.drills import inject_data, inject_ops, inject_train
from supervisor.drills.base import Injector, Markers, PlanContext
from supervisor.drills.specs import FAULT_KINDS, FaultParams, parse_faults
from supervisor.errors import ConfigError
from supervisor.logging import get_logger

#: fault kind -> injector class (same keys as ``specs.FAULT_KINDS``).
INJECTORS: dict[str, type[Injector]] = {
    "garbage_batch": inject_data.SampleGarbage,
    "corrupt_shard": inject_data.SampleGarbage,
    "periodic_garbage": inject_data.PeriodicGarbageInjector,
    "mixture_shift": inject_data.MixtureShiftInjector,
    "lr_spike": inject_train.LrSpikeInjector,
    "oversized_update": inject_train.OversizedUpdateInjector,
    "overflow": inject_train.OverflowInjector,
    "rank_grad_corruption": inject_train.RankGradCorruptionInjector,
    "resume_without_optimizer": inject_train.ResumeWithoutOptimizerInjector,
    "logging_bug": inject_ops.LoggingBugInjector,
    "worker_kill": inject_ops.WorkerKillInjector,
    "corrupt_checkpoint": inject_ops.CorruptCheckpointInjector,
}
assert INJECTORS.keys() == FAULT_KINDS.keys(), "every fault kind needs an injector"


def injector_class(kind: str) -> type[Injector]:
    try:
        return INJECTORS[kind]
    except KeyError:
        raise ConfigError(f"unknown fault kind {kind!r}; valid: {', '.join(INJECTORS)}") from None


class FaultPlan:
    """The injectors that apply to one rank, behind the loop's hook points."""

    def __init__(self, injectors: list[Injector], ctx: PlanContext) -> None:
        self.injectors = injectors
        self.ctx = ctx
        self.step: int | None = None
        self.step_fn: Callable[[], int] | None = None
        """The step about to run, when the loop's counter is known (set by ``glue.attach``)."""
        self.trace_path: Path | None = None
        """Drill runs: every record this rank sends is also appended here (set by ``glue.plan_for_worker``)."""

    @classmethod
    def from_specs(
        cls,
        specs: Iterable[Any],
        *,
        rank: int,
        world_size: int,
        state_dir: str | Path | Markers | None = None,
        vocab_size: int | None = None,
    ) -> FaultPlan:
        """Build from ``job.faults`` (``config.job.Fault`` models or dicts); raises ConfigError on a bad spec.

        ``state_dir`` holds "fired" markers (e.g. ``<storage>/<job>/faults``) so one-off faults
        stay fired across a worker restart; without it they are remembered in memory only.
        """
        params = parse_faults(specs)
        markers = state_dir if isinstance(state_dir, Markers) else Markers.in_directory(state_dir)
        ctx = PlanContext(rank=rank, world_size=world_size, markers=markers, vocab_size=vocab_size)
        injectors = [injector_class(p.kind)(p, i, ctx) for i, p in enumerate(params) if p.applies_to(rank)]
        if injectors:
            get_logger("drills", rank=rank).info("fault_plan", faults=[i.key for i in injectors])
        return cls(injectors, ctx)

    @classmethod
    def empty(cls) -> FaultPlan:
        return cls([], PlanContext(rank=0, world_size=1, markers=Markers()))

    @property
    def kinds(self) -> list[str]:
        return [i.spec.kind for i in self.injectors]

    def __bool__(self) -> bool:
        return bool(self.injectors)

    def current_step(self) -> int:
        if self.step_fn is not None:
            return self.step_fn()
        return 0 if self.step is None else self.step

    def _at(self, step: int) -> None:
        if step != self.step:
            self.step = step
            for inj in self.injectors:
                inj.observe_step(step)

    def install(self, model: torch.nn.Module) -> None:
        if self.ctx.vocab_size is None:
            emb = next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)
            self.ctx.vocab_size = emb.num_embeddings if emb is not None else None
        for inj in self.injectors:
            inj.install(model)

    def maybe_crash(self, step: int) -> None:
        self._at(step)
        for inj in self.injectors:
            inj.maybe_crash(step)

    def mixture(self, step: int) -> dict[str, float] | None:
        self._at(step)
        out = None
        for inj in self.injectors:
            out = inj.mixture(step) or out
        return out

    def batch(self, step: int, batch: Any) -> Any:
        self._at(step)
        for inj in self.injectors:
            batch = inj.batch(step, batch)
        return batch

    def lr_scale(self, step: int) -> float:
        self._at(step)
        scale = 1.0
        for inj in self.injectors:
            scale *= inj.lr_scale(step)
        return scale

    def before_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        self._at(step)
        for inj in self.injectors:
            inj.before_optimizer_step(step, model, optimizer)

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        self._at(step)
        for inj in self.injectors:
            inj.after_optimizer_step(step, model, optimizer)

    def record(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        # No _at(step): a record leaves one step late, and must not look like a rollback.
        for inj in self.injectors:
            record = inj.record(step, record)
        return record

    def on_checkpoint_saved(self, step: int, target: Any) -> None:
        """``target``: the job's ``CheckpointStore``, or paths of the saved files (tests)."""
        for inj in self.injectors:
            inj.on_checkpoint_saved(step, target)

    # -- the two calls a supervised loop makes (see examples/tinylm/train.py) --------------------
    def begin_step(self, step: int, batch: Any) -> Any:
        """At the top of step ``step``: maybe kill this worker, then maybe corrupt its batch."""
        if not self.injectors:
            return batch
        self.maybe_crash(step)
        return self.batch(step, batch)

    @contextmanager
    def optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> Iterator[None]:
        """Around the optimizer step (gradients already synchronized): gradient faults, LR scale."""
        if not self.injectors:
            yield
            return
        self.before_optimizer_step(step, model, optimizer)
        with self.scaled_lr(step, optimizer):
            yield
        self.after_optimizer_step(step, model, optimizer)

    @contextmanager
    def scaled_lr(self, step: int, optimizer: torch.optim.Optimizer) -> Iterator[float]:
        """Every ``optimizer.step()`` inside the block runs with the LRs multiplied by ``lr_scale(step)``.

        Hazard: the loop's scheduler usually steps inside the same block; restoring saved LRs
        afterwards would undo it. Optimizer step pre/post hooks scale and unscale around the
        optimizer step alone, so any scheduler (absolute or chainable) sees the LR it set.
        """
        scale = self.lr_scale(step)
        if scale == 1.0:
            yield scale
            return
        saved: list[float] = []

        def pre(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            saved[:] = [g["lr"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * scale

        def post(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            for g, lr in zip(opt.param_groups, saved, strict=True):
                g["lr"] = lr

        handles = [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
        try:
            yield scale
        finally:
            for h in handles:
                h.remove()


def describe(params: FaultParams) -> str:
    """One line for tables and logs: ``garbage_batch@120 rank 1``."""
    where = "all ranks" if params.rank is None else f"rank {params.rank}"
    return f"{params.kind}@{params.step} {where}"

"""A job's drill faults (job.yaml ``faults:``) on a loop whose optimizer step the user owns.

The SDK-owned loop wraps its step in ``faults.optimizer_step(...)`` (examples/tinylm); a
torchrun-style script or a framework callback has no such place, so the plan is hooked into
the probe's optimizer step instead: a crash due at the step, gradient faults and LR scaling
run just before ``optimizer.step()``, in the same order as in the SDK-owned step. Faults on
the batch itself (``garbage_batch``, ``mixture_shift``) need the ``SupervisedLoader`` and are
refused here with a clear error rather than silently skipped.
"""

from __future__ import annotations

from typing import Any

from supervisor.drills.faults import FaultPlan
from supervisor.drills.glue import attach, plan_for_worker
from supervisor.errors import ConfigError
from supervisor.sdk.context import resolve_ctx

#: Faults that act on the batch: only a loop that feeds batches through the plan can carry them out.
BATCH_FAULTS = {"garbage_batch", "periodic_garbage", "mixture_shift", "corrupt_shard"}


def inject_faults(probe: Any, ctx: Any = None) -> FaultPlan:
    """The job's fault plan, attached to ``probe`` (a ``sdk.watch`` probe); empty outside drills."""
    plan = plan_for_worker(resolve_ctx(ctx))
    if not plan:
        # A drill's clean reference still writes its trace: its final loss is the yardstick.
        attach(plan, probe)
        return plan
    unsupported = sorted(set(plan.kinds) & BATCH_FAULTS)
    if unsupported:
        raise ConfigError(
            f"drill faults {unsupported} act on the batch and need the SupervisedLoader; "
            "a watched optimizer step can inject only optimizer/gradient/crash faults",
            field="faults",
        )
    if probe.user_step is None:
        raise ConfigError("inject_faults needs a probe from sdk.watch(...)", field="faults")
    attach(plan, probe)
    saved: list[float] = []

    def pre(step: int, optimizer: Any) -> None:
        plan.maybe_crash(step)
        plan.before_optimizer_step(step, probe.model, optimizer)
        scale = plan.lr_scale(step)
        saved[:] = [g["lr"] for g in optimizer.param_groups]
        for g in optimizer.param_groups:
            g["lr"] = g["lr"] * scale

    def post(step: int, optimizer: Any) -> None:
        for g, lr in zip(optimizer.param_groups, saved, strict=False):
            g["lr"] = lr
        plan.after_optimizer_step(step, probe.model, optimizer)

    probe.user_step.wrap(pre, post)
    return plan

"""The training-side SDK: what a plain PyTorch loop adds to be watched and steered.

    from supervisor import sdk

    loader = sdk.SupervisedLoader(dataset, batch_size=8, seed=0)
    probe = sdk.init(model, optimizer, scheduler=scheduler, loader=loader, loss_fn=lm_loss, ctx=ctx)
    for batch in loader:
        with probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
    probe.close()

A loop that keeps its own ``clip_grad_norm_``, ``optimizer.step()`` and scheduler reports
each step instead (the probe hooks the optimizer for LR / clip overrides and measures around it):

    probe = sdk.watch(model, optimizer, scheduler=scheduler)
    for batch in dataloader:
        if not probe.proceed():                # step boundary: directives, checkpoints, stop
            break
        loss = model(**batch).loss; loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(); scheduler.step(); optimizer.zero_grad()
        probe.record(loss, grad_norm=gn, tokens=n_tokens)
    probe.close()

With ``ctx`` (from the runtime), or in a process the supervisor started from a command
entrypoint (``$SUPERVISOR_SOCKET``), records go to the supervisor and directives come back;
otherwise the same probe writes a JSONL trace (``trace=`` or ``$SUPERVISOR_TRACE``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from supervisor.sdk.directives import (
    ApplyOverrides,
    Continue,
    Directive,
    Exclusions,
    Freeze,
    RollbackInPlace,
    Snapshot,
    Stop,
)
from supervisor.sdk.settings import ProbeSettings
from supervisor.sdk.transport import BatchingTransport, MemoryTransport, OfflineTransport, Transport

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from supervisor.sdk.loader import SupervisedLoader
    from supervisor.sdk.losses import StepLoss, token_losses
    from supervisor.sdk.probe import LossFn, Probe

#: Names whose modules import torch, loaded on first use: the supervisor process reads the
#: directives from this package and never trains, so it does not pay for torch (~3 CPU-s).
_LAZY = {
    "SupervisedLoader": "supervisor.sdk.loader",
    "StepLoss": "supervisor.sdk.losses",
    "token_losses": "supervisor.sdk.losses",
    "LossFn": "supervisor.sdk.probe",
    "Probe": "supervisor.sdk.probe",
}


#: Keys a ``SupervisedLoader`` adds to every mapping batch: drop them before ``model(**batch)``.
META_KEYS = ("sample_ids", "sources", "batch_index")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "ApplyOverrides", "BatchingTransport", "Continue", "Directive", "Exclusions", "Freeze", "META_KEYS", "MemoryTransport",
    "OfflineTransport", "Probe", "ProbeSettings", "RollbackInPlace", "Snapshot", "StepLoss", "Stop",
    "SupervisedLoader", "Transport", "init", "token_losses", "watch",
]  # fmt: skip


def init(
    model: nn.Module,
    optimizer: Optimizer,
    *,
    scheduler: Any = None,
    scaler: Any = None,
    loader: SupervisedLoader | None = None,
    loss_fn: LossFn | None = None,
    ctx: Any = None,
    transport: Transport | None = None,
    checkpoint: Any = None,
    trace: str | Path | None = None,
    canary_batch: Any = None,
    restore: bool = True,
    **settings: Any,
) -> Probe:
    """Build the probe for this rank. ``settings`` are ``ProbeSettings`` fields (they override the job's:
    ``max_steps=`` here wins over job.yaml ``max_steps``, with a warning when they differ).

    ``ctx`` is the runtime's worker context (rank, world size, transport, checkpoint store,
    resume step, job spec); without one it is read from the environment of a process the
    supervisor started, else the probe runs offline and writes ``trace``.
    With ``ctx.resume_step`` set, the state of that checkpoint is loaded before returning.
    """
    from supervisor.sdk.context import dist_info, job_settings, resolve_ctx, trace_path
    from supervisor.sdk.probe import Probe

    ctx = resolve_ctx(ctx)
    rank, world_size = dist_info(ctx)
    from_job = job_settings(ctx)
    cfg = _settings({**from_job, **settings})
    if settings.get("max_steps") is not None and from_job.get("max_steps") not in (
        None,
        settings["max_steps"],
    ):
        # The argument wins (the script's loop ends there); the supervisor's display counts to the job's.
        from supervisor.logging import get_logger

        get_logger("supervisor.sdk", rank=rank).warning(
            "max_steps_differs", argument=settings["max_steps"], job=from_job["max_steps"],
            note="training ends at the argument's; job.yaml max_steps is what the supervisor displays",
        )  # fmt: skip
    transport = (
        transport or getattr(ctx, "transport", None) or OfflineTransport(trace_path(trace, rank, world_size))
    )
    checkpoint = checkpoint if checkpoint is not None else getattr(ctx, "checkpoint_store", None)
    if cfg.canary_every and canary_batch is None and loader is not None:
        canary_batch = loader.fixed_batch()
    probe = Probe(
        model, optimizer, transport=transport, scheduler=scheduler, scaler=scaler, loader=loader, loss_fn=loss_fn,
        canary_batch=canary_batch, checkpoint=checkpoint, rank=rank, world_size=world_size, settings=cfg,
    )  # fmt: skip
    resume = getattr(ctx, "resume_step", None)
    if restore and resume is not None:
        probe.steering.restore(int(resume))
    return probe


def _settings(values: dict[str, Any]) -> ProbeSettings:
    """``ProbeSettings`` from the job's and the caller's values; a bad one is refused in one line naming it."""
    from pydantic import ValidationError

    from supervisor.errors import ConfigError

    try:
        return ProbeSettings(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        name = ".".join(str(x) for x in err["loc"]) or "settings"
        if err["type"] == "extra_forbidden":
            known = ", ".join(ProbeSettings.model_fields)
            raise ConfigError(
                f"not an argument of sdk.init / sdk.watch (their settings: {known})", field=name
            ) from None
        raise ConfigError(f"{err['msg']} (got {err.get('input')!r})", field=name) from None


def watch(
    model: nn.Module,
    optimizer: Optimizer,
    *,
    scheduler: Any = None,
    scaler: Any = None,
    loader: SupervisedLoader | None = None,
    ctx: Any = None,
    transport: Transport | None = None,
    checkpoint: Any = None,
    trace: str | Path | None = None,
    restore: bool = True,
    **settings: Any,
) -> Probe:
    """A probe for a loop that keeps its own optimizer step; report each step with ``probe.record``.

    The probe hooks ``optimizer`` (step pre/post hooks) for the supervisor's LR and clip
    overrides and the grad norm; ``probe.proceed()`` is the step boundary (freeze, snapshot,
    in-place rollback of model / optimizer / scheduler, periodic checkpoint, stop).

    ``loader``: a ``SupervisedLoader`` the loop draws its batches from. The boundary then runs
    inside it (before the first batch of each step; it raises ``StopIteration`` at
    ``max_steps`` or on a stop, so ``for batch in loader:`` ends there and needs no
    ``proceed()``), every record names the samples and sources drawn for its step, and the
    policy's exclusions and batch skips are carried out. Without it such a directive is refused
    (acknowledged as failed), never silently ignored. ``restore=False``: the caller resumes
    itself (a framework that loads its own checkpoint, ``supervisor.integrations``).
    """
    from supervisor.errors import ConfigError

    if not callable(getattr(optimizer, "register_step_pre_hook", None)):
        raise ConfigError(
            f"a torch.optim.Optimizer (the one your loop steps), got {type(optimizer).__name__}",
            source="sdk.watch", field="optimizer",
        )  # fmt: skip
    if loader is not None and not (hasattr(loader, "track_draws") and hasattr(loader, "exclude")):
        raise ConfigError(
            f"a SupervisedLoader (it names each batch's samples, carries out exclusions and resumes its "
            f"cursor), got {type(loader).__name__}: build sdk.SupervisedLoader(dataset, batch_size, seed=...) "
            "or leave loader= out and iterate your own",
            source="sdk.watch", field="loader",
        )  # fmt: skip
    probe = init(
        model, optimizer, scheduler=scheduler, scaler=scaler, loader=loader, ctx=ctx, transport=transport,
        checkpoint=checkpoint, trace=trace, restore=False, **settings,
    )  # fmt: skip
    probe.watch_optimizer()
    from supervisor.sdk.context import resolve_ctx

    resume = getattr(resolve_ctx(ctx), "resume_step", None)
    if restore and resume is not None:
        probe.steering.restore(int(resume))
    return probe

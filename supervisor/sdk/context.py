"""What the runtime hands to the training function, and the offline fallback.

The runtime calls the user's ``main(config, ctx)`` with a context object (see
``supervisor.ranks.context.WorkerContext``); ``sdk.init(..., ctx=ctx)`` reads these
attributes, all optional: ``rank``, ``world_size``, ``transport`` (a ``Transport``),
``checkpoint_store`` (a ``CheckpointStore``), ``resume_step``, ``job`` (a ``JobSpec``:
``max_steps``, ``telemetry.fingerprint_every``, ``telemetry.canary_every``,
``checkpoint.every_steps``). With no context the probe runs offline: rank and world size come
from ``torch.distributed`` (or ``RANK`` / ``WORLD_SIZE``), and records go to a JSONL trace.

A process the supervisor started from a command entrypoint (torchrun-style) has no ``ctx``
argument: ``from_env()`` builds the same context from ``SUPERVISOR_*`` variables and connects
to the rank's worker actor (``supervisor.sdk.local_link``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist


def dist_info(ctx: Any = None) -> tuple[int, int]:
    """(rank, world_size): from ``ctx``, else torch.distributed, else the environment."""
    if ctx is not None and getattr(ctx, "world_size", None) is not None:
        return int(ctx.rank), int(ctx.world_size)
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def job_settings(ctx: Any) -> dict[str, Any]:
    """``ProbeSettings`` fields the job spec sets (empty without a job)."""
    job = getattr(ctx, "job", None)
    if job is None:
        return {}
    return {
        "fingerprint_every": job.telemetry.fingerprint_every,
        "canary_every": job.telemetry.canary_every,
        "checkpoint_every": job.checkpoint.every_steps,
        "max_steps": job.max_steps,
    }


def trace_path(path: str | Path | None, rank: int, world_size: int) -> Path:
    """The offline trace file of this rank: ``{rank}`` in the name is filled in; else ``.rankN`` is added."""
    p = str(path or os.environ.get("SUPERVISOR_TRACE", "supervisor_trace.jsonl"))
    if "{rank}" in p:
        return Path(p.format(rank=rank))
    if world_size > 1:
        base = Path(p)
        return base.with_name(f"{base.stem}.rank{rank}{base.suffix}")
    return Path(p)


# -- a training process started by the supervisor (command entrypoints) ------------------------
#: Set by the rank's worker actor in the environment of a command entrypoint's process.
JOB_ENV = "SUPERVISOR_JOB"
"""The job spec as JSON."""
RESUME_ENV = "SUPERVISOR_RESUME_STEP"
"""Checkpoint step to resume from (absent: start fresh)."""
GENERATION_ENV = "SUPERVISOR_GENERATION"

_env_ctx: Any = None


@dataclass
class EnvContext:
    """What ``sdk.init`` / ``sdk.watch`` read when no ``ctx`` is passed but a supervisor started us.

    Same attributes as the runtime's ``WorkerContext``; built once per process from
    ``SUPERVISOR_*`` and the torchrun variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).
    """

    rank: int
    world_size: int
    job: Any
    transport: Any
    resume_step: int | None = None
    generation: int = 0
    local_rank: int = 0
    checkpoint_store: Any = None
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.job.config)

    @property
    def max_steps(self) -> int:
        return int(self.job.max_steps)


def supervised() -> bool:
    """True in a training process the supervisor started (a command entrypoint)."""
    from supervisor.sdk.local_link import SOCKET_ENV

    return bool(os.environ.get(SOCKET_ENV)) and bool(os.environ.get(JOB_ENV))


def from_env() -> EnvContext | None:
    """This process's supervisor context, or None when it runs without one (plain torchrun / python).

    The first call connects to the worker actor's socket; later calls return the same context,
    so a script that builds two probes (or a framework callback) shares one connection.
    """
    global _env_ctx
    if _env_ctx is not None or not supervised():
        return _env_ctx
    from supervisor.checkpoint.store import CheckpointStore
    from supervisor.config.job import JobSpec
    from supervisor.sdk.local_link import SOCKET_ENV, LocalLink
    from supervisor.sdk.transport import HOLD_AT_END_S, BatchingTransport
    from supervisor.storage import open_backend

    job = JobSpec.model_validate_json(os.environ[JOB_ENV])
    link = LocalLink(os.environ[SOCKET_ENV])
    # Held at the last step until the supervisor is done with it, as in-process ranks are.
    transport = BatchingTransport(link.send, link.directives, flush_interval_s=job.runtime.flush_interval_s,
                                  name="supervisor", hold_at_end_s=HOLD_AT_END_S,
                                  answers=lambda: link.answers)  # fmt: skip
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    resume = os.environ.get(RESUME_ENV)
    backend = open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region)
    _env_ctx = EnvContext(
        rank=rank,
        world_size=world_size,
        job=job,
        transport=transport,
        resume_step=int(resume) if resume else None,
        generation=int(os.environ.get(GENERATION_ENV, 0)),
        local_rank=int(os.environ.get("LOCAL_RANK", 0)),
        checkpoint_store=CheckpointStore(backend, job.name),
    )
    return _env_ctx


def resolve_ctx(ctx: Any) -> Any:
    """``ctx`` if given, else the supervisor's context from the environment (or None: offline)."""
    return ctx if ctx is not None else from_env()

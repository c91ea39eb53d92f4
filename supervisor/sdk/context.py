"""What the runtime hands to the training function, and the offline fallback.

The runtime calls the user's ``main(config, ctx)`` with a context object (see
``supervisor.runtime.context.WorkerContext``); ``sdk.init(..., ctx=ctx)`` reads these
attributes, all optional: ``rank``, ``world_size``, ``transport`` (a ``Transport``),
``checkpoint_store`` (a ``CheckpointStore``), ``resume_step``, ``job`` (a ``JobSpec``:
``max_steps``, ``telemetry.fingerprint_every``, ``telemetry.canary_every``,
``checkpoint.every_steps``). With no context the probe runs offline: rank and world size come
from ``torch.distributed`` (or ``RANK`` / ``WORLD_SIZE``), and records go to a JSONL trace.
"""

from __future__ import annotations

import os
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

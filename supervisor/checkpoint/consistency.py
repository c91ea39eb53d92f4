"""Resume consistency: what a checkpoint said it held vs what a restore actually produced.

At save time ``summarize`` records cheap facts (batch geometry, LRs, optimizer moments,
scheduler position, data cursor) into the manifest's ``extra``; after a restore ``compare``
checks the live objects against them and against the job's current geometry. Every
difference becomes one event line, because spikes right after a resume start here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

GEOMETRY = ("global_batch_size", "grad_accum_steps", "micro_batch_size")
_SAMPLE = 1024  # elements looked at per state tensor: cheap, yet an all-zero moment cannot hide


def _nonzero_moments(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Per state key (exp_avg, exp_avg_sq, momentum_buffer...): how many tensors have non-zero samples."""
    counts: dict[str, int] = {}
    for state in optimizer.state.values():
        for key, value in state.items():
            if key == "step" or not isinstance(value, torch.Tensor) or value.numel() == 0:
                continue
            flat = value.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // _SAMPLE)]
            counts.setdefault(key, 0)
            counts[key] += int(bool(sample.count_nonzero().item()))
    return counts


def lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(g["lr"]) for g in optimizer.param_groups]


def summarize(optimizer: torch.optim.Optimizer, scheduler: Any, data_state: Mapping[str, Any] | None) -> dict:
    """Facts recorded at save time (rank 0) for the resume check."""
    out: dict[str, Any] = {"lr": lrs(optimizer), "moments": _nonzero_moments(optimizer)}
    if scheduler is not None:
        out["scheduler"] = {
            "last_epoch": int(getattr(scheduler, "last_epoch", -1)),
            "last_lr": [float(x) for x in getattr(scheduler, "_last_lr", []) or []],
        }
    if data_state is not None and "cursor" in data_state:
        out["cursor"] = data_state["cursor"]
    return out


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


def compare(
    saved: Mapping[str, Any],
    *,
    saved_world_size: int,
    world_size: int,
    rank: int = 0,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    data_state: Mapping[str, Any] | None,
    expect: Mapping[str, Any] | None,
) -> list[str]:
    """Event lines for every difference between the checkpoint and the restored / current state.

    ``rank`` picks the saving rank's own summary (each rank has its own cursor and moments).
    """
    events: list[str] = []
    summary = saved.get("rank_summaries", {}).get(str(rank)) or saved.get("summary", {})
    if saved_world_size != world_size:
        events.append(f"world_size changed: checkpoint {saved_world_size}, now {world_size}")
    events += _geometry(saved, expect or {}, summary)
    restored_lr = lrs(optimizer)
    if summary.get("lr") and not all(_close(a, b) for a, b in zip(summary["lr"], restored_lr, strict=False)):
        events.append(f"optimizer lr differs: saved {summary['lr']}, restored {restored_lr}")
    moments = _nonzero_moments(optimizer)
    for key, count in summary.get("moments", {}).items():
        if moments.get(key, 0) < count:
            events.append(
                f"optimizer moment {key!r}: {count} non-zero tensors saved, {moments.get(key, 0)} restored"
            )
    sched = summary.get("scheduler")
    if sched and scheduler is not None:
        if int(scheduler.last_epoch) != sched["last_epoch"]:
            events.append(
                f"scheduler step differs: saved {sched['last_epoch']}, restored {scheduler.last_epoch}"
            )
        last = [float(x) for x in getattr(scheduler, "_last_lr", []) or []]
        if sched["last_lr"] and not all(_close(a, b) for a, b in zip(sched["last_lr"], last, strict=False)):
            events.append(f"scheduler last lr differs: saved {sched['last_lr']}, restored {last}")
    if "cursor" in summary and (data_state is None or data_state.get("cursor") != summary["cursor"]):
        got = None if data_state is None else data_state.get("cursor")
        events.append(f"data cursor differs: saved {summary['cursor']!r}, restored {got!r}")
    return events


def _geometry(saved: Mapping[str, Any], expect: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    events = []
    for key in GEOMETRY:
        before, now = saved.get(key), expect.get(key)
        if before is None or now is None or before == now:
            continue
        events.append(f"{key} changed: checkpoint {before}, now {now}")
        if key == "global_batch_size" and summary.get("lr"):
            # Same LR over a different batch: the per-sample step (LR / batch) changes by before/now.
            factor = float(before) / float(now)
            events.append(
                f"effective learning rate per sample x{factor:.3g} (lr {summary['lr'][0]:.3g} over batch "
                f"{now} instead of {before})"
            )
    return events

"""The loss curve of a drill run, from the records every rank sent (``glue.TRACE_ENV``).

After a rollback, steps are trained again: ``first`` keeps what a step looked like the first
time (the pre-incident band is measured on that), ``last`` what it looks like in the run
that finished (the observation window and the final loss are measured on that).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from supervisor.drills.glue import trace_file


def read_trace(storage: Path, job: str, world_size: int) -> list[dict[str, Any]]:
    """Every record of every rank, in the order each rank sent them (unreadable lines skipped)."""
    out: list[dict[str, Any]] = []
    for rank in range(world_size):
        path = trace_file(storage, job, rank)
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a worker killed mid-write leaves at most one partial line
            if isinstance(rec, dict) and "loss" in rec and "step" in rec:
                out.append(rec)
    return out


def step_losses(
    records: Iterable[dict[str, Any]], world_size: int, which: Literal["first", "last"]
) -> dict[int, float]:
    """Global, token-weighted loss per step over the ranks that all reported it."""
    by_key: dict[tuple[int, int], dict[str, Any]] = {}
    for rec in records:
        key = (int(rec["step"]), int(rec.get("rank", 0)))
        if which == "last" or key not in by_key:
            by_key[key] = rec
    steps: dict[int, list[dict[str, Any]]] = {}
    for (step, _rank), rec in by_key.items():
        steps.setdefault(step, []).append(rec)
    return {step: _global(recs) for step, recs in sorted(steps.items()) if len(recs) == world_size}


def _global(recs: list[dict[str, Any]]) -> float:
    # loss_sum / tokens is the true loss even when the logged `loss` is wrong (logging_bug).
    if all(isinstance(r.get("loss_sum"), int | float) and r.get("tokens") for r in recs):
        return sum(float(r["loss_sum"]) for r in recs) / sum(float(r["tokens"]) for r in recs)
    return sum(float(r["loss"]) for r in recs) / len(recs)


def first_resume(records: Iterable[dict[str, Any]]) -> int | None:
    """The checkpoint step training went back to at its first step regression (any rank), or None."""
    last: dict[int, int] = {}
    for rec in records:
        rank, step = int(rec.get("rank", 0)), int(rec["step"])
        if rank in last and step <= last[rank]:
            return step - 1
        last[rank] = step
    return None


@dataclass(frozen=True)
class Band:
    median: float
    upper: float
    n: int


def band(losses: dict[int, float], before: int, span: int = 60) -> Band | None:
    """The pre-incident band: median + max(3 robust sigmas, 3%) over ``span`` finite steps before ``before``."""
    values = [v for s, v in losses.items() if before - span <= s < before and math.isfinite(v)]
    if len(values) < 10:
        return None
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return Band(med, med + max(3 * 1.4826 * mad, 0.03 * med), len(values))


def window_median(losses: dict[int, float], first: int, last: int) -> float | None:
    values = [v for s, v in losses.items() if first <= s <= last]
    if not values:
        return None
    return statistics.median(values) if all(math.isfinite(v) for v in values) else math.inf


def final_loss(losses: dict[int, float], max_steps: int, span: int = 10) -> float | None:
    """Mean loss of the last ``span`` steps up to ``max_steps`` (None unless all are there)."""
    values = [losses.get(s) for s in range(max_steps - span + 1, max_steps + 1)]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return sum(v for v in values if v is not None) / span

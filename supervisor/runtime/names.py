"""How runtime objects are named on a Ray cluster, so any shell can find them again."""

from __future__ import annotations

#: Ray namespace for every named actor of spike-supervisor.
NAMESPACE = "spike-supervisor"


def supervisor_name(job: str) -> str:
    return f"supervisor:{job}"


def worker_name(job: str, rank: int) -> str:
    return f"worker:{job}:{rank}"


def placement_group_name(job: str, generation: int) -> str:
    return f"pg:{job}:{generation}"

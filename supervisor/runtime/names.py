"""How runtime objects are named on a Ray cluster, so any shell can find them again."""

from __future__ import annotations

from typing import Any

#: Ray namespace for every named actor of spike-supervisor.
NAMESPACE = "spike-supervisor"


def named_actors() -> list[str]:
    """Names of the actors in ``NAMESPACE`` on the cluster this process is connected to."""
    import ray

    entries = ray.util.list_named_actors(all_namespaces=True)
    return [
        e if isinstance(e, str) else e["name"]
        for e in entries
        if isinstance(e, str) or e.get("namespace") == NAMESPACE
    ]


def supervisor_name(job: str) -> str:
    return f"supervisor:{job}"


def placement_group_name(job: str, generation: int) -> str:
    return f"pg:{job}:{generation}"


def priority(niceness: int) -> dict[str, Any]:
    """The ``runtime_env`` that runs an actor or task ``niceness`` above its node's priority
    (job.yaml ``runtime.niceness``). Ray adds ``RAY_worker_niceness`` (default 15) to every worker
    process it starts; the job's own ``runtime_env`` is kept (Ray merges the two, ``env_vars`` by key)."""
    return {"env_vars": {"RAY_worker_niceness": str(niceness)}}

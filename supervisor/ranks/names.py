"""How runtime objects are named on a Ray cluster, so any shell can find them again."""

from __future__ import annotations

import os
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


#: glibc malloc arenas in the supervisor's process. Its actor runs up to 64 threads
#: (``max_concurrency``), and glibc gives threads up to 8 arenas per core, whose fragmentation grows
#: RSS through a long run (bench.scale, 64 emulated ranks x 20,000 steps: 370 -> 447 MB; with 2
#: arenas 329 -> 345 MB, at the same CPU per step). The process is bound by the GIL, not by malloc's
#: locks. A value set in the launching environment is kept.
MALLOC_ARENAS = "2"


def supervisor_env(niceness: int) -> dict[str, Any]:
    """The supervisor actor's ``runtime_env``: its priority (``priority``) and its malloc arenas."""
    env = priority(niceness)
    env["env_vars"]["MALLOC_ARENA_MAX"] = os.environ.get("MALLOC_ARENA_MAX") or MALLOC_ARENAS
    return env


def supervisor_options(job: str, niceness: int) -> dict[str, Any]:
    """The Ray options every supervisor actor of ``job`` is created with (``client.api.launch``; the
    scale bench's). No task events: Ray would record each call (a record batch, a status read, a
    directive poll) and report it to the cluster's control store, several per step and rank, which
    no one reads (the dashboard's task list); the supervisor's own timeline is its incident store."""
    return {"name": supervisor_name(job), "namespace": NAMESPACE, "max_concurrency": 64, "num_cpus": 0,
            "runtime_env": supervisor_env(niceness), "enable_task_events": False}  # fmt: skip


def worker_actor_name(job: str, generation: int, rank: int) -> str:
    return f"worker:{job}:{generation}:{rank}"

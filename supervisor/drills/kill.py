"""The kill-anywhere drills: kill the supervisor (or a worker) when the incident reaches a state.

The supervisor runs as a detached actor with restarts allowed, so killing its process is
what a crash looks like in production: Ray starts it again, and the new incarnation resumes
from its state file, the incident store and the records the workers still hold. A worker is
killed through its actor; the worker group then restarts.

Which state the run is in is read from ``status`` (the incident's current action, the
frozen flag, the step), polled until the point is reached or the deadline passes.
"""

from __future__ import annotations

import time
from typing import Any

from supervisor.drills.scenario import Kill
from supervisor.logging import get_logger

log = get_logger("drills.kill")

#: The incident's current action, for each kill point that is defined by one.
_ACTIONS = {
    "open": ("alert", "freeze"),  # detected, planned, not yet frozen (an alert alone lasts one loop pass)
    "acting": ("snapshot", "block_latest", "replay", "rollback", "apply"),
    "observing": ("observe",),
    "resuming": ("resume",),
}


def reached(kill: Kill, status: dict[str, Any]) -> bool:
    """Whether ``status`` shows the run at the kill point."""
    incident = status.get("incident") or {}
    if kill.at == "before_detection":
        return kill.step is not None and int(status.get("step") or 0) >= kill.step and not incident
    if kill.at == "frozen":
        return bool(status.get("frozen")) and bool(incident)
    if kill.at == "open" and status.get("frozen"):
        return False
    return incident.get("action") in _ACTIONS[kill.at]


def kill_at(handle: Any, job_name: str, kill: Kill, timeout_s: float, poll_s: float = 0.1) -> str | None:
    """Wait for the kill point, then kill; what was killed and when (None: never reached)."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status: dict[str, Any] = ray.get(handle.status.remote(), timeout=10)
        except (RayActorError, GetTimeoutError):
            time.sleep(poll_s)
            continue
        if status.get("terminal"):
            return None
        if reached(kill, status):
            what = _kill(handle, job_name, kill, int(status.get("generation") or 0))
            done = f"{what} killed at {kill.at} (step {status.get('step')}, action {(status.get('incident') or {}).get('action')})"
            log.warning("drill_kill", job=job_name, what=done)
            return done
        time.sleep(poll_s)
    return None


def _kill(handle: Any, job_name: str, kill: Kill, generation: int) -> str:
    import ray

    from supervisor.runtime.group import worker_actor_name
    from supervisor.runtime.names import NAMESPACE

    if kill.target == "supervisor":
        ray.kill(handle, no_restart=False)  # a crash: Ray restarts the actor, which re-attaches
        return "supervisor"
    name = worker_actor_name(job_name, generation, kill.rank)
    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
    return f"worker rank {kill.rank} (generation {generation})"


def wait_through_restarts(handle: Any, timeout_s: float, poll_s: float = 1.0) -> dict[str, Any]:
    """``api.wait`` that outlives a supervisor restart: a call in flight when the process died
    fails, and is made again once Ray has started the supervisor again."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        left = max(1.0, deadline - time.monotonic())
        try:
            last = ray.get(handle.wait.remote(left), timeout=left + 30)
        except (RayActorError, GetTimeoutError):
            time.sleep(poll_s)
            continue
        if last.get("terminal"):
            return last
    return last

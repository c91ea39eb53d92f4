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


#: ``action_began``: the kill lands within this long of the action's start (the effect boundary).
BEGAN_WITHIN_S = 1.0


def reached(kill: Kill, status: dict[str, Any], now: float | None = None) -> bool:
    """Whether ``status`` shows the run at the kill point."""
    incident = status.get("incident") or {}
    if kill.at == "action_began":
        began = incident.get("action_began")
        now = time.time() if now is None else now
        return incident.get("action") == kill.action and began is not None and now - began < BEGAN_WITHIN_S
    if kill.at == "before_detection":
        return kill.step is not None and int(status.get("step") or 0) >= kill.step and not incident
    if kill.at == "frozen":
        return bool(status.get("frozen")) and bool(incident)
    if kill.at == "open" and status.get("frozen"):
        return False
    return incident.get("action") in _ACTIONS[kill.at]


def kill_at(
    handle: Any, job: Any, kill: Kill, timeout_s: float, poll_s: float = 0.05
) -> tuple[str | None, Any]:
    """Wait for the kill point, then kill; (what was killed and when -- None: never reached -- and
    the supervisor to follow from then on: in ``foreground`` mode a new one attached to the job)."""
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
            return None, handle
        if reached(kill, status):
            time.sleep(kill.delay_s)
            what = _kill(handle, job.name, kill, int(status.get("generation") or 0))
            where = kill.at if kill.action is None else f"{kill.at} {kill.action}"
            done = (f"{what} killed at {where}{f' + {kill.delay_s:g}s' if kill.delay_s else ''} "
                    f"(step {status.get('step')}, action {(status.get('incident') or {}).get('action')}, "
                    f"{kill.mode})")  # fmt: skip
            log.warning("drill_kill", job=job.name, what=done)
            if kill.target == "supervisor" and kill.mode == "foreground":
                from supervisor.client import api

                handle = _attach_again(api, job)
            return done, handle
        time.sleep(poll_s)
    return None, handle


def _attach_again(api: Any, job: Any, timeout_s: float = 60.0) -> Any:
    """``supervisor launch --attach JOB`` after a foreground supervisor died: the dead actor's name
    is free once Ray has noticed its death."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return api.attach(job)
        except Exception:  # the old actor is still being torn down: its name is taken
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _kill(handle: Any, job_name: str, kill: Kill, generation: int) -> str:
    import ray

    from supervisor.ranks.names import NAMESPACE, worker_actor_name

    if kill.target == "supervisor":
        # A crash: Ray restarts a detached supervisor, which re-attaches; a foreground one stays dead.
        ray.kill(handle, no_restart=kill.mode == "foreground")
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

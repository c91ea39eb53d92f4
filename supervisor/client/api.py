"""Launch (or attach to), inspect and stop a supervised job on Ray: what the CLI calls."""

from __future__ import annotations

from typing import Any, cast

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from supervisor.client.cluster import head_node_id
from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.errors import EXIT_BAD_INPUT, RuntimeBackendError
from supervisor.ranks.names import NAMESPACE, named_actors, supervisor_name, supervisor_options
from supervisor.runtime.actor import SupervisorActor

RemoteSupervisor = ray.remote(SupervisorActor)


def launch(
    job: JobSpec, settings: RuntimeSettings | None = None, *, detached: bool = False, attach: bool = False
) -> Any:
    """A supervisor actor for a new run of ``job``, which launches the worker group; with ``attach``
    one that resumes ``job`` from its incident store and state file."""
    try:
        existing = ray.get_actor(supervisor_name(job.name), namespace=NAMESPACE)
    except ValueError:
        existing = None
    if existing is not None:
        try:
            ray.get(existing.status.remote(), timeout=10)
            raise RuntimeBackendError(
                f"a supervisor for job {job.name!r} is already running; `supervisor status {job.name}` shows it"
            )
        except (RayActorError, GetTimeoutError):
            ray.kill(existing, no_restart=True)
    settings = settings or RuntimeSettings.model_validate({})
    # The supervisor lives on the head node (the launching node on a cluster without a live head),
    # also through `ray://`: it needs no resources, and it must not share the fate of a worker
    # node. A hard constraint: a soft one let Ray place it on a worker node, and a driver on a
    # machine with two raylets may be attached to either, so the launching node alone is no
    # guarantee. The head holds the cluster's control store, so its loss ends the job anyway.
    node = head_node_id() or ray.get_runtime_context().get_node_id()
    here = NodeAffinitySchedulingStrategy(node, soft=False)
    return RemoteSupervisor.options(
        **supervisor_options(job.name, settings.niceness),
        lifetime="detached" if detached else None,
        max_restarts=3 if detached else 0,
        scheduling_strategy=here,
    ).remote(job.model_dump(mode="json"), settings.model_dump(), attach)


def attach(job: JobSpec, settings: RuntimeSettings | None = None, *, detached: bool = False) -> Any:
    """A supervisor that resumes ``job`` from its incident store and state file."""
    return launch(job, settings, detached=detached, attach=True)


def find(job_name: str) -> Any:
    try:
        return ray.get_actor(supervisor_name(job_name), namespace=NAMESPACE)
    except ValueError:
        raise RuntimeBackendError(  # a job name a person gave: bad input (exit 2), not a failure
            f"no supervisor running for job {job_name!r}", exit_code=EXIT_BAD_INPUT
        ) from None


def list_jobs() -> list[str]:
    return sorted(name.split(":", 1)[1] for name in named_actors() if name.startswith("supervisor:"))


def status(handle: Any, timeout_s: float = 10.0) -> dict[str, Any]:
    try:
        return cast(dict[str, Any], ray.get(handle.status.remote(), timeout=timeout_s))
    except (RayActorError, GetTimeoutError) as exc:
        raise RuntimeBackendError(f"the supervisor does not answer: {type(exc).__name__}") from None


def ended_status(job: JobSpec) -> dict[str, Any] | None:
    """The job's outcome as its supervisor left it on disk, when the state file says the job ended;
    None otherwise (the supervisor died with the job still running: that is a failure, exit 3)."""
    from supervisor.runtime.state import RuntimeState, runtime_state_path

    try:
        st = RuntimeState.load(runtime_state_path(job))
    except (OSError, ValueError):  # an unreadable state file proves nothing about the outcome
        return None
    if st is None or not st.phase.is_terminal:
        return None
    return {"job": job.name, "phase": st.phase.value, "terminal": True, "exit_code": st.ended_with(),
            "reason": st.reason, "step": max(st.watermark, 0), "max_steps": job.max_steps,
            "downtime_s": round(st.downtime_s, 2), "incident": None, "from_state_file": True}  # fmt: skip


def follow(handle: Any, job: JobSpec, show: Any) -> dict[str, Any]:
    """``show(poll)`` until the job ends; returns its last status. A supervisor removed once its job
    had ended (``supervisor stop`` from another shell waits for the end, then kills it) can no
    longer answer: the outcome is then read from its state file, so a stopped job exits 1, not 3."""
    try:
        return cast(dict[str, Any], show(lambda: status(handle, timeout_s=60)))
    except RuntimeBackendError:
        ended = ended_status(job)
        if ended is None:
            raise
        return ended


def stop(handle: Any, reason: str = "stop requested") -> None:
    ray.get(handle.stop.remote(reason), timeout=30)


def wait(handle: Any, timeout_s: float | None = None) -> dict[str, Any]:
    ref = handle.wait.remote(timeout_s)
    return cast(dict[str, Any], ray.get(ref, timeout=None if timeout_s is None else timeout_s + 30))


def job_of_running(job_name: str) -> JobSpec | None:
    """The spec of ``job_name`` as its workers (or its supervisor) hold it on the cluster."""
    from supervisor.runtime.group import WorkerGroup

    for name in [supervisor_name(job_name), *WorkerGroup.names(job_name)]:
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            return JobSpec.model_validate(ray.get(actor.spec.remote(), timeout=10))
        except (ValueError, RayActorError, GetTimeoutError):
            continue
    return None

"""Open the job's stores from job.yaml: checkpoints (storage backend) and incidents (SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.config.job import JobSpec


def open_checkpoint_store(job: JobSpec) -> Any:
    """The job's ``CheckpointStore`` on its storage backend (local directory or S3)."""
    from supervisor.checkpoint.store import CheckpointStore
    from supervisor.storage import open_backend

    backend = open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region)
    return CheckpointStore(backend, job.name)


def incident_db_path(job: JobSpec) -> Path:
    """Where the job's incident store lives (job.yaml ``incidents.db`` or the documented default)."""
    if job.incidents.db:
        return Path(job.incidents.db).expanduser()
    if job.storage.is_s3:
        return Path("~/.local/state/spike-supervisor/incidents.sqlite").expanduser()
    return Path(job.storage.path).expanduser() / "incidents.sqlite"


def runtime_state_path(job: JobSpec) -> Path:
    """The supervisor's own small state file (directive log, analyzer state, plan cursor)."""
    return incident_db_path(job).parent / "runtime" / f"{job.name}.json"


def open_incident_store(job: JobSpec, export_interval_s: float | None = None) -> Any:
    """The job's incident store; if its file is lost under the supervisor it is rebuilt from the
    incidents exported to the job's storage (``incidents.export.rebuild_from_exports``)."""
    from supervisor.incidents import IncidentStore
    from supervisor.incidents.export import IncidentExporter, rebuild_from_exports
    from supervisor.storage import open_backend

    path = incident_db_path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    backend = open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region)
    store = IncidentStore(path, rebuild=lambda store: rebuild_from_exports(store, backend, job.name))
    # Every committed change is exported off the caller's thread (the record at once, the series
    # at most every export_interval_s): ``store.exporter.flush()`` waits for them. The supervisor
    # (``export_interval_s`` given) also re-exports what a killed predecessor may not have.
    store.exporter = IncidentExporter(store, backend, job.name, full_interval_s=export_interval_s or 2.0)
    if export_interval_s is not None:
        store.exporter.mark_all()
    return store


def pick_rollback_target(
    store: Any, *, max_step: int, min_mark: str, world_size: int
) -> tuple[int, dict[str, Any]]:
    """The rollback target at or before ``max_step``, re-verified (deep; one that fails is
    quarantined by the store). ``min_mark="verified"``: a verified one when no healthy one qualifies."""
    from supervisor.checkpoint import select_rollback_target, verify
    from supervisor.core.model import HealthMark
    from supervisor.errors import CheckpointError

    if store is None:
        raise CheckpointError("the job has no checkpoint store")
    try:
        target = select_rollback_target(store, max_step, 0, expected_world_size=world_size)
        return target.step, {"ok": True, "health": "healthy", "rejected": [list(r) for r in target.rejected]}
    except CheckpointError:
        if min_mark != "verified":
            raise
    for manifest in sorted(store.manifests(), key=lambda m: m.step, reverse=True):
        if manifest.step <= max_step and manifest.health == HealthMark.VERIFIED:
            result = verify(store, manifest.step, deep=True, expected_world_size=world_size, by="rollback")
            if result.ok:
                return manifest.step, {"ok": True, "health": "verified", "rejected": []}
    raise CheckpointError(f"no healthy or verified checkpoint at or before step {max_step}", source=store.uri)


def restart_step(checkpoints: Any, world_size: int) -> int | None:
    """The step a worker-group restart resumes from (``select_restart_target``), or None."""
    from supervisor.checkpoint.lifecycle import select_restart_target

    if checkpoints is None:
        return None
    target = select_restart_target(checkpoints, expected_world_size=world_size, verify_unverified=False)
    return None if target is None else int(target.step)

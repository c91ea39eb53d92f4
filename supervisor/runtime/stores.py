"""Open the job's stores from job.yaml: checkpoints (storage backend) and incidents (SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from supervisor.config.job import JobSpec


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

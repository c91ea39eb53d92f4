"""Where the incident database lives.

Order: an explicit path (``--db``) > ``incidents.db`` in job.yaml > ``<storage>/incidents.sqlite``
for local storage > ``~/.local/state/spike-supervisor/incidents.sqlite`` when storage is S3
(SQLite cannot live in a bucket; the JSON exports next to the checkpoints are the durable copy).
"""

from __future__ import annotations

from pathlib import Path

from supervisor.config.job import JobSpec
from supervisor.incidents.store import IncidentStore

DB_NAME = "incidents.sqlite"
STATE_DIR = Path("~/.local/state/spike-supervisor")


def db_path_for_job(job: JobSpec) -> Path:
    if job.incidents.db:
        return Path(job.incidents.db).expanduser()
    if job.storage.is_s3:
        return (STATE_DIR / DB_NAME).expanduser()
    return Path(job.storage.path).expanduser() / DB_NAME


def open_for_job(job: JobSpec) -> IncidentStore:
    """The job's incident store (created and migrated when needed)."""
    return IncidentStore(db_path_for_job(job))


def open_incident_store(job: JobSpec, export_interval_s: float | None = None) -> IncidentStore:
    """The job's incident store as the supervisor and the CLI's outcome read it: if its file is lost
    under the supervisor it is rebuilt from the incidents exported to the job's storage
    (``export.rebuild_from_exports``)."""
    from supervisor.incidents.export import IncidentExporter, rebuild_from_exports
    from supervisor.storage import open_backend

    path = db_path_for_job(job)
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

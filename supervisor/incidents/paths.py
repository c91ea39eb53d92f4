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

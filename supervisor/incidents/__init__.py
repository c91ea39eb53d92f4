"""Incident records: the SQLite store, the postmortem built from its timeline, reports and export.

Heavier pieces are imported from their modules: ``supervisor.incidents.postmortem``
(``build_postmortem``), ``supervisor.incidents.render`` (``render_report``; matplotlib is only
loaded for HTML) and ``supervisor.incidents.export`` (``export_incident``, needs boto3 for S3).
"""

from supervisor.incidents.models import Artifact, Event, Incident
from supervisor.incidents.paths import db_path_for_job, open_for_job
from supervisor.incidents.states import TRANSITIONS, EventKind, EventStatus, IncidentState
from supervisor.incidents.store import IncidentStore

__all__ = [
    "TRANSITIONS",
    "Artifact",
    "Event",
    "EventKind",
    "EventStatus",
    "Incident",
    "IncidentState",
    "IncidentStore",
    "db_path_for_job",
    "open_for_job",
]

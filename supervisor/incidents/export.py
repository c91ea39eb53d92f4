"""Incidents as JSON next to the job's checkpoints, so they outlive the supervisor's machine.

``<job>/incidents/<id>.json`` in the job's storage (local directory or S3) holds the
postmortem JSON plus the raw telemetry window: enough to re-render every report, or to
rebuild a lost database with ``import_incident``.
"""

from __future__ import annotations

import json
from typing import Any

from supervisor.errors import IncidentStoreError, SupervisorError
from supervisor.incidents.models import strict
from supervisor.incidents.postmortem import build_postmortem
from supervisor.incidents.store import IncidentStore
from supervisor.logging import get_logger
from supervisor.storage.base import Backend, join_key

EXPORT_FORMAT = "spike-supervisor.incident/1"


def export_key(job: str, incident_id: int) -> str:
    return join_key(job, "incidents", f"{incident_id}.json")


def export_document(store: IncidentStore, incident_id: int) -> dict[str, Any]:
    pm = build_postmortem(store, incident_id)
    return {
        "format": EXPORT_FORMAT,
        **pm.to_json(),
        "series": strict(pm.series),
        "replayed": strict(pm.replayed),
    }


def export_incident(store: IncidentStore, incident_id: int, backend: Backend, job: str) -> str:
    """Write (or replace, atomically) the incident's export; returns its key. Call after every transition."""
    doc = export_document(store, incident_id)
    key = export_key(job, incident_id)
    backend.put_bytes(key, json.dumps(doc, indent=1, allow_nan=False).encode("utf-8"))
    get_logger("incidents").info(
        "incident_exported", incident=incident_id, job=job, uri=f"{backend.uri}/{key}"
    )
    return key


def read_export(backend: Backend, job: str, incident_id: int) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(backend.get_bytes(export_key(job, incident_id)))
    if doc.get("format") != EXPORT_FORMAT:
        raise IncidentStoreError(f"not an incident export (format {doc.get('format')!r})", source=backend.uri)
    return doc


def import_incident(store: IncidentStore, doc: dict[str, Any], *, keep_ids: bool = False) -> int:
    """Recreate an exported incident in ``store`` under a new id (or its own, ``keep_ids``): state,
    diagnosis, the whole timeline (times, statuses, results), the telemetry window and artifact references."""
    with store.transaction():
        new_id = store.restore(doc["incident"], doc["timeline"], keep_ids=keep_ids)
        store.attach_series(new_id, doc.get("series") or [])
        for replay in sorted({int(r["replay"]) for r in doc.get("replayed") or []}):
            store.attach_series(new_id, [r for r in doc["replayed"] if r["replay"] == replay], replay=replay)
        for art in doc.get("artifacts") or []:
            store.add_artifact(new_id, art["kind"], art["ref"], art.get("meta"))
    return new_id


def rebuild_from_exports(store: IncidentStore, backend: Backend, job: str) -> list[int]:
    """Re-import every exported incident of ``job`` into ``store`` under its own ids; returns them.

    An export that cannot be read is logged and skipped: what is readable comes back."""
    log = get_logger("incidents", job=job)
    prefix = join_key(job, "incidents") + "/"
    found = []
    for info in backend.list(prefix):
        name = info.key[len(prefix) :]
        if name.endswith(".json") and name[:-5].isdigit():
            found.append(int(name[:-5]))
    restored = []
    for incident_id in sorted(found):
        try:
            doc = read_export(backend, job, incident_id)
            restored.append(import_incident(store, doc, keep_ids=True))
        except (SupervisorError, ValueError, KeyError, TypeError) as exc:
            log.error("incident_export_unreadable", incident=incident_id, error=str(exc)[:300])
    return restored

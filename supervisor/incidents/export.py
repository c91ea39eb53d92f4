"""Incidents as JSON next to the job's checkpoints, so they outlive the supervisor's machine.

``<job>/incidents/<id>.json`` in the job's storage (local directory or S3) holds the
postmortem JSON plus the raw telemetry window: enough to re-render every report, or to
rebuild a lost database with ``import_incident``.

``<job>/incidents/<id>.record.json`` holds the record alone (the incident's row, its timeline,
its artifacts): a few KB whatever the number of ranks. ``IncidentExporter`` writes it after
every committed change, and the full export (whose series grows with the ranks, ~200 KB per
rank) at most every ``full_interval_s``, both on its own thread: the control loop never waits
for a write. A rebuild takes the newer of the two records, and the series from the full export.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
import weakref
from typing import Any

from supervisor.errors import IncidentStoreError, SupervisorError
from supervisor.incidents.models import strict
from supervisor.incidents.postmortem import build_postmortem
from supervisor.incidents.store import IncidentStore
from supervisor.logging import get_logger
from supervisor.storage.base import Backend, ObjectNotFound, join_key
from supervisor.storage.local import LocalBackend

EXPORT_FORMAT = "spike-supervisor.incident/1"
RECORD_FORMAT = "spike-supervisor.incident-record/1"
MAX_EXPORT_BYTES = 256 << 20
"""Largest export a rebuild reads (a 16-rank incident's is ~3 MB)."""


def export_key(job: str, incident_id: int) -> str:
    return join_key(job, "incidents", f"{incident_id}.json")


def export_document(store: IncidentStore, incident_id: int) -> dict[str, Any]:
    pm = build_postmortem(store, incident_id)
    return {"format": EXPORT_FORMAT, **pm.to_json(), "series": pm.series, "replayed": pm.replayed}


def encode_export(doc: dict[str, Any]) -> bytes:
    """The export as JSON for other programs (``strict``: no NaN or Infinity literals).

    Compact, through json's C encoder: an indented dump runs its Python encoder, ~2.7x the CPU, and a
    1,024-rank export is tens of MB, written again after each change beside the control loop. The
    series rarely holds a non-finite value, so the document is walked by ``strict`` only when the
    plain dump finds one."""
    try:
        text = json.dumps(doc, allow_nan=False, separators=(",", ":"))
    except ValueError:  # a NaN or an Infinity somewhere
        text = json.dumps(strict(doc), allow_nan=False, separators=(",", ":"))
    return text.encode("utf-8")


def export_incident(store: IncidentStore, incident_id: int, backend: Backend, job: str) -> str:
    """Write (or replace, atomically) the incident's export; returns its key. Call after every transition."""
    key = export_key(job, incident_id)
    backend.put_bytes(key, encode_export(export_document(store, incident_id)))
    get_logger("incidents").info(
        "incident_exported", incident=incident_id, job=job, uri=f"{backend.uri}/{key}"
    )
    return key


def record_key(job: str, incident_id: int) -> str:
    return join_key(job, "incidents", f"{incident_id}.record.json")


def record_document(store: IncidentStore, incident_id: int) -> dict[str, Any]:
    """The incident's row, timeline and artifacts: what a rebuild needs beside the series."""
    return strict(
        {
            "format": RECORD_FORMAT,
            "incident": store.get(incident_id).to_json(),
            "timeline": [e.to_json() for e in store.timeline(incident_id)],
            "artifacts": [a.to_json() for a in store.artifacts(incident_id)],
        }
    )


def export_record(store: IncidentStore, incident_id: int, backend: Backend, job: str) -> str:
    """Write (or replace, atomically) the incident's small record export; returns its key."""
    key = record_key(job, incident_id)
    backend.put_bytes(key, json.dumps(record_document(store, incident_id), allow_nan=False).encode("utf-8"))
    return key


def _read_doc(backend: Backend, key: str, fmt: str) -> dict[str, Any]:
    where = f"{backend.uri.rstrip('/')}/{key}"
    info = backend.stat(key) if isinstance(backend, LocalBackend) else None  # a stat is cheap here
    if info is not None and info.size > MAX_EXPORT_BYTES:
        raise IncidentStoreError(f"larger than {MAX_EXPORT_BYTES:,} bytes", source=where)
    data = backend.get_bytes(key)
    if len(data) > MAX_EXPORT_BYTES:
        raise IncidentStoreError(f"larger than {MAX_EXPORT_BYTES:,} bytes", source=where)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise IncidentStoreError(f"not an incident export (malformed JSON: {why})", source=where) from None
    if not isinstance(doc, dict) or doc.get("format") != fmt:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise IncidentStoreError(f"not an incident export (format {found!r})", source=where, field="format")
    return doc


def read_export(backend: Backend, job: str, incident_id: int) -> dict[str, Any]:
    return _read_doc(backend, export_key(job, incident_id), EXPORT_FORMAT)


def read_newest(backend: Backend, job: str, incident_id: int) -> dict[str, Any]:
    """The full export with the incident's record replaced by the record export when that one is
    newer (written after the last full export); either one alone when the other is missing."""
    log = get_logger("incidents", job=job)
    docs = []
    for read in (read_export, _read_record):
        try:
            docs.append(read(backend, job, incident_id))
        except ObjectNotFound:
            continue
        except SupervisorError as exc:
            log.error("incident_export_unreadable", incident=incident_id, error=exc.one_line())
    if not docs:
        raise IncidentStoreError(f"no readable export of incident {incident_id}", source=backend.uri)
    empty: dict[str, Any] = {"series": [], "replayed": []}
    full = next((d for d in docs if d["format"] == EXPORT_FORMAT), empty)
    newest = max(docs, key=lambda d: (float(d["incident"]["updated_at"]), len(d["timeline"])))
    return {**full, "incident": newest["incident"], "timeline": newest["timeline"],
            "artifacts": newest.get("artifacts") or full.get("artifacts") or []}  # fmt: skip


def _read_record(backend: Backend, job: str, incident_id: int) -> dict[str, Any]:
    return _read_doc(backend, record_key(job, incident_id), RECORD_FORMAT)


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
        name = info.key[len(prefix) :].removesuffix(".json").removesuffix(".record")
        if name.isdigit() and len(name) < 19:
            found.append(int(name))
    restored = []
    for incident_id in sorted(set(found)):
        try:
            doc = read_newest(backend, job, incident_id)
            restored.append(import_incident(store, doc, keep_ids=True))
        except (SupervisorError, ValueError, KeyError, TypeError) as exc:
            log.error("incident_export_unreadable", incident=incident_id, error=str(exc)[:300])
    return restored


_OPEN: weakref.WeakSet[IncidentExporter] = weakref.WeakSet()


def close_all(timeout_s: float = 10.0) -> None:
    """Flush and stop every exporter of this process (its end, or a test session's)."""
    for exporter in list(_OPEN):
        exporter.close(timeout_s)


class IncidentExporter:
    """Copies every committed change of ``store`` to the job's storage on its own thread.

    Hooked to ``store.on_commit``: a change marks its incident; the thread writes the record
    export at once (a few KB) and the full export (with the series) at most every
    ``full_interval_s`` per incident -- and never more than a tenth of a core: after a full export
    that took t seconds of CPU (at 1,024 ranks the series make it large) the next waits at least
    ``9 t`` -- and always before ``flush`` returns. A failed write is
    logged and retried a second later: storage trouble never stops supervision, and nothing
    here runs on the caller's thread but the marking.
    """

    def __init__(
        self, store: IncidentStore, backend: Backend, job: str, *, full_interval_s: float = 2.0
    ) -> None:
        self.store, self.backend, self.job = store, backend, job
        self.full_interval_s = full_interval_s
        self.written = 0  # exports written (records and full), for tests and benches
        self._records: set[int] = set()
        self._full: set[int] = set()
        self._last_full: dict[int, float] = {}
        self._cost: dict[int, float] = {}  # CPU seconds of each incident's last full export
        self._urgent = False
        self._busy = False
        self._closed = False
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._log = get_logger("incidents", job=job)
        store.on_commit = self.changed
        # Stopped before the interpreter tears down: a daemon thread still inside SQLite or boto3
        # while modules are freed can crash the process at exit.
        atexit.register(self.close, 10.0)
        _OPEN.add(self)

    def changed(self, records: set[int], series: set[int]) -> None:
        """Mark incidents whose record (or series) changed; returns at once."""
        with self._cv:
            self._records |= records | series
            self._full |= records | series
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="incident-export", daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def mark_all(self) -> None:
        """Mark every incident of the job (a restarted supervisor: its predecessor may have died
        before its last changes were exported)."""
        ids = {i.id for i in self.store.list_incidents(job=self.job)}
        if ids:
            self.changed(ids, set())

    def flush(self, timeout_s: float = 60.0) -> bool:
        """Write everything marked so far, full exports included; False when it did not finish in time."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._urgent = True
            self._cv.notify_all()
            while self._records or self._full or self._busy:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return not (self._records or self._full or self._busy)
                self._cv.wait(min(left, 0.5))
            self._urgent = False
            return True

    def close(self, timeout_s: float = 60.0) -> None:
        """Flush, then stop the thread (joined: no thread touches SQLite or storage after this)."""
        self.flush(timeout_s)
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
        if self.store.on_commit == self.changed:
            self.store.on_commit = None
        atexit.unregister(self.close)
        _OPEN.discard(self)

    def _due(self) -> tuple[list[int], list[int]]:
        now = time.monotonic()
        records = sorted(self._records)
        full = [
            i
            for i in sorted(self._full)
            if self._urgent or now - self._last_full.get(i, -1e9) >= self._gap(i)
        ]
        self._records -= set(records)
        self._full -= set(full)
        return records, full

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._records and not (self._full and self._full_due()):
                    self._cv.wait(self._wait_s())
                if self._closed and not self._records and not self._full:
                    return
                records, full = self._due()
                self._busy = True
            failed = self._write(records, full)
            with self._cv:
                self._busy = False
                if failed:  # marked again, retried after a pause
                    self._records |= failed[0]
                    self._full |= failed[1]
                self._cv.notify_all()
            if failed and not self._closed:
                time.sleep(1.0)
            elif failed:
                return

    def _full_due(self) -> bool:
        return self._urgent or any(
            time.monotonic() - self._last_full.get(i, -1e9) >= self._gap(i) for i in self._full
        )

    def _gap(self, incident_id: int) -> float:
        """Seconds between two full exports of an incident: the interval, or 9x its last one's CPU."""
        return max(self.full_interval_s, 9.0 * self._cost.get(incident_id, 0.0))

    def _wait_s(self) -> float | None:
        if not self._full:
            return None
        due = min(self._last_full.get(i, -1e9) + self._gap(i) for i in self._full)
        return max(0.01, due - time.monotonic())

    def _write(self, records: list[int], full: list[int]) -> tuple[set[int], set[int]] | None:
        bad_records, bad_full = set(), set()
        for incident_id in records:
            try:
                export_record(self.store, incident_id, self.backend, self.job)
                self.written += 1
            except Exception as exc:  # noqa: BLE001 -- a failed export must not end this thread: retried
                self._log.warning("incident_export_failed", incident=incident_id, error=_why(exc))
                bad_records.add(incident_id)
        for incident_id in full:
            try:
                cpu = time.thread_time()
                export_incident(self.store, incident_id, self.backend, self.job)
                self._cost[incident_id] = time.thread_time() - cpu
                self._last_full[incident_id] = time.monotonic()
                self.written += 1
            except Exception as exc:  # noqa: BLE001 -- as above
                self._log.warning("incident_export_failed", incident=incident_id, error=_why(exc))
                bad_full.add(incident_id)
        return (bad_records, bad_full) if bad_records or bad_full else None


def _why(exc: Exception) -> str:
    return exc.one_line() if isinstance(exc, SupervisorError) else f"{type(exc).__name__}: {str(exc)[:300]}"

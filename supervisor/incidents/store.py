"""The incident store: SQLite (WAL), one connection per thread and process, append-only timeline.

Every public write is one transaction; ``with store.transaction():`` groups several into
one (see ``db.py`` for locking). Readers (the CLI) never block the supervisor writing.

Write-ahead rule for the runtime: ``begin()`` an action's event (``pending``) and let it
commit *before* executing the action, then ``finish()`` it. After a restart,
``pending_events()`` shows what was interrupted and ``last_done()`` / ``event_for_action()``
what must not be repeated.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from supervisor.core.model import Diagnosis
from supervisor.errors import IncidentStoreError
from supervisor.incidents import scrub
from supervisor.incidents.db import Database, DatabaseLost
from supervisor.incidents.models import Artifact, Event, Incident, dumps, loads
from supervisor.incidents.states import (
    REOPEN,
    TRANSITIONS,
    EventKind,
    EventStatus,
    IncidentState,
    can_transition,
    parse_enum,
)
from supervisor.logging import get_logger

_AGGREGATE_RANK = -1
T = TypeVar("T")


class IncidentStore:
    """Incidents of any number of jobs in one SQLite file (safe across threads and processes).

    ``read_only=True`` (the review commands): never creates, migrates or writes the file.
    ``rebuild``: called with this store when its file was lost under it (vanished, replaced,
    truncated; see ``db.py``) after the remnants were moved aside and a fresh file created;
    it re-imports the exported incidents (``export.rebuild_from_exports``) and returns their
    ids. Without it, a lost file fails every use with exit code 3.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
        rebuild: Callable[[IncidentStore], list[int]] | None = None,
    ):
        self.path = Path(path)
        self._clock = clock
        self._log = get_logger("incidents", db=str(self.path))
        self._rebuild = rebuild
        self.rebuilt: list[dict[str, Any]] = []  # one entry per loss: what happened and what came back
        self.exporter: Any = None  # an ``export.IncidentExporter`` when the runtime attached one
        self.on_commit: Callable[[set[int], set[int]], None] | None = None
        """Called after each committed write with the ids of the incidents whose record changed and
        of those whose series changed (``export.IncidentExporter`` copies them to storage)."""
        self._touched = threading.local()
        fresh = not read_only and (not self.path.exists() or self.path.stat().st_size == 0)
        self._db = Database(
            self.path,
            busy_timeout_s,
            read_only=read_only,
            on_lost=self._on_lost if rebuild else None,
            on_end=self._ended,
        )
        if fresh and rebuild is not None:
            # A new (or emptied) file beside exports of the job: they come back, under their ids.
            ids = rebuild(self)
            if ids:
                self.rebuilt.append(
                    {"problem": "the database was new or empty", "remnants": None, "restored": ids}
                )
                self._log.warning(
                    "incident_database_rebuilt", restored=ids, count=len(ids), why="new or empty file"
                )

    def _touch(self, incident_id: int, *, series: bool = False) -> None:
        local = self._touched
        if not hasattr(local, "records"):
            local.records, local.series = set(), set()
        (local.series if series else local.records).add(incident_id)

    def _ended(self, committed: bool) -> None:
        local = self._touched
        records: set[int] = getattr(local, "records", set())
        series: set[int] = getattr(local, "series", set())
        local.records, local.series = set(), set()
        if committed and (records or series) and self.on_commit is not None:
            self.on_commit(records, series)

    def _on_lost(self, lost: DatabaseLost) -> None:
        """The file went away under us: say so loudly, keep the remnants, rebuild from the exports."""
        assert self._rebuild is not None
        aside = self.path.with_name(f"{self.path.name}.lost-{int(self._clock())}")
        self._log.error("incident_database_lost", problem=lost.message, remnants=str(aside))
        self._db.recreate(aside)
        ids = self._rebuild(self)
        self.rebuilt.append({"problem": lost.message, "remnants": str(aside), "restored": ids})
        self._log.error("incident_database_rebuilt", restored=ids, count=len(ids), remnants=str(aside))

    def check_intact(self) -> None:
        """Check the file now (the supervisor's loop also checks on every use, at most twice a second)."""
        self._db.check_intact(force=True)

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction; the store's writes inside it join it (all or nothing)."""
        return self._db.transaction()

    def _read(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        return self._db.read(sql, args)

    # A row someone wrote by hand (malformed or 100k-deep JSON, an unknown state or kind) is one
    # line naming the file, the table and the row, never a traceback.
    def _incident(self, row: sqlite3.Row) -> Incident:
        def make(r: sqlite3.Row) -> Incident:
            incident = Incident.from_row(r)
            try:
                _ = incident.diagnosis  # a diagnosis that is no longer one is dropped, and said so
            except (ValueError, TypeError, KeyError, AttributeError):
                self._log.warning("unreadable_diagnosis_ignored", incident=incident.id, db=str(self.path))
                return dataclasses.replace(incident, diagnosis_json=None)
            return incident

        return self._decode(make, row, "incidents")

    def _event(self, row: sqlite3.Row) -> Event:
        return self._decode(Event.from_row, row, "events")

    def _artifact(self, row: sqlite3.Row) -> Artifact:
        return self._decode(Artifact.from_row, row, "artifacts")

    def _decode(self, make: Callable[[sqlite3.Row], T], row: sqlite3.Row, table: str, key: str = "id") -> T:
        try:
            return make(row)
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            why = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            raise IncidentStoreError(
                f"unreadable row ({why})", source=str(self.path), field=f"{table} {key} {row[key]}"
            ) from None

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        self._db.close()

    def __enter__(self) -> IncidentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- incidents ----------------------------------------------------------------------------

    def open_incident(
        self,
        job: str,
        diagnosis: Diagnosis | dict[str, Any],
        *,
        actor: str = "detector",
        step: int | None = None,
        key: int | None = None,
        payload: dict[str, Any] | None = None,
    ) -> Incident:
        """Create an ``open`` incident and its ``detected`` event in one transaction."""
        diag = diagnosis.to_json() if isinstance(diagnosis, Diagnosis) else dict(diagnosis)
        now = self._clock()
        detected = step if step is not None else diag.get("detected_step")
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO incidents (job, state, opened_at, updated_at, analyzer_key) VALUES (?, ?, ?, ?, ?)",
                (job, IncidentState.OPEN.value, now, now, key),
            )
            incident_id = int(cur.lastrowid or 0)
            self._set_diagnosis(conn, incident_id, diag, now)
            body = {"diagnosis": diag, **(payload or {})}
            self._insert_event(conn, incident_id, EventKind.DETECTED, actor, detected, body, EventStatus.DONE)
        self._log.info(
            "incident_opened", incident=incident_id, job=job, step=detected, phenotype=diag.get("phenotype")
        )
        return self.get(incident_id)

    def get(self, incident_id: int) -> Incident:
        rows = self._read("SELECT * FROM incidents WHERE id = ?", (incident_id,))
        if not rows:
            raise IncidentStoreError(f"no incident {incident_id}", source=str(self.path))
        return self._incident(rows[0])

    def find(self, job: str, key: int) -> Incident | None:
        """The newest incident of ``job`` opened for the analyzer's incident ``key``."""
        rows = self._read(
            "SELECT * FROM incidents WHERE job = ? AND analyzer_key = ? ORDER BY id DESC LIMIT 1", (job, key)
        )
        return self._incident(rows[0]) if rows else None

    def list_incidents(
        self, *, job: str | None = None, state: IncidentState | str | None = None, limit: int | None = None
    ) -> list[Incident]:
        sql, args = "SELECT * FROM incidents WHERE 1 = 1", list[str]()
        if job is not None:
            sql, args = sql + " AND job = ?", [*args, job]
        if state is not None:
            sql, args = sql + " AND state = ?", [*args, parse_enum(IncidentState, state, "state").value]
        sql += " ORDER BY id DESC" + (f" LIMIT {int(limit)}" if limit else "")
        return [self._incident(r) for r in self._read(sql, args)]

    def active(self, job: str) -> list[Incident]:
        """Incidents of ``job`` not yet in a terminal state (what a restarted supervisor resumes)."""
        terminal = [s.value for s in IncidentState if s.is_terminal]
        rows = self._read(
            f"SELECT * FROM incidents WHERE job = ? AND state NOT IN ({','.join('?' * len(terminal))}) ORDER BY id",
            (job, *terminal),
        )
        return [self._incident(r) for r in rows]

    def transition(
        self,
        incident_id: int,
        new_state: IncidentState | str,
        reason: str,
        *,
        actor: str,
        step: int | None = None,
    ) -> Incident:
        """Move to ``new_state`` (checked against ``TRANSITIONS``) and record the reason as an event."""
        new = parse_enum(IncidentState, new_state, "incident state")
        with self.transaction() as conn:
            old = self.get(incident_id).state
            if old == new:
                return self.get(incident_id)
            if (old, new) == REOPEN:
                raise IncidentStoreError(
                    f"incident {incident_id}: a resolved incident is reopened with IncidentStore.reopen "
                    "(it records the new detection and the attempt number)",
                    source=str(self.path),
                )
            if not can_transition(old, new):
                valid = ", ".join(sorted(s.value for s in TRANSITIONS[old])) or "none (terminal)"
                raise IncidentStoreError(
                    f"incident {incident_id}: cannot go from {old.value} to {new.value}; valid: {valid}",
                    source=str(self.path),
                )
            now = self._clock()
            conn.execute(
                "UPDATE incidents SET state = ?, updated_at = ?, closed_at = ? WHERE id = ?",
                (new.value, now, now if new.is_terminal else None, incident_id),
            )
            body = {"from": old.value, "to": new.value, "reason": reason}
            self._insert_event(
                conn, incident_id, EventKind.STATE_CHANGED, actor, step, body, EventStatus.DONE
            )
        self._log.info("incident_state", incident=incident_id, old=old.value, new=new.value, reason=reason)
        return self.get(incident_id)

    def reopen(
        self,
        incident_id: int,
        diagnosis: Diagnosis | dict[str, Any],
        *,
        reason: str,
        attempt: int,
        actor: str = "supervisor",
        step: int | None = None,
        key: int | None = None,
    ) -> Incident:
        """``resolved → open``: the fault came back. One transaction: the state (``closed_at``
        cleared), the new diagnosis (onset of this occurrence), the detector's new ``key`` (so a
        restarted supervisor finds this incident again for the same records), a ``detected``
        event for the new occurrence and a ``state_changed`` event with the reason and the
        attempt number it starts."""
        diag = diagnosis.to_json() if isinstance(diagnosis, Diagnosis) else dict(diagnosis)
        detected = step if step is not None else diag.get("detected_step")
        with self.transaction() as conn:
            old = self.get(incident_id).state
            if (old, IncidentState.OPEN) != REOPEN:
                raise IncidentStoreError(
                    f"incident {incident_id}: only a resolved incident can be reopened; it is {old.value}",
                    source=str(self.path),
                )
            now = self._clock()
            conn.execute(
                "UPDATE incidents SET state = ?, updated_at = ?, closed_at = NULL, "
                "analyzer_key = COALESCE(?, analyzer_key) WHERE id = ?",
                (IncidentState.OPEN.value, now, key, incident_id),
            )
            self._set_diagnosis(conn, incident_id, diag, now)
            self._insert_event(conn, incident_id, EventKind.DETECTED, "detector", detected,
                               {"diagnosis": diag, "reopened": True, "attempt": attempt}, EventStatus.DONE)  # fmt: skip
            body = {"from": old.value, "to": IncidentState.OPEN.value, "reason": reason, "reopened": True,
                    "attempt": attempt}  # fmt: skip
            self._insert_event(
                conn, incident_id, EventKind.STATE_CHANGED, actor, detected, body, EventStatus.DONE
            )
        self._log.warning(
            "incident_reopened", incident=incident_id, attempt=attempt, step=detected, reason=reason
        )
        return self.get(incident_id)

    def detections(self, job: str) -> list[tuple[int, Diagnosis]]:
        """(incident id, diagnosis) of every occurrence of a fault in ``job``, oldest first: a
        reopened incident has one per occurrence, each with its newest diagnosis (the ``detected``
        event, refined by the ``diagnosed`` events that follow it)."""
        rows = self._read(
            "SELECT e.incident_id, e.kind, e.payload FROM events e JOIN incidents i ON i.id = e.incident_id "
            "WHERE i.job = ? AND e.kind IN (?, ?) ORDER BY e.id",
            (job, EventKind.DETECTED.value, EventKind.DIAGNOSED.value),
        )
        out: list[tuple[int, Diagnosis]] = []
        current: dict[int, int] = {}  # incident id -> index of its newest occurrence in ``out``
        for r in rows:
            incident_id = int(r["incident_id"])
            try:
                d = Diagnosis.from_json(loads(r["payload"])["diagnosis"])
            except (KeyError, TypeError, ValueError, RecursionError):  # old or hand-written: not countable
                continue
            if r["kind"] == EventKind.DETECTED.value or incident_id not in current:
                current[incident_id] = len(out)
                out.append((incident_id, d))
            else:
                out[current[incident_id]] = (incident_id, d)
        return out

    def recurrences(self, incident_id: int) -> list[dict[str, Any]]:
        """Occurrences of the incident's fault detected inside its observation window (``detected``
        events marked ``in_window``): step, onset step and severity of each, oldest first."""
        out = []
        for e in self.timeline(incident_id):
            if e.kind is EventKind.DETECTED and e.payload.get("in_window"):
                d = e.payload.get("diagnosis") or {}
                out.append({"step": e.step, "onset_step": d.get("onset_step"), "severity": d.get("severity")})
        return out

    def update_diagnosis(
        self,
        incident_id: int,
        diagnosis: Diagnosis | dict[str, Any],
        *,
        actor: str = "diagnose",
        step: int | None = None,
    ) -> Event:
        """Store a (refined) diagnosis and append a ``diagnosed`` event carrying it."""
        diag = diagnosis.to_json() if isinstance(diagnosis, Diagnosis) else dict(diagnosis)
        with self.transaction() as conn:
            self.get(incident_id)
            self._set_diagnosis(conn, incident_id, diag, self._clock())
            event_id = self._insert_event(
                conn, incident_id, EventKind.DIAGNOSED, actor, step, {"diagnosis": diag}, EventStatus.DONE
            )
        return self.event(event_id)

    def _set_diagnosis(
        self, conn: sqlite3.Connection, incident_id: int, diag: dict[str, Any], now: float
    ) -> None:
        causes = diag.get("causes") or []
        conn.execute(
            "UPDATE incidents SET diagnosis = ?, onset_step = ?, detected_step = ?, phenotype = ?, severity = ?, "
            "top_cause = ?, updated_at = ? WHERE id = ?",
            (
                dumps(scrub.payload(diag)),
                diag.get("onset_step"),
                diag.get("detected_step"),
                diag.get("phenotype"),
                diag.get("severity"),
                causes[0].get("cause") if causes else None,
                now,
                incident_id,
            ),
        )
        self._touch(incident_id)

    # -- timeline -----------------------------------------------------------------------------

    def begin(
        self,
        incident_id: int,
        kind: EventKind | str,
        *,
        actor: str,
        step: int | None = None,
        payload: dict[str, Any] | None = None,
        action_id: str | None = None,
    ) -> Event:
        """Write a ``pending`` event; commit it *before* running the action it describes."""
        k = parse_enum(EventKind, kind, "event kind")
        with self.transaction() as conn:
            self.get(incident_id)
            event_id = self._insert_event(
                conn, incident_id, k, actor, step, payload or {}, EventStatus.PENDING, action_id
            )
        return self.event(event_id)

    def finish(self, event_id: int, *, result: dict[str, Any] | None = None, failed: bool = False) -> Event:
        """Mark a pending event ``done`` (or ``failed``) with its result. Finishing twice is refused."""
        status = EventStatus.FAILED if failed else EventStatus.DONE
        with self.transaction() as conn:
            cur = conn.execute(
                "UPDATE events SET status = ?, result = ?, finished_at = ? WHERE id = ? AND status = 'pending'",
                (
                    status.value,
                    None if result is None else dumps(self._clean(result)),
                    self._clock(),
                    event_id,
                ),
            )
            if cur.rowcount == 1:
                self._touch(self.event(event_id).incident_id)
            if cur.rowcount != 1:
                current = self.event(event_id)  # raises when it does not exist
                raise IncidentStoreError(
                    f"event {event_id} is already {current.status.value}; only pending events can finish",
                    source=str(self.path),
                )
        return self.event(event_id)

    def record(
        self,
        incident_id: int,
        kind: EventKind | str,
        *,
        actor: str,
        step: int | None = None,
        payload: dict[str, Any] | None = None,
        result: dict[str, Any] | None = None,
        failed: bool = False,
        action_id: str | None = None,
    ) -> Event:
        """Append an event that is already complete (an observation, an alert that was sent, a note)."""
        k = parse_enum(EventKind, kind, "event kind")
        status = EventStatus.FAILED if failed else EventStatus.DONE
        with self.transaction() as conn:
            self.get(incident_id)
            event_id = self._insert_event(
                conn, incident_id, k, actor, step, payload or {}, status, action_id, result
            )
        return self.event(event_id)

    def _insert_event(
        self,
        conn: sqlite3.Connection,
        incident_id: int,
        kind: EventKind,
        actor: str,
        step: int | None,
        payload: dict[str, Any],
        status: EventStatus,
        action_id: str | None = None,
        result: dict[str, Any] | None = None,
    ) -> int:
        now = self._clock()
        cur = conn.execute(
            "INSERT INTO events (incident_id, kind, wall_time, step, actor, payload, status, result, finished_at, "
            "action_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                incident_id,
                kind.value,
                now,
                step,
                actor,
                dumps(self._clean(payload)),
                status.value,
                None if result is None else dumps(self._clean(result)),
                now if status.is_final else None,
                action_id,
            ),
        )
        conn.execute("UPDATE incidents SET updated_at = ? WHERE id = ?", (now, incident_id))
        self._touch(incident_id)
        return int(cur.lastrowid or 0)

    def _clean(self, obj: dict[str, Any]) -> Any:
        dropped: list[str] = []
        out = scrub.payload(obj, dropped)
        if dropped:
            self._log.warning(
                "text_dropped_from_payload", keys=dropped, why="incident records hold sample IDs only"
            )
        return out

    def event(self, event_id: int) -> Event:
        rows = self._read("SELECT * FROM events WHERE id = ?", (event_id,))
        if not rows:
            raise IncidentStoreError(f"no event {event_id}", source=str(self.path))
        return self._event(rows[0])

    def timeline(self, incident_id: int) -> list[Event]:
        return [
            self._event(r)
            for r in self._read("SELECT * FROM events WHERE incident_id = ? ORDER BY id", (incident_id,))
        ]

    def pending_events(self, incident_id: int) -> list[Event]:
        """Events whose action was started and never finished: the work interrupted by a crash."""
        rows = self._read(
            "SELECT * FROM events WHERE incident_id = ? AND status = 'pending' ORDER BY id", (incident_id,)
        )
        return [self._event(r) for r in rows]

    def last_done(self, incident_id: int, kind: EventKind | str) -> Event | None:
        k = parse_enum(EventKind, kind, "event kind")
        rows = self._read(
            "SELECT * FROM events WHERE incident_id = ? AND kind = ? AND status = 'done' ORDER BY id DESC LIMIT 1",
            (incident_id, k.value),
        )
        return self._event(rows[0]) if rows else None

    def event_for_action(self, incident_id: int, action_id: str) -> Event | None:
        """The newest event written for a plan action (to skip it when already ``done``)."""
        rows = self._read(
            "SELECT * FROM events WHERE incident_id = ? AND action_id = ? ORDER BY id DESC LIMIT 1",
            (incident_id, action_id),
        )
        return self._event(rows[0]) if rows else None

    def restore(
        self, incident: dict[str, Any], events: list[dict[str, Any]], *, keep_ids: bool = False
    ) -> int:
        """Insert an exported incident and its timeline verbatim (times, statuses, results) under a new
        id, or under its own ids (``keep_ids``: rebuilding a lost database the runtime state refers to)."""
        with self.transaction() as conn:
            cur = conn.execute(
                "INSERT INTO incidents (id, job, state, opened_at, updated_at, closed_at, analyzer_key) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    incident.get("id") if keep_ids else None,
                    incident["job"],
                    parse_enum(IncidentState, incident["state"], "incident state").value,
                    incident["opened_at"],
                    incident["updated_at"],
                    incident.get("closed_at"),
                    incident.get("analyzer_key"),
                ),
            )
            new_id = int(cur.lastrowid or 0)
            self._set_diagnosis(conn, new_id, incident.get("diagnosis") or {}, incident["updated_at"])
            conn.executemany(
                "INSERT INTO events (id, incident_id, kind, wall_time, step, actor, payload, status, result, "
                "finished_at, action_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        e.get("id") if keep_ids else None,
                        new_id,
                        parse_enum(EventKind, e["kind"], "event kind").value,
                        e["wall_time"],
                        e.get("step"),
                        e["actor"],
                        dumps(self._clean(e.get("payload") or {})),
                        parse_enum(EventStatus, e["status"], "event status").value,
                        None if e.get("result") is None else dumps(self._clean(e["result"])),
                        e.get("finished_at"),
                        e.get("action_id"),
                    )
                    for e in events
                ],
            )
        return new_id

    # -- series and artifacts -----------------------------------------------------------------

    def attach_series(
        self, incident_id: int, records: Iterable[dict[str, Any] | Any], *, replay: int = 0
    ) -> int:
        """Store telemetry around the incident (record dicts or ``Record`` objects), keyed by step and
        rank; a row without ``rank`` is the per-step aggregate. ``replay`` is 0 for the original run
        and n for steps re-run after the n-th rollback, so a replay never overwrites the spike.
        Writing the same (replay, step, rank) again replaces it. Only numeric fields are kept."""
        rows = [r for r in map(scrub.series_row, records) if r is not None]
        with self.transaction() as conn:
            self.get(incident_id)
            conn.executemany(
                "INSERT OR REPLACE INTO series (incident_id, replay, step, rank, data) VALUES (?, ?, ?, ?, ?)",
                [
                    (incident_id, replay, r["step"], int(r.get("rank", _AGGREGATE_RANK)), dumps(r))
                    for r in rows
                ],
            )
            self._touch(incident_id, series=True)
        return len(rows)

    def series(
        self, incident_id: int, *, replay: int | None = 0, reruns: bool = False
    ) -> list[dict[str, Any]]:
        """Rows of one run (``replay=None``: all runs; ``reruns``: every re-run, not the original); re-run
        rows carry their ``replay`` number. By step then rank; aggregate rows have no ``rank`` key."""
        sql, args = "SELECT replay, step, rank, data FROM series WHERE incident_id = ?", [incident_id]
        if reruns:
            sql += " AND replay > 0"
        elif replay is not None:
            sql, args = sql + " AND replay = ?", [incident_id, replay]
        rows = self._read(sql + " ORDER BY replay, step, rank", args)
        return [self._decode(_series_row, r, "series", "step") for r in rows]

    def add_artifact(
        self, incident_id: int, kind: str, ref: str, meta: dict[str, Any] | None = None
    ) -> Artifact:
        with self.transaction() as conn:
            self.get(incident_id)
            cur = conn.execute(
                "INSERT INTO artifacts (incident_id, kind, ref, meta, created_at) VALUES (?, ?, ?, ?, ?)",
                (incident_id, kind, ref, dumps(self._clean(meta or {})), self._clock()),
            )
            self._touch(incident_id)
        rows = self._read("SELECT * FROM artifacts WHERE id = ?", (cur.lastrowid,))
        return self._artifact(rows[0])

    def artifacts(self, incident_id: int) -> list[Artifact]:
        rows = self._read("SELECT * FROM artifacts WHERE incident_id = ? ORDER BY id", (incident_id,))
        return [self._artifact(r) for r in rows]


def _series_row(r: sqlite3.Row) -> dict[str, Any]:
    """A stored series row; its step and rank come from the columns (a row whose JSON lost them
    still has both), the aggregate (rank -1) has no ``rank`` key."""
    data = loads(r["data"])
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    data = {k: v for k, v in data.items() if k not in ("step", "rank", "replay")}
    data["step"] = int(r["step"])
    if int(r["rank"]) != _AGGREGATE_RANK:
        data["rank"] = int(r["rank"])
    if r["replay"]:
        data["replay"] = r["replay"]
    return data

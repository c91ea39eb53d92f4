"""Rows of the incident store as typed values, and the JSON helpers they share."""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.model import Diagnosis
from supervisor.incidents.states import EventKind, EventStatus, IncidentState

_STORED = json.JSONEncoder(separators=(",", ":"), sort_keys=True, default=str)


def dumps(obj: Any) -> str:
    """Stored JSON: compact; non-finite floats kept (Python's json reads ``NaN``/``Infinity`` back).
    One encoder serves every call (``json.dumps`` with options builds one per call)."""
    return _STORED.encode(obj)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def strict(obj: Any) -> Any:
    """JSON for other programs: NaN becomes null, +-Inf the strings ``"Infinity"``/``"-Infinity"``."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {str(k): strict(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [strict(v) for v in obj]
    return obj


@dataclass(frozen=True, slots=True)
class Incident:
    id: int
    job: str
    state: IncidentState
    opened_at: float
    updated_at: float
    closed_at: float | None
    onset_step: int | None
    detected_step: int | None
    phenotype: str | None
    severity: str | None
    top_cause: str | None
    analyzer_key: int | None
    diagnosis_json: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def diagnosis(self) -> Diagnosis | None:
        return Diagnosis.from_json(self.diagnosis_json) if self.diagnosis_json else None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Incident:
        return cls(
            id=row["id"],
            job=row["job"],
            state=IncidentState(row["state"]),
            opened_at=row["opened_at"],
            updated_at=row["updated_at"],
            closed_at=row["closed_at"],
            onset_step=row["onset_step"],
            detected_step=row["detected_step"],
            phenotype=row["phenotype"],
            severity=row["severity"],
            top_cause=row["top_cause"],
            analyzer_key=row["analyzer_key"],
            diagnosis_json=loads(row["diagnosis"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "job": self.job,
            "state": self.state.value,
            "terminal": self.state.is_terminal,
            "opened_at": self.opened_at,
            "updated_at": self.updated_at,
            "closed_at": self.closed_at,
            "onset_step": self.onset_step,
            "detected_step": self.detected_step,
            "phenotype": self.phenotype,
            "severity": self.severity,
            "top_cause": self.top_cause,
            "analyzer_key": self.analyzer_key,
            "diagnosis": strict(self.diagnosis_json),
        }


@dataclass(frozen=True, slots=True)
class Event:
    """One timeline entry. ``status`` is ``pending`` while its action runs."""

    id: int
    incident_id: int
    kind: EventKind
    wall_time: float
    step: int | None
    actor: str
    payload: dict[str, Any]
    status: EventStatus
    result: dict[str, Any] | None
    finished_at: float | None
    action_id: str | None

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Event:
        return cls(
            id=row["id"],
            incident_id=row["incident_id"],
            kind=EventKind(row["kind"]),
            wall_time=row["wall_time"],
            step=row["step"],
            actor=row["actor"],
            payload=loads(row["payload"]) or {},
            status=EventStatus(row["status"]),
            result=loads(row["result"]),
            finished_at=row["finished_at"],
            action_id=row["action_id"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "incident_id": self.incident_id,
            "kind": self.kind.value,
            "wall_time": self.wall_time,
            "step": self.step,
            "actor": self.actor,
            "payload": strict(self.payload),
            "status": self.status.value,
            "result": strict(self.result),
            "finished_at": self.finished_at,
            "action_id": self.action_id,
        }


@dataclass(frozen=True, slots=True)
class Artifact:
    """A reference to something kept outside the database: a checkpoint, a snapshot, a replay log."""

    id: int
    incident_id: int
    kind: str
    ref: str
    meta: dict[str, Any]
    created_at: float

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Artifact:
        return cls(
            row["id"],
            row["incident_id"],
            row["kind"],
            row["ref"],
            loads(row["meta"]) or {},
            row["created_at"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "ref": self.ref,
            "meta": strict(self.meta),
            "created_at": self.created_at,
        }

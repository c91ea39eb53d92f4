"""Forward migrations: a file written by the v1 schema opens, upgrades in place and keeps its data."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from supervisor.errors import IncidentStoreError
from supervisor.incidents import EventKind, EventStatus, IncidentState, IncidentStore
from supervisor.incidents.schema import SCHEMA_VERSION
from tests.incidents.builders import diagnosis

# Frozen copy of the v1 schema as released: the migration must keep working from exactly this.
V1_DDL = """
CREATE TABLE incidents (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, state TEXT NOT NULL,
    opened_at REAL NOT NULL, updated_at REAL NOT NULL, onset_step INTEGER, detected_step INTEGER,
    phenotype TEXT, severity TEXT, diagnosis TEXT
);
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, incident_id INTEGER NOT NULL REFERENCES incidents(id),
    kind TEXT NOT NULL, wall_time REAL NOT NULL, step INTEGER, actor TEXT NOT NULL,
    payload TEXT NOT NULL DEFAULT '{}', status TEXT NOT NULL DEFAULT 'done', result TEXT
);
CREATE INDEX events_by_incident ON events(incident_id, id);
PRAGMA user_version = 1;
"""


def _v1_file(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(V1_DDL)
    rows = [
        (
            1,
            "old-job",
            "resolved",
            100.0,
            200.0,
            50,
            53,
            "transient",
            "high",
            json.dumps(diagnosis(onset_step=50)),
        ),
        (2, "old-job", "acting", 300.0, 310.0, 90, 92, "divergence", "critical", None),
    ]
    conn.executemany("INSERT INTO incidents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.executemany(
        "INSERT INTO events (incident_id, kind, wall_time, step, actor, payload, status, result) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (1, "detected", 100.0, 53, "detector", "{}", "done", None),
            (2, "detected", 300.0, 92, "detector", "{}", "done", None),
            (2, "rolled_back", 305.0, 92, "runtime", '{"to_step": 40}', "pending", None),
        ],
    )
    conn.commit()
    conn.close()


def test_v1_file_is_migrated_in_place_keeping_every_row(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    _v1_file(path)
    store = IncidentStore(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    old = store.get(1)
    assert (old.state, old.top_cause, old.closed_at) == (IncidentState.RESOLVED, "data", 200.0)
    assert store.get(2).top_cause is None and store.get(2).closed_at is None
    [pending] = store.pending_events(2)
    assert (pending.kind, pending.payload, pending.finished_at) == (
        EventKind.ROLLED_BACK,
        {"to_step": 40},
        None,
    )
    assert store.timeline(1)[0].finished_at == 100.0
    # The upgraded file takes v2 writes: finish the interrupted action, attach a series.
    assert store.finish(pending.id, result={"verified": True}).status == EventStatus.DONE
    assert store.attach_series(2, [{"step": 90, "loss": 3.0}]) == 1
    store.close()
    assert IncidentStore(path).get(1).job == "old-job"  # reopening does not migrate again


def test_a_file_from_a_newer_release_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(IncidentStoreError, match="schema version 99 is newer than this release understands"):
        IncidentStore(path)


def test_a_file_that_is_not_sqlite_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(IncidentStoreError, match="junk.sqlite"):
        IncidentStore(path)

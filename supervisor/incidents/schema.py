"""The SQLite schema, versioned in ``PRAGMA user_version`` with forward-only migrations.

A fresh file runs every migration from 0, so the upgrade path is exercised on every new
database. Migrations never drop data; a file from a newer release (``user_version`` above
``SCHEMA_VERSION``) is refused rather than guessed at.
"""

from __future__ import annotations

import sqlite3

from supervisor.errors import IncidentStoreError

# v1: incidents and their append-only timeline.
_V1 = """
CREATE TABLE incidents (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    job           TEXT NOT NULL,
    state         TEXT NOT NULL,
    opened_at     REAL NOT NULL,
    updated_at    REAL NOT NULL,
    onset_step    INTEGER,
    detected_step INTEGER,
    phenotype     TEXT,
    severity      TEXT,
    diagnosis     TEXT
);
CREATE TABLE events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id INTEGER NOT NULL REFERENCES incidents(id),
    kind        TEXT NOT NULL,
    wall_time   REAL NOT NULL,
    step        INTEGER,
    actor       TEXT NOT NULL,
    payload     TEXT NOT NULL DEFAULT '{}',
    status      TEXT NOT NULL DEFAULT 'done',
    result      TEXT
);
CREATE INDEX events_by_incident ON events(incident_id, id);
"""

# v2: closing time, top cause and the analyzer's key on incidents; finish time and an action
# id on events (idempotent re-execution after a restart); the telemetry window around an
# incident (for plots) and references to checkpoints / artifacts.
_V2 = """
ALTER TABLE incidents ADD COLUMN closed_at REAL;
ALTER TABLE incidents ADD COLUMN top_cause TEXT;
ALTER TABLE incidents ADD COLUMN analyzer_key INTEGER;
CREATE INDEX incidents_by_job ON incidents(job, state);
ALTER TABLE events ADD COLUMN finished_at REAL;
ALTER TABLE events ADD COLUMN action_id TEXT;
CREATE INDEX events_by_kind ON events(incident_id, kind, status);
CREATE TABLE series (
    incident_id INTEGER NOT NULL REFERENCES incidents(id),
    step        INTEGER NOT NULL,
    rank        INTEGER NOT NULL,  -- -1: the per-step aggregate over ranks
    replay      INTEGER NOT NULL,  -- 0: the original run; n: steps re-run after the n-th rollback
    data        TEXT NOT NULL,
    PRIMARY KEY (incident_id, replay, step, rank)
) WITHOUT ROWID;
CREATE TABLE artifacts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    incident_id INTEGER NOT NULL REFERENCES incidents(id),
    kind        TEXT NOT NULL,
    ref         TEXT NOT NULL,
    meta        TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL
);
UPDATE incidents SET top_cause = json_extract(diagnosis, '$.causes[0].cause') WHERE diagnosis IS NOT NULL;
UPDATE incidents SET closed_at = updated_at WHERE state IN ('resolved', 'escalated', 'dismissed');
UPDATE events SET finished_at = wall_time WHERE status != 'pending';
"""

#: MIGRATIONS[i] takes a database from version i to i + 1.
MIGRATIONS: tuple[str, ...] = (_V1, _V2)
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, source: str) -> int:
    """Bring ``conn`` to ``SCHEMA_VERSION``; returns the version it started from.

    Runs under ``BEGIN IMMEDIATE`` so two processes opening a fresh file at once do not
    both migrate: the second waits on the write lock, then sees the new version.
    """
    if user_version(conn) == SCHEMA_VERSION:
        return SCHEMA_VERSION
    conn.execute("BEGIN IMMEDIATE")
    try:
        start = user_version(conn)
        if start > SCHEMA_VERSION:
            raise IncidentStoreError(
                f"schema version {start} is newer than this release understands ({SCHEMA_VERSION}); "
                "upgrade spike-supervisor",
                source=source,
            )
        for version in range(start, SCHEMA_VERSION):
            for statement in _statements(MIGRATIONS[version]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
        conn.execute("COMMIT")
        return start
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT the surrounding transaction; split and run one by one instead.
    out, buf = [], ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out

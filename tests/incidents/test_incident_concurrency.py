"""Concurrent writers and readers (threads and a second process), and a writer SIGKILLed mid-transaction."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from supervisor.incidents import EventKind, EventStatus, IncidentState, IncidentStore
from tests.incidents.builders import diagnosis

REPO = Path(__file__).resolve().parents[2]


def _writer(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.incidents.writer_proc", *args],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _seqs(store: IncidentStore, incident_id: int, writer: str) -> list[int]:
    return [e.payload["seq"] for e in store.timeline(incident_id) if e.payload.get("writer") == writer]


def test_readers_see_consistent_prefixes_while_a_thread_writes(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "db.sqlite")
    inc = store.open_incident("j", diagnosis())
    n, finished, problems = 150, threading.Event(), []

    def write() -> None:
        for i in range(n):
            store.record(inc.id, "note", actor="thread", payload={"seq": i, "writer": "thread"})
        finished.set()

    def read() -> None:
        reads = 0
        while not finished.is_set() or reads < 3:
            seqs = _seqs(store, inc.id, "thread")
            if seqs != list(range(len(seqs))):
                problems.append(seqs)
            reads += 1

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert problems == []
    assert _seqs(store, inc.id, "thread") == list(range(n))


def test_a_second_process_and_a_thread_write_at_once_without_losing_events(tmp_path: Path) -> None:
    db = tmp_path / "db.sqlite"
    store = IncidentStore(db)
    mine, theirs = store.open_incident("j", diagnosis()), store.open_incident("k", diagnosis())
    proc = _writer("bulk", str(db), str(theirs.id), "200")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    written, deadline = 0, time.monotonic() + 120
    # Write for as long as the other process does, so the two really overlap.
    while (proc.poll() is None or written < 50) and time.monotonic() < deadline:
        store.record(mine.id, "note", actor="thread", payload={"seq": written, "writer": "thread"})
        store.list_incidents()  # a reader in between, as the CLI would be
        written += 1
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "done"
    assert _seqs(store, mine.id, "thread") == list(range(written))
    assert _seqs(store, theirs.id, "proc") == list(range(200))


def test_writer_killed_mid_transaction_loses_no_committed_event_and_leaves_no_half_event(
    tmp_path: Path,
) -> None:
    db = tmp_path / "db.sqlite"
    store = IncidentStore(db)
    inc = store.open_incident("j", diagnosis())
    proc = _writer("killme", str(db), str(inc.id))
    assert proc.stdout is not None
    first = proc.stdout.readline().split(" ", 1)
    assert first[0] == "committed", first
    ids = json.loads(first[1])
    assert proc.stdout.readline().strip() == "inside"  # the child holds an open write transaction now
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    # The uncommitted events were large enough to spill into the WAL: recovery must ignore those frames.
    assert Path(f"{db}-wal").stat().st_size > 3_000_000

    after = IncidentStore(db)  # a restarted supervisor
    timeline = after.timeline(inc.id)
    assert [e.id for e in timeline] == [timeline[0].id, *ids["events"], ids["pending"]]
    assert [e.payload.get("seq") for e in timeline[1:6]] == [0, 1, 2, 3, 4]
    assert [e.kind for e in after.pending_events(inc.id)] == [EventKind.ROLLED_BACK]
    assert after.pending_events(inc.id)[0].status == EventStatus.PENDING
    assert after.get(inc.id).state == IncidentState.OPEN  # the uncommitted transition is gone too
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # The store is writable again: the dead writer's lock did not outlive it.
    after.finish(ids["pending"], result={"verified": True})
    assert after.last_done(inc.id, "rolled_back") is not None

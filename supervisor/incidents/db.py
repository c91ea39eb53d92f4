"""SQLite plumbing of the incident store: one connection per thread and process, WAL, write transactions.

Writers take the write lock up front (``BEGIN IMMEDIATE``) so a transaction never fails
half-way on a lock upgrade; readers never block the writer (WAL). Every sqlite3 failure
leaves here as an ``IncidentStoreError`` naming the file.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from supervisor.errors import IncidentStoreError
from supervisor.incidents.schema import migrate


class Database:
    def __init__(self, path: Path, busy_timeout_s: float) -> None:
        self.path = path
        self._busy_ms = int(busy_timeout_s * 1000)
        self._local = threading.local()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IncidentStoreError(
                f"cannot create folder: {exc.strerror}", source=str(path.parent)
            ) from None
        try:
            migrate(self.conn(), str(self.path))
        except sqlite3.DatabaseError as exc:
            raise IncidentStoreError(f"cannot migrate incident database: {exc}", source=str(path)) from None

    def conn(self) -> sqlite3.Connection:
        local = self._local
        if getattr(local, "pid", None) != os.getpid():  # a forked child must not reuse the parent's handle
            local.conn, local.pid, local.depth = self._connect(), os.getpid(), 0
        conn: sqlite3.Connection = local.conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=self._busy_ms / 1000, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            # FULL: a committed event survives power loss too, not just a killed process.
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            return conn
        except sqlite3.DatabaseError as exc:
            raise IncidentStoreError(f"cannot open incident database: {exc}", source=str(self.path)) from None

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; nested uses join the outermost one."""
        conn = self.conn()
        local = self._local
        if local.depth:
            local.depth += 1
            try:
                yield conn
            finally:
                local.depth -= 1
            return
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise IncidentStoreError(f"cannot write: {exc}", source=str(self.path)) from None
        local.depth = 1
        try:
            yield conn
            conn.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            _rollback(conn)
            raise IncidentStoreError(f"write failed: {exc}", source=str(self.path)) from None
        except BaseException:
            _rollback(conn)
            raise
        finally:
            local.depth = 0

    def read(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        try:
            return self.conn().execute(sql, tuple(args)).fetchall()
        except sqlite3.DatabaseError as exc:
            raise IncidentStoreError(f"cannot read: {exc}", source=str(self.path)) from None

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.__dict__.clear()


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # a failed COMMIT may already have ended it
        conn.execute("ROLLBACK")

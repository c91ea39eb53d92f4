"""SQLite plumbing of the incident store: one connection per thread and process, WAL, write transactions.

Writers take the write lock up front (``BEGIN IMMEDIATE``) so a transaction never fails
half-way on a lock upgrade; readers never block the writer (WAL). Every sqlite3 failure
leaves here as an ``IncidentStoreError`` naming the file.

Read-only opens (``read_only=True``, what the review commands use) never create, migrate or
change a file: a path that is not an incident database is refused with exit code 2.

A writer watches its file (``check_intact``): SQLite keeps writing to the WAL of a main file
that was deleted, replaced or truncated under it, and the history is silently gone. The
file's identity (device, inode), its size and its incident count only ever grow; when any
of them goes back, the database is *lost*: ``on_lost`` is called (the store moves the
remnants aside and rebuilds from the exported JSON records), or, without a handler, every
use fails with exit code 3.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from supervisor.errors import EXIT_BROKEN, IncidentStoreError
from supervisor.incidents.schema import SCHEMA_VERSION, migrate, user_version

CHECK_INTERVAL_S = 0.5
"""A writer re-checks its file at most this often (a stat and one COUNT query)."""


class DatabaseLost(IncidentStoreError):
    """The database file vanished, was replaced, or shrank while the store had it open."""

    exit_code = EXIT_BROKEN


class Database:
    def __init__(
        self,
        path: Path,
        busy_timeout_s: float,
        *,
        read_only: bool = False,
        on_lost: Callable[[DatabaseLost], None] | None = None,
        on_end: Callable[[bool], None] | None = None,
    ) -> None:
        self.path = path
        self.read_only = read_only
        self.on_lost = on_lost
        self.on_end = on_end
        """Called after each outermost write transaction, with True when it committed."""
        self._busy_ms = int(busy_timeout_s * 1000)
        self._local = threading.local()
        self._generation = 0  # bumped when the file is recreated: threads reconnect
        self._identity: tuple[int, int] | None = None
        self._size = 0
        self._count = 0
        self._checked = 0.0
        self._check_lock = threading.RLock()
        if read_only:
            self._check_readable()
            return
        self._create()

    # -- opening ------------------------------------------------------------------------------

    def _create(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise IncidentStoreError(
                f"cannot create folder: {exc.strerror}", source=str(self.path.parent), exit_code=EXIT_BROKEN
            ) from None
        try:
            conn = self.conn()
            if migrate(conn, str(self.path)) < SCHEMA_VERSION:
                # Copy the new schema into the main file now, so its size means something
                # (check_intact). PASSIVE: never waits for another process's readers.
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.DatabaseError as exc:
            raise IncidentStoreError(
                f"not an incident database ({exc}); move it aside, and a supervisor rebuilds a new one "
                "from the incidents exported to the job's storage",
                source=str(self.path),
            ) from None
        self._remember()

    def _check_readable(self) -> None:
        """A read-only open of an existing incident database, or a one-line refusal (exit 2)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            raise IncidentStoreError(
                "no incident database here (nothing recorded yet?)", source=str(self.path)
            ) from None
        except OSError as exc:
            raise IncidentStoreError(f"cannot read: {exc.strerror}", source=str(self.path)) from None
        if size == 0:
            raise IncidentStoreError("not an incident database (empty file, 0 bytes)", source=str(self.path))
        try:
            conn = self.conn()
            version = user_version(conn)
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            raise IncidentStoreError(f"not an incident database ({exc})", source=str(self.path)) from None
        if "incidents" not in tables:
            raise IncidentStoreError("not an incident database (no incidents table)", source=str(self.path))
        if version != SCHEMA_VERSION:
            newer = version > SCHEMA_VERSION
            raise IncidentStoreError(
                f"schema version {version}, this release reads {SCHEMA_VERSION}: "
                + (
                    "upgrade spike-supervisor"
                    if newer
                    else "a supervisor of this release migrates it on launch"
                ),
                source=str(self.path),
            )

    def conn(self) -> sqlite3.Connection:
        local = self._local
        if (
            getattr(local, "pid", None) != os.getpid()
            or getattr(local, "generation", None) != self._generation
        ):
            # A forked child must not reuse the parent's handle; a recreated file needs a new one.
            local.conn, local.pid, local.depth, local.generation = (
                self._connect(),
                os.getpid(),
                0,
                self._generation,
            )
        conn: sqlite3.Connection = local.conn
        return conn

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.read_only:
                uri = f"{self.path.resolve().as_uri()}?mode=ro"
                conn = sqlite3.connect(uri, uri=True, timeout=self._busy_ms / 1000, isolation_level=None)
            else:
                conn = sqlite3.connect(self.path, timeout=self._busy_ms / 1000, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            if not self.read_only:
                conn.execute("PRAGMA journal_mode = WAL")
                # FULL: a committed event survives power loss too, not just a killed process.
                conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            return conn
        except sqlite3.OperationalError as exc:
            raise IncidentStoreError(
                f"cannot open incident database: {exc}", source=str(self.path), exit_code=EXIT_BROKEN
            ) from None
        except sqlite3.DatabaseError as exc:  # the file is something else (or garbage): bad input
            raise IncidentStoreError(
                f"not an incident database ({exc}); move it aside, and a supervisor rebuilds a new one "
                "from the incidents exported to the job's storage",
                source=str(self.path),
            ) from None
        except sqlite3.Error as exc:
            raise IncidentStoreError(
                f"cannot open incident database: {exc}", source=str(self.path), exit_code=EXIT_BROKEN
            ) from None

    # -- watching the file --------------------------------------------------------------------

    def _stat(self) -> tuple[tuple[int, int], int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino), st.st_size

    def _remember(self) -> None:
        found = self._stat()
        if found is not None:
            self._identity, size = found
            self._size = max(self._size, size) if self._identity == found[0] else size
        self._count = max(self._count, self._incident_count())
        self._checked = time.monotonic()

    def _incident_count(self) -> int:
        return int(self.conn().execute("SELECT COUNT(*) FROM incidents").fetchone()[0])

    def check_intact(self, *, force: bool = False) -> None:
        """Raise (or hand to ``on_lost``) when the file vanished, was replaced or shrank since last seen."""
        if self.read_only or (not force and time.monotonic() - self._checked < CHECK_INTERVAL_S):
            return
        with self._check_lock:
            problem = self._problem()
            if problem is None:
                self._remember()
                return
            lost = DatabaseLost(
                f"incident database {problem} while the supervisor had it open", source=str(self.path)
            )
            if self.on_lost is None:
                raise lost
            self.on_lost(lost)

    def _problem(self) -> str | None:
        found = self._stat()
        if found is None:
            return "vanished"
        identity, size = found
        if identity != self._identity:
            return "was replaced by another file"
        if size < self._size:
            return f"shrank from {self._size} to {size} bytes"
        try:
            count = self._incident_count()
        except sqlite3.DatabaseError as exc:
            return f"became unreadable ({exc})"
        if count < self._count:
            return f"lost incidents ({self._count} before, {count} now)"
        return None

    def recreate(self, aside: Path | None) -> None:
        """Close every handle, move the remnants to ``aside`` (with -wal/-shm), start a fresh file."""
        self.close()
        self._generation += 1
        for suffix in ("", "-wal", "-shm"):
            part = Path(f"{self.path}{suffix}")
            if part.exists():
                if aside is not None:
                    part.replace(Path(f"{aside}{suffix}"))
                else:
                    part.unlink()
        self._identity, self._size, self._count = None, 0, 0
        self._create()

    # -- use ----------------------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; nested uses join the outermost one."""
        if self.read_only:
            raise IncidentStoreError("opened read-only; nothing may be written", source=str(self.path))
        local = self._local
        if getattr(local, "depth", 0) and getattr(local, "pid", None) == os.getpid():
            local.depth += 1
            try:
                yield local.conn
            finally:
                local.depth -= 1
            return
        committed = False
        # The file is checked before every write, under the lock a rebuild holds: no commit goes
        # into a file that was truncated or replaced a moment ago (it would be lost with it).
        try:
            with self._check_lock:
                self.check_intact(force=True)
                conn = self._begin()
                local.depth = 1
                try:
                    yield conn
                    conn.execute("COMMIT")
                    committed = True
                except sqlite3.DatabaseError as exc:
                    _rollback(conn)
                    self._lost_now()  # a file damaged under us fails this write, and is rebuilt for the next
                    raise IncidentStoreError(
                        f"write failed: {exc}", source=str(self.path), exit_code=EXIT_BROKEN
                    ) from None
                except BaseException:
                    _rollback(conn)
                    raise
                finally:
                    local.depth = 0
        finally:
            if self.on_end is not None:
                self.on_end(committed)

    def _begin(self) -> sqlite3.Connection:
        """``BEGIN IMMEDIATE``; a file damaged since the last check (its pages unreadable before
        the next ``check_intact`` would have seen it) is handed to ``on_lost`` and tried once more."""
        for attempt in (0, 1):
            conn = self.conn()
            try:
                conn.execute("BEGIN IMMEDIATE")
                return conn
            except sqlite3.DatabaseError as exc:
                _rollback(conn)
                if attempt == 0 and self._lost_now():
                    continue
                raise IncidentStoreError(
                    f"cannot write: {exc}", source=str(self.path), exit_code=EXIT_BROKEN
                ) from None
        raise AssertionError("unreachable")

    def _lost_now(self) -> bool:
        """Check the file at once after a SQLite error; True when it was lost and rebuilt."""
        if self.on_lost is None:
            return False
        generation = self._generation
        try:
            self.check_intact(force=True)
        except sqlite3.DatabaseError:
            return False
        return self._generation != generation

    def read(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        outside = not getattr(self._local, "depth", 0)
        if outside:
            self.check_intact()
        try:
            return self.conn().execute(sql, tuple(args)).fetchall()
        except sqlite3.DatabaseError as exc:
            if outside and self._lost_now():  # damaged since the last check: rebuilt, read again
                return self.read(sql, args)
            raise IncidentStoreError(
                f"cannot read: {exc}", source=str(self.path), exit_code=EXIT_BROKEN
            ) from None

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local.__dict__.clear()


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:  # a failed COMMIT may already have ended it
        conn.execute("ROLLBACK")

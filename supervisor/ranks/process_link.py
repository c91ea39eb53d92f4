"""The worker actor's end of the training process's socket (see :mod:`supervisor.sdk.local_link`).

Records read from the process go to the rank's ``SupervisorLink`` (which buffers, bounds and
resends them to the supervisor); directives the link fetched are written to the newest
connection. The server holds nothing itself: when the process dies, whatever it had sent is
already in the link's backlog.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from typing import Any

from supervisor.logging import get_logger
from supervisor.sdk.local_link import encode, read_lines

log = get_logger("supervisor.ranks.process_link")


class LinkServer:
    """Listens on a fresh Unix socket; ``path`` goes into the process's environment."""

    def __init__(self, link: Any, poll_interval_s: float = 0.05) -> None:
        self.link = link
        self.poll_interval_s = poll_interval_s
        # A short directory under the temp root: a Unix socket path is limited to ~107 bytes.
        self._dir = tempfile.mkdtemp(prefix="sv-")
        self.path = os.path.join(self._dir, "s")
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(4)
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.records = 0
        self._answers_told: tuple[int, int] | None = None  # (connection, answers) last told to the process
        self._readers: list[threading.Thread] = []
        self._threads = [
            threading.Thread(target=self._accept, name="process-link-accept", daemon=True),
            threading.Thread(target=self._push_directives, name="process-link-directives", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def drain(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) until every connection's records reached the link: the process has exited,
        and what it sent last may still be in the socket."""
        with self._lock:
            readers = list(self._readers)
        for t in readers:
            t.join(timeout_s)

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()
            self._conns.clear()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(self._dir)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            reader = threading.Thread(target=self._read, args=(conn,), name="process-link-read", daemon=True)
            with self._lock:
                self._conns.append(conn)
                self._readers.append(reader)
            reader.start()

    def _read(self, conn: socket.socket) -> None:
        try:
            for msg in read_lines(conn):
                batch = [r for r in msg.get("records") or () if isinstance(r, dict)]
                if batch:
                    self.records += len(batch)
                    self.link.sink(batch)
        except OSError as exc:
            log.debug("process_link_read_ended", error=repr(exc))
        finally:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)

    def _push_directives(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            with self._lock:
                conn = self._conns[-1] if self._conns else None
            if conn is None:
                continue  # directives stay in the link until a process listens
            directives = self.link.take_directives()
            answers = int(getattr(self.link, "answers", 0))
            message: dict[str, Any] = {"directives": directives} if directives else {}
            # The process's guard counts the supervisor's answers.
            if self._answers_told != (id(conn), answers):
                message["supervisor"] = {"answers": answers}
            if not message:
                continue
            try:
                conn.sendall(encode(message))
                self._answers_told = (id(conn), answers)
            except OSError as exc:  # the process died: it will not need them, a new generation re-fetches
                log.warning("directive_push_failed", error=repr(exc), directives=len(directives))

"""The training process's line to its supervisor: a Unix socket to the rank's Ray worker actor.

A command entrypoint (``python train.py``, torchrun-style) runs in its own process, started
by the rank's worker actor. That actor already holds the rank's link to the supervisor (a
bounded backlog, resends, directive long-polls), so the training process does not join Ray
at all: it connects to a socket the actor listens on (``$SUPERVISOR_SOCKET``) and exchanges
newline-delimited JSON with it.

Why a local socket and not a Ray client connection in the training process: the script
stays a plain torch program (no second Ray driver per rank, no Ray import cost, nothing in
its environment to configure), records handed to the actor survive the training process's
crash, and the actor sees the end of the stream the moment the process dies.

Wire format (one JSON object per line, NaN/Infinity as Python's json writes them):
``{"records": [...]}`` from the process, ``{"directives": [...]}`` to it, and
``{"supervisor": {"answers": n}}`` whenever the actor's link heard the supervisor answer again
(the process's guard, ``sdk/guard.py``, counts them).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections import deque
from typing import Any

from supervisor.sdk.directives import Directive

#: The actor's socket path, set in the training process's environment.
SOCKET_ENV = "SUPERVISOR_SOCKET"


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()


def read_lines(sock: socket.socket) -> Any:
    """Yield decoded JSON objects from ``sock`` until it closes (a bad line is skipped)."""
    with sock.makefile("rb") as f:
        for line in f:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                yield msg


class LocalLink:
    """Client side: ``send(records)`` is the transport's sink, ``directives()`` its source."""

    def __init__(self, path: str, timeout_s: float = 10.0) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout_s)
        self._sock.connect(path)
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._inbox: deque[dict[str, Any]] = deque()
        self.connected = True
        self.answers = 0
        """Answers from the supervisor, as the rank's actor last told (the SDK's guard counts them)."""
        self._reader = threading.Thread(target=self._read, name="supervisor-socket", daemon=True)
        self._reader.start()

    def send(self, batch: list[dict[str, Any]]) -> None:
        """Raises OSError when the actor is gone; the batching transport then keeps and retries."""
        with self._lock:
            self._sock.sendall(encode({"records": batch}))

    def directives(self) -> list[Directive]:
        out = []
        while self._inbox:
            out.append(Directive.from_dict(self._inbox.popleft()))
        return out

    def close(self) -> None:
        self.connected = False
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _read(self) -> None:
        try:
            for msg in read_lines(self._sock):
                self._inbox.extend(d for d in msg.get("directives") or () if isinstance(d, dict))
                told = (
                    (msg.get("supervisor") or {}).get("answers")
                    if isinstance(msg.get("supervisor"), dict)
                    else None
                )
                if isinstance(told, int):
                    self.answers = told
        except OSError:
            pass
        self.connected = False

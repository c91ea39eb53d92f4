"""A fault-injecting TCP proxy for a real S3 HTTP endpoint (stdlib sockets, loopback only).

Each new client connection takes the next fault from a queue, or is forwarded untouched:
  "503"       read the request head, answer ``503 SlowDown`` (S3's XML error), close
  "500"       the same with ``500 InternalError``
  "reset"     read the request head, then reset the connection (RST, no response)
  "cut:<n>"   forward, but reset the connection after relaying n response bytes (mid-body drop)

Differences from a real flaky S3: faults are per connection, not per request, so
``inject`` also closes idle forwarded connections to make the client reconnect.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_INTERNAL = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>oops</Message></Error>'
)


def _http_error(status: str, body: bytes) -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def _read_head(sock: socket.socket) -> None:
    data = b""
    sock.settimeout(5)
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return
            data += chunk


class FaultProxy:
    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.faults: list[str] = []
        self.injected = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def inject(self, faults: list[str]) -> None:
        """Queue faults for the next connections and drop idle ones so the client must reconnect."""
        with self._lock:
            self.faults.extend(faults)
            live, self._live = list(self._live), set()
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self.faults)

    def close(self) -> None:
        self._stop.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                fault = self.faults.pop(0) if self.faults else None
                self.connections += 1
                self.injected += fault is not None
            threading.Thread(target=self._serve, args=(client, fault), daemon=True).start()

    def _serve(self, client: socket.socket, fault: str | None) -> None:
        if fault in ("503", "500"):
            _read_head(client)
            status, body = (
                ("503 Slow Down", _SLOWDOWN) if fault == "503" else ("500 Internal Error", _INTERNAL)
            )
            with contextlib.suppress(OSError):
                client.sendall(_http_error(status, body))
                client.close()
            return
        if fault == "reset":
            _read_head(client)
            _reset(client)
            return
        cut = int(fault.split(":")[1]) if fault and fault.startswith("cut:") else None
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            _reset(client)
            return
        with self._lock:
            self._live.add(client)
        threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
        self._pump(upstream, client, cut)

    def _pump(self, src: socket.socket, dst: socket.socket, cut: int | None) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if cut is not None and sent + len(data) > cut:
                    dst.sendall(data[: max(0, cut - sent)])
                    _reset(dst)
                    _reset(src)
                    return
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
        with self._lock:
            self._live.discard(src)
            self._live.discard(dst)

"""A real HTTP server on loopback that records what webhooks receive."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Hook:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    """Statuses to answer with, in order; 200 once they run out."""
    arrived: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def webhook() -> Iterator[Hook]:
    hook = Hook(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            hook.requests.append(
                {
                    "path": self.path,
                    "headers": dict(self.headers.items()),
                    "body": json.loads(raw, parse_constant=_reject),
                }
            )
            status = hook.statuses.pop(0) if hook.statuses else 200
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"ok" if status == 200 else b"no")
            hook.arrived.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hook.url = f"http://127.0.0.1:{server.server_address[1]}/services/T000/B000/secret-path"
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _reject(name: str) -> Any:
    raise ValueError(f"not strict JSON: {name}")

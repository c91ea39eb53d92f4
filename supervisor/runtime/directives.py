"""The supervisor's side of directives: an ordered log workers read from, and their acknowledgements.

Each directive gets a sequence number; a worker asks for everything after the last number
it saw. The log is persisted (``RuntimeState``) *before* a directive becomes visible, so a
restarted supervisor never re-issues, under a new number, a directive a worker already
fetched: that is what keeps a rollback from running twice. Directive ids are derived from
the plan action that issued them, so the same action always names the same directive.
"""

from __future__ import annotations

import threading
from typing import Any

from supervisor.sdk.directives import Directive

_APPLIED = "directive_applied:"
_FAILED = "directive_failed:"


class DirectiveLog:
    def __init__(self, entries: list[dict[str, Any]] | None = None) -> None:
        self._entries: list[dict[str, Any]] = list(entries or [])
        self._lock = threading.Condition()
        self.acks: dict[str, dict[int, int]] = {}  # directive id -> {rank: step of the acknowledging record}
        self.failures: dict[str, dict[int, int]] = {}

    @property
    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._entries)

    def has(self, directive_id: str) -> bool:
        with self._lock:
            return any(e["id"] == directive_id for e in self._entries)

    def append(self, directive: Directive) -> int:
        """Add a directive (idempotent by id); returns its sequence number."""
        body = directive.to_dict()
        with self._lock:
            for e in self._entries:
                if e["id"] == body["id"]:
                    return int(e["seq"])
            seq = (self._entries[-1]["seq"] + 1) if self._entries else 1
            self._entries.append({**body, "seq": seq})
            self._lock.notify_all()
            return seq

    def after(self, seq: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Entries after ``seq``; with ``wait_s`` a long poll: wait that long for a first one."""
        with self._lock:
            self._lock.wait_for(
                lambda: bool(self._entries) and self._entries[-1]["seq"] > seq, timeout=wait_s
            )
            return [e for e in self._entries if e["seq"] > seq]

    def note_events(self, rank: int, step: int, events: list[str]) -> None:
        """Record acknowledgements carried by one record's events."""
        for ev in events:
            for prefix, table in ((_APPLIED, self.acks), (_FAILED, self.failures)):
                if ev.startswith(prefix):
                    parts = ev[len(prefix) :].split(":")
                    if parts and parts[0]:
                        table.setdefault(parts[0], {})[rank] = step

    def note_applied(self, rank: int, applied: dict[str, Any], step: int | None) -> None:
        """Acknowledgements a worker's link saw go out (used after a supervisor restart)."""
        for did in applied:
            self.acks.setdefault(str(did), {}).setdefault(rank, step if step is not None else -1)

    def acked_by(self, directive_id: str) -> dict[int, int]:
        return dict(self.acks.get(directive_id, {}))

    def failed_on(self, directive_id: str) -> dict[int, int]:
        return dict(self.failures.get(directive_id, {}))

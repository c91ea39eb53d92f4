"""The supervisor's side of directives: an ordered log workers read from, and their acknowledgements.

Each directive gets a sequence number; a worker asks for everything after the last one it saw.
The log is persisted (``RuntimeState``) *before* a directive becomes visible, and ids derive from
the plan action, so a restarted supervisor never re-issues under a new number a directive a worker
already fetched: that keeps a rollback from running twice. A new worker generation gets the
directives its incident still needs as copies ``<id>@g<gen>``, whose acknowledgements count for
the original id, so the action waiting on it finishes exactly once (docs/runtime.md, Machinery faults).
"""

from __future__ import annotations

import threading
from typing import Any

from supervisor.sdk.directives import Directive

_APPLIED = "directive_applied:"
_FAILED = "directive_failed:"
_COPY = "@g"


def canonical(directive_id: str) -> str:
    """The id a re-delivered copy stands for (the id itself for an original)."""
    return directive_id.split(_COPY, 1)[0]


def _by_rank(table: dict[str, dict[Any, int]] | None) -> dict[str, dict[int, int]]:
    return {k: {int(r): s for r, s in v.items()} for k, v in (table or {}).items()}


class DirectiveLog:
    def __init__(
        self,
        entries: list[dict[str, Any]] | None = None,
        acks: dict[str, dict[int, int]] | None = None,
        failures: dict[str, dict[int, int]] | None = None,
    ) -> None:
        self._entries: list[dict[str, Any]] = list(entries or [])
        self._lock = threading.Condition()
        # directive id -> {rank: step of the acknowledging record}; persisted with the runtime state
        self.acks = _by_rank(acks)
        self.failures = _by_rank(failures)

    @property
    def entries(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._entries)

    def has(self, directive_id: str) -> bool:
        with self._lock:
            return any(e["id"] == directive_id for e in self._entries)

    def append(self, directive: Directive) -> int:
        """Idempotent by id; returns its sequence number."""
        return self._add(directive.to_dict())

    def _add(self, body: dict[str, Any]) -> int:
        with self._lock:
            for e in self._entries:
                if e["id"] == body["id"]:
                    return int(e["seq"])
            seq = (self._entries[-1]["seq"] + 1) if self._entries else 1
            self._entries.append({**body, "seq": seq})
            self._lock.notify_all()
            return seq

    @property
    def last_seq(self) -> int:
        with self._lock:
            return int(self._entries[-1]["seq"]) if self._entries else 0

    def entry(self, directive_id: str) -> dict[str, Any] | None:
        with self._lock:
            return next((dict(e) for e in self._entries if e["id"] == directive_id), None)

    def redeliver(self, directive_id: str, generation: int) -> str | None:
        """Append a copy of ``directive_id`` for worker generation ``generation``; its new id."""
        original = self.entry(canonical(directive_id))
        if original is None:
            return None
        body = {k: v for k, v in original.items() if k != "seq"}
        body["id"] = f"{original['id']}{_COPY}{generation}"
        self._add(body)
        return str(body["id"])

    def forget_acks(self, directive_id: str) -> None:
        """The ranks that acknowledged it are gone (a new generation): it must be acknowledged anew."""
        self.acks.pop(directive_id, None)
        self.failures.pop(directive_id, None)

    def after(self, seq: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
        """Entries after ``seq``; with ``wait_s`` a long poll: wait that long for a first one."""
        with self._lock:
            self._lock.wait_for(
                lambda: bool(self._entries) and self._entries[-1]["seq"] > seq, timeout=wait_s
            )
            return [e for e in self._entries if e["seq"] > seq]

    def note_events(self, rank: int, step: int, events: list[str]) -> None:
        for ev in events:
            for prefix, table in ((_APPLIED, self.acks), (_FAILED, self.failures)):
                if ev.startswith(prefix):
                    parts = ev[len(prefix) :].split(":")
                    if parts and parts[0]:
                        table.setdefault(canonical(parts[0]), {})[rank] = step

    def note_applied(self, rank: int, applied: dict[str, Any], step: int | None) -> None:
        """Acknowledgements a worker's link saw go out (used after a supervisor restart)."""
        for did in applied:
            self.acks.setdefault(canonical(str(did)), {}).setdefault(rank, step if step is not None else -1)

    def acked_by(self, directive_id: str) -> dict[int, int]:
        return dict(self.acks.get(directive_id, {}))

    def failed_on(self, directive_id: str) -> dict[int, int]:
        return dict(self.failures.get(directive_id, {}))

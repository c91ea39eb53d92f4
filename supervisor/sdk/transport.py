"""How records leave a training step and directives come back.

``Transport`` is the protocol the probe talks to; ``send`` never blocks training.
``BatchingTransport`` implements it over any ``sink(list[dict])``: records go into a bounded
buffer and a background thread hands them to the sink in batches (every ``batch_size``
records or ``flush_interval_s``). A slow or dead sink fills the buffer; the oldest records
are then dropped and *counted* (``stats.dropped``), and the probe puts the running count in
the next record's ``attrs.dropped_records`` so the loss is never silent. The Ray side of the
runtime only supplies a sink (an actor call) and a directive source.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from supervisor.logging import get_logger
from supervisor.sdk.directives import Directive

#: How long ranks wait at their last step for the supervisor (steering ``_hold_at_end``): long
#: enough for a plan to freeze, snapshot and roll back; bounded so a supervisor that never
#: comes back does not hold the workers forever (the run is then reported unfinished). Every
#: transport with a supervisor at the other end holds: in the Ray actor and in a command
#: entrypoint's own process alike.
HOLD_AT_END_S = 900.0

Sink = Callable[[list[dict[str, Any]]], None]
DirectiveSource = Callable[[], list[Directive]]


@runtime_checkable
class Transport(Protocol):
    def send(self, batch: list[dict[str, Any]]) -> None:
        """Queue records; returns at once whatever the receiver is doing."""

    def poll(self) -> list[Directive]:
        """Directives received since the last poll (non-blocking)."""

    def close(self) -> None:
        """Hand over what is queued (bounded wait) and stop."""


@dataclass
class TransportStats:
    sent: int = 0
    """Records handed to the sink."""
    dropped: int = 0
    """Records dropped because the buffer was full."""
    sink_errors: int = 0
    """Sink calls that raised (their batch was re-queued)."""
    batches: int = 0


class BatchingTransport:
    """Bounded buffer + background flusher around ``sink``; directives from ``directives()`` or ``deliver``."""

    def __init__(
        self,
        sink: Sink,
        directives: DirectiveSource | None = None,
        *,
        batch_size: int = 100,
        flush_interval_s: float = 0.2,
        max_buffer: int = 10_000,
        name: str = "telemetry",
        hold_at_end_s: float = 0.0,
        answers: Callable[[], int] | None = None,
    ) -> None:
        self.hold_at_end_s = hold_at_end_s
        self._answers = answers
        """Seconds the ranks hold at their last step for the supervisor (0: a local trace, no hold)."""
        self._sink = sink
        self._source = directives
        self._batch_size = batch_size
        self._interval = flush_interval_s
        self._buf: deque[dict[str, Any]] = deque()
        self._max = max_buffer
        self._inbox: deque[Directive] = deque()
        self._cv = threading.Condition()
        self._in_flight = 0
        self._flushing = 0
        self._closed = False
        self.stats = TransportStats()
        self._log = get_logger("supervisor.sdk.transport", transport=name)
        self._thread = threading.Thread(target=self._run, name=f"sdk-{name}", daemon=True)
        self._thread.start()

    @property
    def supervisor_answers(self) -> int | None:
        """How many answers came from the supervisor so far (None: no supervisor at the other end)."""
        return self._answers() if self._answers is not None else None

    # -- training side -------------------------------------------------------------------------
    def send(self, batch: list[dict[str, Any]]) -> None:
        with self._cv:
            for rec in batch:
                if len(self._buf) >= self._max:
                    self._buf.popleft()  # drop the oldest: fresh data matters most to a live detector
                    self.stats.dropped += 1
                self._buf.append(rec)
            if len(self._buf) >= self._batch_size:
                self._cv.notify()

    def poll(self) -> list[Directive]:
        out: list[Directive] = []
        while self._inbox:
            out.append(self._inbox.popleft())
        if self._source is not None:
            try:
                out.extend(self._source())
            except Exception as exc:  # a flaky control channel must not stop training
                self._log.warning("directive_poll_failed", error=repr(exc))
        return out

    def deliver(self, *directives: Directive) -> None:
        """Queue directives for the next ``poll`` (in-process use: tests, drills, the Ray side)."""
        self._inbox.extend(directives)

    def flush(self, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cv:
            self._flushing += 1
            self._cv.notify_all()
            try:
                while self._buf or self._in_flight:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cv.wait(min(left, 0.05))
            finally:
                self._flushing -= 1
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self.flush(timeout_s)
        with self._cv:
            self._closed = True
            self.stats.dropped += len(self._buf)  # what the receiver could not take in time: counted
            self._buf.clear()
            self._cv.notify_all()
        self._thread.join(timeout_s)

    # -- background side -----------------------------------------------------------------------
    def _take(self) -> list[dict[str, Any]]:
        n = min(self._batch_size, len(self._buf))
        batch = [self._buf.popleft() for _ in range(n)]
        self._in_flight = len(batch)
        return batch

    def _run(self) -> None:
        backoff = 0.0
        while True:
            with self._cv:
                idle = not (self._closed or self._flushing) and len(self._buf) < self._batch_size
                if backoff or idle:
                    self._cv.wait(backoff or self._interval)
                if self._closed and not self._buf:
                    return
                batch = self._take()
            if not batch:
                continue
            backoff = self._deliver(batch, backoff)

    def _deliver(self, batch: list[dict[str, Any]], backoff: float) -> float:
        try:
            self._sink(batch)
        except Exception as exc:
            # Keep the batch (at the front, within the bound) and back off; a dead receiver must
            # neither block training nor spin this thread.
            with self._cv:
                self.stats.sink_errors += 1
                room = self._max - len(self._buf)
                keep = batch[-room:] if room > 0 and not self._closed else []
                self.stats.dropped += len(batch) - len(keep)
                self._buf.extendleft(reversed(keep))
                self._in_flight = 0
                self._cv.notify_all()
            if self.stats.sink_errors in (1, 10, 100) or self.stats.sink_errors % 1000 == 0:
                self._log.warning("telemetry_sink_failed", error=repr(exc), errors=self.stats.sink_errors)
            return min(max(backoff * 2, 0.05), 2.0)
        with self._cv:
            self.stats.sent += len(batch)
            self.stats.batches += 1
            self._in_flight = 0
            self._cv.notify_all()
        return 0.0


class OfflineTransport(BatchingTransport):
    """Writes records as JSONL to ``path`` (NaN/Infinity as Python's json writes them); no directives."""

    def __init__(self, path: str | Path, **kw: Any) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        super().__init__(self._write, name="offline", **kw)

    def _write(self, batch: list[dict[str, Any]]) -> None:
        self._fh.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in batch))
        self._fh.flush()

    def close(self, timeout_s: float = 5.0) -> None:
        super().close(timeout_s)
        self._fh.close()


class MemoryTransport(BatchingTransport):
    """Keeps every record in ``records`` (tests, drills, in-process supervision)."""

    def __init__(self, **kw: Any) -> None:
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        super().__init__(self._keep, name="memory", **kw)

    def _keep(self, batch: list[dict[str, Any]]) -> None:
        with self._lock:
            self.records.extend(batch)

"""The worker side of the telemetry channel: records out, directives in, over Ray actor calls.

A rank has at most one ``ingest`` call in flight: its batches stay in order at the supervisor
(a threaded actor does not order calls), and batches grow under load instead of calls piling up.

Records are numbered (``seq``, per link id) and kept after they were sent until the supervisor
answers that it has *durably* accepted them (see ``receipts.py``). Every call says which numbers
the link still holds; a supervisor that lacks some (a new incarnation) answers ``resend_from``
and the link sends everything from there again, in order. While the supervisor is busy, dead or
restarting, records wait in a bounded buffer; at the bound the oldest are dropped and counted
(the gap in the numbering tells the supervisor too), never the training step blocked.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from supervisor.logging import get_logger
from supervisor.ranks.names import NAMESPACE, supervisor_name
from supervisor.ranks.relay import UNAVAILABLE, node_relay
from supervisor.sdk.directives import Directive
from supervisor.sdk.transport import HOLD_AT_END_S  # the same hold as a command entrypoint's process
from supervisor.sdk.wire import pack

log = get_logger("supervisor.ranks.channel")

_ACK = "directive_applied:"
#: A directive long poll waits this long for news (the supervisor actor caps it at 5 s); a directive
#: issued meanwhile ends the wait at once, so only the number of empty answers depends on it.
LONG_POLL_S = 5.0
#: With nothing new to send, ask for the durable mark this often (every answer to a batch carries
#: it): an idle rank (frozen, held) frees its buffer, and a new supervisor learns what to ask again.
ACK_POLL_S = 2.0
#: The same while ``flush`` waits for the supervisor to accept everything (closing a rank).
FLUSH_ACK_POLL_S = 0.5


class SupervisorLink:
    def __init__(
        self,
        job: str,
        rank: int,
        *,
        buffer_records: int,
        poll_interval_s: float,
        after_seq: int = 0,
        relay: bool = False,
    ) -> None:
        self.job = job
        self.rank = rank
        self.relay = relay
        """Batches go through this node's relay (``ranks/relay.py``) instead of straight to the supervisor."""
        self.buffer_records = buffer_records
        self.poll_interval_s = poll_interval_s
        self.dropped = 0
        self.sent = 0
        self.acked = 0
        """Highest seq the supervisor has durably accepted."""
        self.answers = 0
        """Calls the supervisor answered (batches and directive polls): the SDK's guard counts them."""
        self.applied: dict[str, str] = {}  # directive id -> kind, as acknowledged in records
        self.last_step: int | None = None
        self.link_id = uuid.uuid4().hex[:12]
        self._seq = 0
        self._backlog: deque[tuple[int, dict[str, Any]]] = deque()  # not sent yet
        self._unacked: deque[tuple[int, dict[str, Any]]] = deque()  # sent, not durably accepted
        self._last_call = 0.0
        self._in_flight: tuple[Any, list[tuple[int, dict[str, Any]]], bool] | None = None
        self._handle: Any = None
        self._next_lookup = 0.0
        self._relay: Any = None
        self._next_relay = 0.0
        self._after_id = after_seq  # directives up to here predate this worker: never applied
        self._directives: deque[dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"supervisor-link-{rank}", daemon=True)
        self._thread.start()
        # Only rank 0 fetches directives: the SDK broadcasts rank 0's to every rank at the boundary.
        self._poller = threading.Thread(target=self._poll_directives, name=f"directives-{rank}", daemon=True)
        if rank == 0:
            self._poller.start()

    def sink(self, batch: list[dict[str, Any]]) -> None:
        """Queue a batch of records (never blocks on the network)."""
        with self._lock:
            for rec in batch:
                self._note(rec)
                self._seq += 1
                self._backlog.append((self._seq, rec))
            # Over the bound: drop the oldest, delivered-but-not-durable ones first.
            overflow = len(self._unacked) + len(self._backlog) - self.buffer_records
            for _ in range(max(0, overflow)):
                (self._unacked or self._backlog).popleft()
                self.dropped += 1
        self._pump()

    def take_directives(self) -> list[dict[str, Any]]:
        with self._lock:
            out = list(self._directives)
            self._directives.clear()
            return out

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait (bounded) until the supervisor has durably accepted every queued record."""
        deadline = time.monotonic() + timeout_s
        while self._backlog or self._in_flight or self._unacked:
            if time.monotonic() >= deadline:
                return False
            self._pump(ack_poll_s=FLUSH_ACK_POLL_S)
            time.sleep(0.01)
        return True

    def close(self, timeout_s: float = 5.0) -> None:
        self.flush(timeout_s)
        self._stop.set()
        self._thread.join(timeout=2.0)
        if self._poller.is_alive():
            # Its long poll ends within LONG_POLL_S; it is a daemon and stops after that answer.
            self._poller.join(timeout=1.0)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "sent": self.sent,
                "dropped": self.dropped,
                "acked": self.acked,
                "unacked": len(self._unacked),
                "backlog": len(self._backlog),
                "link_id": self.link_id,
                "connected": self._handle is not None,
                "relayed": self._relay is not None,
                "applied": dict(self.applied),
                "last_step": self.last_step,
                "after_id": self._after_id,
            }

    def _note(self, rec: dict[str, Any]) -> None:
        if isinstance(rec.get("step"), int):
            self.last_step = rec["step"]
        for ev in rec.get("events") or ():
            if isinstance(ev, str) and ev.startswith(_ACK):
                parts = ev.split(":")
                if len(parts) >= 3:
                    self.applied[parts[1]] = parts[2]

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self._pump()
            except Exception as exc:  # a failing link must never kill the worker's training
                log.warning("link_error", rank=self.rank, error=repr(exc))
                self._forget_handle()

    def _poll_directives(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._fetch():
                    self._stop.wait(self.poll_interval_s)
            except Exception as exc:  # a failing link must never kill the worker's training
                log.warning("directive_poll_error", rank=self.rank, error=repr(exc))
                self._forget_handle()
                self._stop.wait(self.poll_interval_s)

    def _supervisor(self) -> Any:
        if self._handle is None and time.monotonic() >= self._next_lookup:
            try:
                self._handle = ray.get_actor(supervisor_name(self.job), namespace=NAMESPACE)
            except ValueError:
                self._next_lookup = time.monotonic() + 1.0
        return self._handle

    def _forget_handle(self) -> None:
        self._handle = None
        self._next_lookup = time.monotonic() + 1.0

    def _pump(self, ack_poll_s: float = ACK_POLL_S) -> None:
        with self._lock:
            if self._in_flight is not None:
                ref, batch, relayed = self._in_flight
                ready, _ = ray.wait([ref], timeout=0)
                if not ready:
                    return
                self._in_flight = None
                try:
                    reply = ray.get(ref)
                except RayActorError:
                    self._backlog.extendleft(reversed(batch))  # resend later, in order
                    if relayed:
                        self._forget_relay()
                    else:
                        self._forget_handle()
                else:
                    if isinstance(reply, dict) and UNAVAILABLE in reply:  # the relay could not deliver it
                        self._backlog.extendleft(reversed(batch))
                        self._forget_handle()
                    elif isinstance(reply, dict) and "refused" in reply:  # malformed: never accepted, counted
                        self.dropped += len(batch)
                        log.warning(
                            "records_refused", rank=self.rank, records=len(batch), why=reply["refused"]
                        )
                    else:
                        self.sent += len(batch)
                        self._unacked.extend(batch)
                    self._on_reply(reply[0] if isinstance(reply, list) and reply else reply)
            handle = self._supervisor()
            if handle is None:
                return
            relay = self._node_relay()
            idle = time.monotonic() - self._last_call < ack_poll_s
            if not self._backlog and (not self._unacked or idle):
                return
            batch = list(self._backlog)
            self._backlog.clear()
            self._last_call = time.monotonic()
            held = (self._unacked or batch)[0][0], (batch or self._unacked)[-1][0]
            # One packed batch (sdk/wire.py): columns the supervisor decodes in bulk.
            wire = pack([(self.rank, self.link_id, held, [s for s, _ in batch], [r for _, r in batch])])
            call = (relay or handle).ingest_packed.remote(wire)
            self._in_flight = (call, batch, relay is not None)

    def _node_relay(self) -> Any:
        """This node's relay when the link sends through one and it can be had (else None: direct)."""
        if self.relay and self._relay is None and time.monotonic() >= self._next_relay:
            try:
                self._relay = node_relay(self.job)
            except Exception as exc:  # no relay: the supervisor directly, and ask again later
                log.warning("relay_unavailable", rank=self.rank, error=repr(exc))
                self._forget_relay()
        return self._relay

    def _forget_relay(self) -> None:
        self._relay = None
        self._next_relay = time.monotonic() + 1.0

    def _on_reply(self, reply: Any) -> None:
        """Forget what is durable; resend from where the supervisor asks (it lacks those records)."""
        if not isinstance(reply, dict):
            return
        self.answers += 1
        if "refused" in reply:
            return
        self.acked = max(self.acked, int(reply.get("acked", 0)))
        while self._unacked and self._unacked[0][0] <= self.acked:
            self._unacked.popleft()
        resend = reply.get("resend_from")
        if resend is not None:
            again = [x for x in self._unacked if x[0] >= int(resend)]
            log.info("resending_records", rank=self.rank, records=len(again), from_seq=resend)
            self._unacked = deque(x for x in self._unacked if x[0] < int(resend))
            self._backlog.extendleft(reversed(again))

    def _fetch(self) -> bool:
        """One long poll; False when there is no supervisor to ask (the caller then waits)."""
        handle = self._supervisor()
        if handle is None:
            return False
        try:  # returns as soon as a directive is issued (or after LONG_POLL_S)
            new = ray.get(
                handle.directives.remote(self.rank, self._after_id, LONG_POLL_S), timeout=LONG_POLL_S + 10
            )
        except (RayActorError, GetTimeoutError):
            self._forget_handle()
            return False
        with self._lock:
            self.answers += 1
            for d in new:
                self._after_id = max(self._after_id, int(d.pop("seq")))
                self._directives.append(d)
        return True


class RayTransport:
    """The SDK's Transport over a :class:`SupervisorLink`, which already batches, bounds and sends in
    the background: ``send`` costs a lock and a deque append on the training thread."""

    hold_at_end_s = HOLD_AT_END_S

    def __init__(self, link: SupervisorLink) -> None:
        self.link = link

    def send(self, batch: list[dict[str, Any]]) -> None:
        self.link.sink(batch)

    def poll(self) -> list[Any]:
        return [Directive.from_dict(d) for d in self.link.take_directives()]

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self.link.flush(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        self.link.close(timeout_s)

    @property
    def dropped(self) -> int:
        return self.link.dropped

    @property
    def supervisor_answers(self) -> int:
        """Answers from the supervisor so far (the SDK's guard: sdk/guard.py)."""
        return self.link.answers

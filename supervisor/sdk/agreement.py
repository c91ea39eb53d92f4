"""Every rank applies the same directives at the same boundary, with no collective on any step.

Rank 0 receives the supervisor's directives; the other ranks learn them from a key-value store
every rank already shares (torch.distributed's rendezvous store), each on its own connection,
and all of them agree through a two-phase commit on the boundary where they take effect:

1. **prepare**: rank 0 writes proposal ``k`` -- the directives and the boundary ``E`` where they
   take effect -- and promises not to pass ``E`` undecided.
2. **promise**: each rank's watcher thread, woken by the store, compares ``E`` with the next
   boundary it will stand at (``pos`` while it stands at boundary ``pos``, ``pos + 1`` once it
   left it). ``next <= E``: it promises not to pass ``E`` before the decision and adds one to
   the proposal's count; ``next > E``: it is too late, and it decides *abort*.
3. **decide**: the rank whose promise makes the count reach the world size decides *commit*. A
   rank that has stood at ``E`` with the proposal undecided for ``decide_timeout_s`` decides
   *abort* (a lost or slow promise). The decision is one store key written by compare-and-set:
   the first writer wins and every rank reads the same decision.
4. **apply**: at boundary ``E`` every rank applies the committed directives in proposal order;
   a rank at ``E`` holding an undecided promise waits there for the decision. After an abort,
   rank 0 proposes the same directives again with a later ``E``, twice as far ahead after each
   abort in a row (and fails them after ``max_attempts`` aborts).

Boundaries are counted, not named by step: every rank passes the same boundaries in the same
order (the same steps, the same rollbacks), so boundary ``n`` is the same point on every rank
even when a rollback makes step numbers repeat.

Why no rank can block in a training collective while another parks: a directive is applied
at ``E`` only if committed, and commit needs every rank's promise, given before it passed
``E``; a rank that promised does not pass ``E`` without the decision, and the decision is the
same for all. So every rank applies it at ``E``, after the same steps, and none has started
the step after ``E``. An abort is applied nowhere. Rank 0 proposes one batch at a time, so the
batches are applied in the same order everywhere. What an idle step costs: a lock and a few
comparisons on each rank; the store is touched only while a directive is being agreed.

The store is any object with torch's ``Store`` methods used here (``set``, ``get``, ``add``,
``compare_set``, ``wait``): ``torch.distributed.TCPStore`` in a job, a fake in tests. This
module imports no torch.
"""

from __future__ import annotations

import atexit
import json
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from supervisor.errors import SupervisorError
from supervisor.logging import get_logger
from supervisor.sdk.directives import Continue, Directive, Freeze, Stop

COMMIT = "commit"
ABORT = "abort"
CLOSED = json.dumps({"closed": True})
CLOSED_ABORT = f"{ABORT}:closed"
#: A watcher's store wait is re-armed this often (a TCPStore logs each expired wait).
WAIT_CHUNK_S = 3600.0


class Store(Protocol):
    """The part of ``torch.distributed.Store`` the protocol uses."""

    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def add(self, key: str, amount: int) -> int: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...
    def wait(self, keys: list[str], timeout: timedelta) -> None: ...


@dataclass
class Proposal:
    k: int
    at: int
    """The boundary ``E`` where its directives take effect."""
    directives: list[Directive]
    since: float | None = None
    """When this rank began to wait for its decision at ``at`` (None: not waiting)."""


@dataclass
class _Proposer:
    """Rank 0's side: what waits to be proposed, and how the last proposals went."""

    queue: list[Directive] = field(default_factory=list)
    open: int | None = None
    next_k: int = 1
    park_at: int | None = None
    """Boundary of a committed freeze not yet released: every rank parks there, so later
    proposals take effect there too."""
    parked: bool = False
    attempts: int = 0
    after: int = 0
    """The next proposal's boundary must exceed this (a rank was past the last one)."""
    failed: list[Directive] = field(default_factory=list)


class Agreement:
    """One rank's end of the protocol: ``arrive`` / ``due`` / ``depart`` at boundaries, ``propose``
    on rank 0. ``ops`` serves short calls from any thread; ``waits`` only the watcher thread's
    blocking waits (two connections, so a waiting watcher never delays a training thread)."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        ops: Store,
        waits: Store,
        *,
        decide_timeout_s: float = 10.0,
        max_attempts: int = 5,
        wait_chunk_s: float = WAIT_CHUNK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self._ops, self._waits = ops, waits
        self.decide_timeout_s, self.max_attempts, self.wait_chunk_s = (
            decide_timeout_s,
            max_attempts,
            wait_chunk_s,
        )
        self._clock = clock
        self._cv = threading.Condition()
        self._io = threading.Lock()  # one call at a time on the ``ops`` connection
        self.pos = 0
        """Boundaries this rank has arrived at (the same count on every rank)."""
        self.standing = False
        self._open: Proposal | None = None  # promised, undecided
        self._due: deque[Proposal] = deque()  # committed, not applied yet
        self._broken: BaseException | None = None
        self._closed = False
        self._watching = ("p", 1)  # the key the watcher waits for: a proposal's, or its decision's
        self._proposer = _Proposer() if rank == 0 else None
        self.stats: dict[str, float] = {"proposed": 0, "committed": 0, "aborted": 0, "waited_s": 0.0}
        self._log = get_logger("supervisor.sdk.agreement", rank=rank)
        self._watcher = threading.Thread(target=self._watch, name=f"control-{rank}", daemon=True)
        self._watcher.start()
        _LIVE.add(self)

    # -- the training thread, at boundaries ------------------------------------------------------
    def arrive(self) -> None:
        """This rank stands at its next boundary."""
        with self._cv:
            self.pos += 1
            self.standing = True

    def due(self, wait_s: float = 0.0) -> list[Directive]:
        """Directives agreed for this boundary, in order; waits for a decision pending here, and
        up to ``wait_s`` for something to become due (a parked rank)."""
        return self._take(leave=False, wait_s=wait_s)

    def depart(self) -> list[Directive]:
        """Leave this boundary, unless something is (or may be) due here: then that, and stay."""
        return self._take(leave=True, wait_s=0.0)

    def _take(self, *, leave: bool, wait_s: float) -> list[Directive]:
        deadline = self._clock() + wait_s
        with self._cv:
            while True:
                if self._broken is not None:
                    raise SupervisorError(
                        f"the ranks' control store failed: {self._broken!r}", field="control"
                    )
                out: list[Directive] = []
                while self._due and self._due[0].at <= self.pos:
                    prop = self._due.popleft()
                    if prop.at < self.pos:  # cannot happen: a promise keeps a rank at E until decided
                        self._log.error("directive agreed for a passed boundary", at=prop.at, pos=self.pos)
                        continue
                    out += prop.directives
                if out:
                    return out
                held = self._open
                if held is not None and held.at == self.pos:
                    now = self._clock()
                    if held.since is None:
                        held.since = now
                    if now - held.since >= self.decide_timeout_s:
                        self._cv.release()
                        try:  # the first decision written wins: a commit already made stays
                            self._decide(held.k, f"{ABORT}:{self.pos}")
                        finally:
                            self._cv.acquire()
                        held.since = now  # waiting again (for the decision) before another try
                    self._cv.wait(min(0.5, self.decide_timeout_s))
                    continue
                if leave:
                    self.standing = False
                    return []
                left = deadline - self._clock()
                if left <= 0:
                    return []
                self._cv.wait(left)

    # -- rank 0 ---------------------------------------------------------------------------------
    def propose(self, directives: list[Directive], *, parked: bool = False) -> None:
        """Queue rank 0's directives for agreement. ``parked``: rank 0 stays at this boundary
        until directives arrive (frozen, or held at the end), so they may take effect here."""
        pr = self._proposer
        if pr is None:
            return
        with self._cv:
            pr.parked = parked
            known = {d.id for d in pr.queue} | {d.id for p in self._pending() for d in p.directives}
            fresh = [d for d in directives if d.id not in known]
            if self._closed:  # training has ended on some rank: nothing can be agreed any more
                pr.failed += fresh
                return
            pr.queue += fresh
            self._propose_next()

    def failed(self) -> list[Directive]:
        """Directives rank 0 gave up agreeing on (``max_attempts`` aborts), once each."""
        pr = self._proposer
        if pr is None:
            return []
        with self._cv:
            out, pr.failed = pr.failed, []
            return out

    def _pending(self) -> list[Proposal]:
        return [p for p in (self._open, *self._due) if p is not None]

    def _boundary_for(self, pr: _Proposer) -> int:
        """Where the next proposal takes effect: a parked boundary (every rank parks there), else
        the boundary after this one (no rank of a synchronous job is past it: each step's
        collectives wait for rank 0) -- or, after ``a`` aborts in a row, ``2**a`` boundaries
        ahead: a rank whose watcher answers later than its training thread passes a boundary (a
        loaded host, steps shorter than a store round trip) is caught up with, not chased."""
        nxt = self.pos if self.standing else self.pos + 1
        if pr.park_at is not None:
            at = pr.park_at
        elif self.standing and pr.parked:
            at = self.pos
        else:
            at = self.pos + (1 << pr.attempts)
        later = max((p.at for p in self._pending()), default=0)
        return max(at, nxt, later, pr.after + 1)

    def _propose_next(self) -> None:
        """(Under the lock.) Propose the queue when no proposal is open."""
        pr = self._proposer
        if pr is None or pr.open is not None or not pr.queue or self._closed:
            return
        batch, pr.queue = pr.queue, []
        k, at = pr.next_k, self._boundary_for(pr)
        pr.next_k += 1
        pr.open = k
        self._open = Proposal(k, at, batch)  # rank 0's own promise, made with the proposal
        body = json.dumps({"at": at, "directives": [d.to_dict() for d in batch]})
        with self._io:
            written = self._ops.compare_set(f"p/{k}", "", body)
        if written != body.encode():  # a rank closed the channel (training ended there)
            self._log.warning("control channel closed: directives not proposed", ids=[d.id for d in batch])
            pr.open, self._open, self._closed = None, None, True
            pr.failed += batch
            return
        self.stats["proposed"] += 1

    def _on_decision(self, prop: Proposal, decision: str) -> None:
        """(Rank 0, under the lock.) Track parking, retry or fail an abort, propose what waits."""
        pr = self._proposer
        assert pr is not None
        pr.open = None
        if decision == COMMIT:
            pr.attempts = 0
            for d in prop.directives:
                if isinstance(d, Freeze):
                    pr.park_at = prop.at
                elif isinstance(d, Continue | Stop):
                    pr.park_at = None
        elif decision == CLOSED_ABORT:  # a rank closed: nothing more will be agreed
            pr.failed += prop.directives + pr.queue
            pr.queue = []
        else:
            pr.attempts += 1
            _, _, past = decision.partition(":")
            pr.after = max(pr.after, int(past) if past.lstrip("-").isdigit() else prop.at)
            if pr.attempts >= self.max_attempts:
                self._log.error(
                    "directives not agreed", attempts=pr.attempts, ids=[d.id for d in prop.directives]
                )
                pr.failed += prop.directives
                pr.attempts = 0
            else:
                pr.queue = prop.directives + pr.queue
        self._propose_next()

    # -- the watcher thread ------------------------------------------------------------------------
    def _watch(self) -> None:
        k = 1
        try:
            while self._wait("p", k):
                body = json.loads(self._waits.get(f"p/{k}"))
                if body.get("closed"):
                    return
                prop = Proposal(k, int(body["at"]), [Directive.from_dict(d) for d in body["directives"]])
                self._answer(prop)
                if not self._wait("d", k):
                    return
                self._decided(prop, self._waits.get(f"d/{k}").decode())
                k += 1
        except Exception as exc:  # the store is gone (rank 0's process, or the job, ended)
            with self._cv:
                if not self._closed:
                    self._broken = exc
                    self._log.warning("control store lost", error=repr(exc))
                self._cv.notify_all()

    def _wait(self, kind: str, k: int) -> bool:
        """Wait for proposal ``k`` (``kind`` "p") or its decision ("d"); False once closed."""
        key = f"{kind}/{k}"
        with self._cv:
            self._watching = (kind, k)
        while not self._closed:
            started = self._clock()
            try:
                self._waits.wait([key], timedelta(seconds=self.wait_chunk_s))
                return True
            except Exception:
                if self._clock() - started < self.wait_chunk_s / 2:
                    raise  # not an expired wait: the store failed
        return False

    def _answer(self, prop: Proposal) -> None:
        """Promise, or decide abort when this rank is past the proposal's boundary."""
        with self._cv:
            own = self._open is not None and self._open.k == prop.k
            nxt = self.pos if self.standing else self.pos + 1
            promise = own or nxt <= prop.at
            if promise and not own:
                self._open = prop
        if not promise:
            self._decide(prop.k, f"{ABORT}:{nxt}")
            return
        with self._io:
            count = self._ops.add(f"y/{prop.k}", 1)
        if count >= self.world_size:
            self._decide(prop.k, COMMIT)

    def _decide(self, k: int, decision: str) -> None:
        with self._io:
            self._ops.compare_set(f"d/{k}", "", decision)

    def _decided(self, prop: Proposal, decision: str) -> None:
        with self._cv:
            held = self._open if self._open is not None and self._open.k == prop.k else None
            if held is not None:
                self._open = None
                if held.since is not None:
                    self.stats["waited_s"] += self._clock() - held.since
            if decision == CLOSED_ABORT:
                self._closed = True  # the watcher ends: another rank ended the channel
            if decision == COMMIT:
                self._due.append(held or prop)
                self.stats["committed"] += 1
            else:
                self.stats["aborted"] += 1
                if held is not None:
                    self._log.info("directives aborted", k=prop.k, at=prop.at, decision=decision)
            if self._proposer is not None:
                self._on_decision(prop, decision)
            self._cv.notify_all()

    # -- closing ----------------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> None:
        """Stop watching, and wait (bounded) until the watcher thread is out of its store call: a
        thread inside a C++ store call when the interpreter finalizes aborts the process when the
        call returns. The watcher is woken by writing what it waits for: an abort of the decision
        it waits for (always safe: the first decision written wins), else a closed marker as the
        next proposal -- which also ends the other ranks' watchers (every rank closes at the end
        of training; rank 0 reports a directive proposed afterwards as failed)."""
        with self._cv:
            if self._closed and not self._watcher.is_alive():
                return
            self._closed = True
            self._cv.notify_all()
        deadline = self._clock() + timeout_s
        while self._watcher.is_alive() and self._clock() < deadline:
            with self._cv:
                kind, k = self._watching
            try:
                if kind == "d":
                    self._decide(k, CLOSED_ABORT)
                else:
                    with self._io:
                        self._ops.compare_set(f"p/{k}", "", CLOSED)
            except Exception as exc:  # the store is gone: the watcher's call fails and it ends
                self._log.debug("control close", error=repr(exc))
            self._watcher.join(0.2)
        _LIVE.discard(self)


_LIVE: weakref.WeakSet[Agreement] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """A probe never closed: its watcher must still leave its store call before finalization."""
    for agreement in list(_LIVE):
        agreement.close(timeout_s=2.0)

"""The ranks' agreement on the boundary where directives take effect (``sdk/agreement.py``).

Ranks are threads, the rendezvous store an in-memory fake that can lose or hold one rank's
promise, and a training step's collective is a ``threading.Barrier``: a rank parked on a freeze
while another waits in the barrier breaks it (a deadlock in a real job).
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import timedelta

import pytest

from supervisor.errors import SupervisorError
from supervisor.sdk.agreement import Agreement
from supervisor.sdk.directives import Continue, Directive, Freeze, Snapshot, Stop


class FakeStore:
    """torch's Store calls the protocol makes, in memory; ``calls`` counts them."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.cv = threading.Condition()
        self.calls = 0
        self.broken = False

    def _check(self) -> None:
        self.calls += 1
        if self.broken:
            raise RuntimeError("connection reset by peer")

    def set(self, key: str, value: str) -> None:
        with self.cv:
            self._check()
            self.data[key] = value.encode()
            self.cv.notify_all()

    def get(self, key: str) -> bytes:
        with self.cv:
            self._check()
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.cv:
            self._check()
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.cv.notify_all()
            return value

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        with self.cv:
            self._check()
            current = self.data.get(key)
            if (current is None and expected == "") or current == expected.encode():
                self.data[key] = desired.encode()
                self.cv.notify_all()
            return self.data.get(key, expected.encode())

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self.cv:
            self._check()
            ok = self.cv.wait_for(
                lambda: self.broken or all(k in self.data for k in keys), timeout.total_seconds()
            )
            if self.broken:
                raise RuntimeError("connection reset by peer")
            if not ok:
                raise RuntimeError("wait timeout")

    def break_(self) -> None:
        with self.cv:
            self.broken = True
            self.cv.notify_all()


class RankView:
    """One rank's connection: it can lose this rank's promise of proposal ``lose``, or hold it
    until ``release`` is set."""

    def __init__(
        self, store: FakeStore, lose: set[int] | None = None, hold: threading.Event | None = None
    ) -> None:
        self.store, self.lose, self.hold = store, lose or set(), hold
        self.held = threading.Event()

    def add(self, key: str, amount: int) -> int:
        k = int(key.split("/")[1])
        if k in self.lose:
            return -1  # the promise never reached the store
        if self.hold is not None:
            self.held.set()
            self.hold.wait(10)
        return self.store.add(key, amount)

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def ranks(n: int, store: FakeStore, views: dict[int, RankView] | None = None, **kw) -> list[Agreement]:
    views = views or {}
    kw.setdefault("decide_timeout_s", 5.0)
    out = []
    for r in range(n):
        view = views.get(r, store)
        out.append(Agreement(r, n, view, store, wait_chunk_s=30.0, **kw))
    return out


def close(ags: list[Agreement]) -> None:
    for a in ags:
        a.close()


def until(pred, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.002)


def step(ags: list[Agreement], who: list[int] | None = None) -> list[list[Directive]]:
    """The ranks in ``who`` arrive at their next boundary; what each applies there."""
    out = []
    for r in who if who is not None else range(len(ags)):
        ags[r].arrive()
        got = ags[r].due()
        while more := ags[r].depart():
            got += more
        out.append(got)
    return out


def test_a_proposal_takes_effect_at_the_next_boundary_on_every_rank():
    store = FakeStore()
    ags = ranks(4, store)
    try:
        for a in ags:
            a.arrive()
        ags[0].propose([Snapshot(id="s1")])
        for a in ags:
            assert a.depart() == []  # proposed for boundary 2, not this one
        got = step(ags)
        assert [[d.id for d in ds] for ds in got] == [["s1"]] * 4
        assert all(a.pos == 2 for a in ags)
    finally:
        close(ags)


def test_idle_boundaries_touch_the_store_not_at_all():
    store = FakeStore()
    ags = ranks(4, store)
    try:
        until(lambda: store.calls >= 4)  # each watcher is waiting for the first proposal
        before = store.calls
        for _ in range(200):
            step(ags)
            ags[0].propose([])
        assert store.calls == before
    finally:
        close(ags)


def test_a_rank_past_the_boundary_aborts_and_rank_0_proposes_a_later_one():
    store = FakeStore()
    ags = ranks(3, store)
    try:
        step(ags, [2])
        step(ags, [2])  # rank 2 left boundary 2: its next is 3
        ags[0].arrive()
        ags[1].arrive()
        ags[0].propose([Freeze(id="fz")])  # for boundary 2: too late for rank 2
        until(lambda: ags[0].stats["aborted"] == 1 and ags[0].stats["proposed"] == 2)
        for a in ags[:2]:
            assert a.depart() == []
        assert step(ags, [0, 1]) == [[], []]  # boundary 2: aborted there, nothing applied
        assert step(ags, [0, 1, 2]) == [[], [], []]  # boundary 3 (rank 2's: 3)
        got = step(ags, [0, 1, 2])  # boundary 4 on ranks 0 and 1, 4 on rank 2: the retry's
        assert [[d.id for d in ds] for ds in got] == [["fz"]] * 3
        assert [a.pos for a in ags] == [4, 4, 4]
    finally:
        close(ags)


class Watched:
    """One rank's connections, with its watcher thread's progress in view (``waiting``: for a key
    not written yet). With ``lag``, the watcher reads each proposal only once its rank has
    passed ``lag`` more boundaries, or the proposal's own (a loaded host, a step far shorter than
    a store round trip)."""

    cv = threading.Condition()  # shared by every rank's view: ``settle`` watches them all

    def __init__(self, store: FakeStore, lag: int = 0) -> None:
        self.store, self.lag = store, lag
        self.rank: Agreement | None = None
        self.awaited: list[str] = []
        """The keys its watcher waits for."""
        self.until: int | None = None
        """The boundary whose passing lets a held read go on (None: no read held)."""

    def wait(self, keys: list[str], timeout: timedelta) -> None:
        with self.cv:
            self.awaited = keys
            self.cv.notify_all()
        try:
            self.store.wait(keys, timeout)
        finally:
            with self.cv:
                self.awaited = []

    def get(self, key: str) -> bytes:
        if self.lag and key.startswith("p/"):
            with self.cv:
                rank, body = self.rank, json.loads(self.store.data[key])
                assert rank is not None
                self.until = min(rank.pos + self.lag, body.get("at", rank.pos))  # "closed": at once
                self.cv.notify_all()
                self.cv.wait_for(lambda: rank.pos >= self.until, 10)
                self.until = None
        return self.store.get(key)

    @classmethod
    def settle(cls, views: list[Watched]) -> None:
        """Wake a watcher whose rank moved on; return once every watcher waits again."""
        with cls.cv:
            cls.cv.notify_all()
            assert cls.cv.wait_for(lambda: all(v.waiting() for v in views), 10)

    def waiting(self) -> bool:
        if self.until is not None:
            assert self.rank is not None
            return self.rank.pos < self.until
        return any(k not in self.store.data for k in self.awaited)

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def test_a_rank_that_keeps_lagging_still_agrees_on_a_boundary_far_enough_ahead():
    """Each proposal reaches rank 1 three boundaries after it was written: a retry for the
    boundary just past the abort is always too late again, so each retry looks further ahead."""
    store = FakeStore()
    views = [Watched(store), Watched(store, lag=3)]
    ags = [Agreement(r, 2, store, views[r], wait_chunk_s=30.0, decide_timeout_s=5.0) for r in range(2)]
    views[1].rank = ags[1]
    try:
        applied: list[tuple[int, int]] = []
        for boundary in range(1, 61):
            for r in (1, 0):  # rank 1 is never behind rank 0
                [got] = step(ags, [r])
                applied += [(r, boundary) for d in got if d.id == "fz"]
                Watched.settle(views)
            if boundary == 1:
                ags[0].propose([Freeze(id="fz")])
                Watched.settle(views)
            if len(applied) == 2:
                break
        assert ags[0].failed() == [], "rank 0 gave up agreeing"
        assert len(applied) == 2 and applied[0][1] == applied[1][1], applied  # both, one boundary
        assert ags[0].stats["aborted"] >= 2
    finally:
        close(ags)


def test_a_rank_at_the_boundary_waits_for_the_decision():
    store = FakeStore()
    hold = threading.Event()
    views = {2: RankView(store, hold=hold)}
    ags = ranks(3, store, views)
    try:
        for a in ags:
            a.arrive()
        ags[0].propose([Stop(id="st")])
        for a in ags:
            a.depart()
        views[2].held.wait(5)  # rank 2's promise is on its way
        ags[0].arrive()
        got: list[list[Directive]] = []
        waiter = threading.Thread(target=lambda: got.append(ags[0].due()))
        waiter.start()
        waiter.join(0.2)
        assert waiter.is_alive() and not got  # rank 0 stands at the boundary, undecided
        hold.set()
        waiter.join(5)
        assert [d.id for d in got[0]] == ["st"]
        assert [[d.id for d in ds] for ds in step(ags, [1, 2])] == [["st"], ["st"]]
    finally:
        hold.set()
        close(ags)


def test_a_lost_promise_aborts_at_the_boundary_after_the_timeout_then_commits_later():
    store = FakeStore()
    views = {3: RankView(store, lose={1})}  # rank 3's promise of the first proposal is lost
    ags = ranks(4, store, views, decide_timeout_s=0.2)
    try:
        for a in ags:
            a.arrive()
        ags[0].propose([Freeze(id="fz")])
        for a in ags:
            a.depart()
        started = time.monotonic()
        assert step(ags) == [[], [], [], []]  # boundary 2: the ranks wait, then one decides abort
        assert time.monotonic() - started >= 0.2
        until(lambda: ags[0].stats["proposed"] == 2)
        got: list[list[Directive]] = []
        for _ in range(3):
            got += step(ags)
        applied = [(i // 4 + 3, r) for i, r in enumerate(got) if r]
        assert len(applied) == 4 and len({b for b, _ in applied}) == 1  # all four, at one boundary
        assert all(a.stats["aborted"] == 1 and a.stats["committed"] == 1 for a in ags)
    finally:
        close(ags)


def test_directives_proposed_while_parked_take_effect_at_the_parked_boundary():
    store = FakeStore()
    ags = ranks(2, store)
    try:
        for a in ags:
            a.arrive()
        ags[0].propose([Freeze(id="fz")])
        for a in ags:
            a.depart()
            a.arrive()
        assert [[d.id for d in a.due()] for a in ags] == [["fz"], ["fz"]]  # both park at boundary 2
        ags[0].propose([Snapshot(id="snap")], parked=True)
        assert [[d.id for d in a.due(2.0)] for a in ags] == [["snap"], ["snap"]]
        ags[0].propose([Continue(id="go")], parked=True)
        assert [[d.id for d in a.due(2.0)] for a in ags] == [["go"], ["go"]]
        assert [a.depart() for a in ags] == [[], []]
        assert all(a.pos == 2 for a in ags)
        ags[0].propose([Snapshot(id="later")])  # released: the next boundary again
        assert [[d.id for d in ds] for ds in step(ags)] == [["later"], ["later"]]
    finally:
        close(ags)


def test_a_lost_store_fails_the_waiting_rank_instead_of_hanging():
    store = FakeStore()
    ags = ranks(2, store, {1: RankView(store, lose={1})}, decide_timeout_s=30.0)
    try:
        for a in ags[:1]:
            a.arrive()
        ags[0].propose([Freeze(id="fz")])
        ags[0].depart()
        ags[0].arrive()
        threading.Timer(0.1, store.break_).start()
        with pytest.raises(SupervisorError, match="control store failed"):
            ags[0].due()
    finally:
        close(ags)


def test_rank_0_closing_releases_a_rank_waiting_at_the_boundary():
    store = FakeStore()
    views = {0: RankView(store, lose={1})}
    ags = ranks(2, store, views, decide_timeout_s=30.0)
    try:
        for a in ags:
            a.arrive()
        ags[0].propose([Freeze(id="fz")])
        ags[1].depart()
        ags[1].arrive()
        threading.Timer(0.1, ags[0].close).start()
        assert ags[1].due() == []  # aborted by rank 0's close, not left waiting 30 s
    finally:
        close(ags)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_rank_waits_in_a_step_while_another_parks(seed):
    """Random directives, freezes and releases among 4 ranks whose steps end in a shared barrier,
    some proposed for the boundary rank 0 stands at (ranks already past it abort them): every rank
    applies the same directives at the same boundaries, and the barrier never breaks."""
    rng = random.Random(seed)
    n, steps = 4, 60
    store = FakeStore()
    # Both limits only turn a deadlock into a failure: no decision here needs its timeout (a late
    # rank aborts at once), and a loaded machine can starve a thread for seconds.
    ags = ranks(n, store, decide_timeout_s=60.0)
    barrier = threading.Barrier(n, timeout=120)
    plan = {b: [Freeze(id=f"fz{b}")] if rng.random() < 0.3 else [Snapshot(id=f"s{b}")]
            for b in range(2, steps - 10, 3)}  # fmt: skip
    logs: list[list[tuple[int, str]]] = [[] for _ in range(n)]
    errors: list[BaseException] = []

    def apply(r: int, ds: list[Directive]) -> None:
        a = ags[r]
        for d in ds:
            logs[r].append((a.pos, d.id))
            if isinstance(d, Freeze):
                parked = 0
                while True:  # parked: what is agreed now takes effect here
                    if r == 0:
                        parked += 1
                        a.propose([Continue(id=f"go-{d.id}")] if parked > 3 else [], parked=True)
                    got = a.due(0.01)
                    logs[r].extend((a.pos, x.id) for x in got)
                    if any(isinstance(x, Continue) for x in got):
                        break

    def run(r: int) -> None:
        a, jitter = ags[r], random.Random(seed * 10 + r)
        try:
            for _ in range(steps):
                a.arrive()
                apply(r, a.due())
                if r == 0:  # half the time for this very boundary: ranks past it abort that
                    a.propose(plan.get(a.pos, []), parked=jitter.random() < 0.5)
                while ds := a.depart():
                    apply(r, ds)
                time.sleep(jitter.random() * 0.002)
                barrier.wait()  # the step's collective
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors
        assert all(log == logs[0] for log in logs)
        ids = {i for _, i in logs[0]}
        assert {d.id for ds in plan.values() for d in ds} <= ids  # every planned directive applied
    finally:
        close(ags)


def test_closing_any_rank_takes_every_watcher_out_of_its_store_call():
    """A watcher inside a store call when the interpreter finalizes aborts the process (SIGABRT at
    the end of a run): closing wakes it, whether it waits for a proposal or for a decision."""
    store = FakeStore()
    ags = ranks(3, store, {2: RankView(store, lose={1})})
    try:
        for a in ags:
            a.arrive()
        ags[0].propose([Snapshot(id="s1")])  # rank 2's promise is lost: the others wait for a decision
        until(lambda: store.data.get("y/1") == b"2")
        ags[1].close()
        assert not ags[1]._watcher.is_alive()
        ags[2].close()
        assert not ags[2]._watcher.is_alive()
        until(lambda: not ags[0]._watcher.is_alive())  # the closed marker ended rank 0's too
        ags[0].propose([Snapshot(id="s2")])
        # the one aborted by the close and the one proposed after it: reported, not lost
        assert [d.id for d in ags[0].failed()] == ["s1", "s2"]
    finally:
        close(ags)

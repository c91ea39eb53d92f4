"""When the data mixture moved: the sources' token shares left every step-to-step difference.

A loader that changes its source weights (a curriculum phase, an annealing mix, a new dataset)
changes the gradients: new data has gradients of its own size, and under Adam the update ratio
rises for as long as the second moment takes to catch up. That is the data's doing, not the
optimizer's, and every record says which sources its tokens came from. ``MixtureWatch`` pools the
shares of the steps since the last move (at most ``POOL``) and calls a move where two steps in a
row differ from that pool (total variation) by more than ``TAIL_MARGIN`` x the largest difference
of any pooled step and by at least ``MIN_MOVE``, and lie nearer each other than the pool: the new
weights, twice. Batches drawn from fixed weights scatter around them, and one odd batch is no new
mix; a loader that serves one source a step scatters by up to the whole mix, so it never moves.
The move is dated at its first step and confirmed one step later, before the gradients' own rise
over three steps can open an incident (``trigger.decide``, rule ``grad``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.core.detect import TAIL_MARGIN

#: The least total variation of a move: under a tenth of the tokens changing source is no new mix.
MIN_MOVE = 0.1
#: Steps pooled before a move can be called (their scatter is the reference), and at most.
MIN_STEPS = 8
POOL = 64
#: Steps kept (with their shares), so a rollback takes back exactly the moves it re-runs.
KEEP = 512
#: Sources tracked by name, the first seen; the tokens of any other are one share (``OTHER``), so a
#: stream of new names keeps a step's cost and the watch's memory bounded.
MAX_SOURCES = 64
OTHER = "\x00other"

Shares = dict[str, float]


@dataclass(frozen=True, slots=True)
class Move:
    step: int
    distance: float  # total variation between the step's shares and the pool's
    scatter: float  # the largest distance of a pooled step
    before: Shares
    after: Shares

    def grown(self) -> str:
        """The source whose share grew the most."""
        return max(self.after, key=lambda k: self.after[k] - self.before.get(k, 0.0))

    def describe(self) -> str:
        names = sorted(set(self.before) | set(self.after))
        moved = [
            (n, self.before.get(n, 0.0), self.after.get(n, 0.0))
            for n in names
            if abs(self.after.get(n, 0.0) - self.before.get(n, 0.0)) >= 0.05
        ]
        parts = ", ".join(f"{n} {100 * b:.0f}% -> {100 * a:.0f}%" for n, b, a in moved)
        return (
            f"the data mixture moved at step {self.step} ({parts} of the tokens; total variation "
            f"{self.distance:.2f}, the steps before it scattered by up to {self.scatter:.2f}): "
            "grad norm and update ratio levels re-form from here, the loss keeps its band"
        )


def shares(sources: Mapping[str, tuple[float, float]], names: set[str] | None = None) -> Shares:
    """Each source's share of the step's tokens (from ``StepSummary.sources``); with ``names``, the
    names tracked (new ones join while there is room), any other source's tokens as ``OTHER``."""
    total = sum(t for t, _ in sources.values() if t > 0)
    if total <= 0:
        return {}
    out: Shares = {}
    for k, (t, _) in sources.items():
        if t <= 0:
            continue
        if names is not None and k not in names:
            if len(names) >= MAX_SOURCES:
                k = OTHER
            else:
                names.add(k)
        out[k] = out.get(k, 0.0) + t / total
    return out


def distance(a: Shares, b: Shares) -> float:
    """Total variation: the share of the tokens that would have to change source."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


class MixtureWatch:
    def __init__(self) -> None:
        self._steps: deque[tuple[int, Shares]] = deque(maxlen=KEEP)
        self._moves: list[int] = []  # steps where the mixture moved, oldest first (within KEEP)
        self._pending: Move | None = None  # the last step, when it left the pool's scatter
        self._pool: deque[Shares] = deque()  # the steps since the last move, at most POOL
        self._sum: Shares = {}  # the pool's shares summed
        self._names: set[str] = set()  # the sources tracked by name (at most MAX_SOURCES)

    def push(self, step: int, sources: Mapping[str, tuple[float, float]]) -> Move | None:
        """This step's shares; the move they confirm, if any (dated at its first step). A step
        without sources breaks nothing."""
        now = shares(sources, self._names)
        if not now:
            return None
        self._steps.append((step, now))
        pending, self._pending = self._pending, None
        if pending is not None and pending.step < step:
            out = self._beyond(step, now, pending.before, pending.scatter)
            if out is not None and distance(pending.after, now) < min(pending.distance, out.distance):
                self._moves = [*self._moves[-(KEEP - 1) :], pending.step]
                self._refill()
                return Move(
                    pending.step,
                    pending.distance,
                    pending.scatter,
                    pending.before,
                    _mean([pending.after, now]),
                )
        if len(self._pool) >= MIN_STEPS:
            ref = {k: v / len(self._pool) for k, v in self._sum.items()}
            if distance(now, ref) >= MIN_MOVE:  # the pool's scatter only for a candidate
                self._pending = self._beyond(step, now, ref, max(distance(x, ref) for x in self._pool))
        self._add(now)
        return None

    @staticmethod
    def _beyond(step: int, now: Shares, ref: Shares, scatter: float) -> Move | None:
        d = distance(now, ref)
        return Move(step, d, scatter, ref, now) if d >= MIN_MOVE and d > TAIL_MARGIN * scatter else None

    def _add(self, now: Shares) -> None:
        if len(self._pool) >= POOL:
            for k, v in self._pool.popleft().items():
                self._sum[k] -= v
                if self._sum[k] <= 1e-12:  # no pooled step names it: a stream of new names stays bounded
                    del self._sum[k]
        self._pool.append(now)
        for k, v in now.items():
            self._sum[k] = self._sum.get(k, 0.0) + v

    def _refill(self) -> None:
        """The pool from the kept steps: those since the last move, at most ``POOL``."""
        since = self._moves[-1] if self._moves else None
        self._pool, self._sum = deque(), {}
        kept = [sh for step, sh in self._steps if since is None or step >= since]
        for sh in kept[-POOL:]:
            self._add(sh)

    def forget_after(self, step: int) -> None:
        while self._steps and self._steps[-1][0] > step:
            self._steps.pop()
        while self._moves and self._moves[-1] > step:
            self._moves.pop()
        self._pending = None
        self._refill()

    def state_dict(self) -> dict[str, Any]:
        p = self._pending
        return {
            # The pool's steps are what a restored watch needs; older ones only made a rollback exact.
            "steps": [[s, sh] for s, sh in list(self._steps)[-POOL:]],
            "moves": self._moves[-16:],
            "pending": [p.step, p.distance, p.scatter, p.before, p.after] if p is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._steps = deque(((int(s), _read(sh)) for s, sh in state.get("steps", [])), maxlen=KEEP)
        self._names = {k for _, sh in self._steps for k in sh if k != OTHER}
        self._moves = [int(s) for s in state.get("moves", [])]
        p = state.get("pending")
        self._pending = Move(int(p[0]), float(p[1]), float(p[2]), _read(p[3]), _read(p[4])) if p else None
        self._refill()


def _mean(items: list[Shares]) -> Shares:
    out: Shares = {}
    for s in items:
        for k, v in s.items():
            out[k] = out.get(k, 0.0) + v
    return {k: v / len(items) for k, v in out.items()}


def _read(shares: dict[str, Any]) -> Shares:
    return {str(k): float(v) for k, v in shares.items()}

"""Which data source does not learn while the others do (``SourceLearning``).

A source that serves garbage from the first steps has no level of its own to jump from: the model
starts at chance on every source, and this one stays there while the others' losses fall. The rule,
its rationale and figures: docs/detection.md, "When an incident opens".
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from supervisor.core.detect import Signals
from supervisor.core.stats import median
from supervisor.core.trigger import SOURCE_PERSIST, YOUNG_JUMP, YOUNG_MAX_SOURCES, source_offsets

FIRST = 5
#: The first appearances whose median is where a source started: at chance, as every source does.
#: A fast run (SGD at a high LR, no warm-up) falls most of the way within ``FIRST`` appearances, so
#: their median sits partway down a fall the source has already made.
START = 3
RECENT = 8
PERSIST = SOURCE_PERSIST
#: The least fall of the other sources' median log loss (a run still learning).
OTHERS_FALL = math.log(1.4)
#: A source whose own fall is at most this share of the others' learned nothing.
STALL_SHARE = 0.1
#: A source whose own fall reached this share of the others' has learned (the sampler's clean
#: sources: a third at the least, while a source of random bytes never passes ``STALL_SHARE``).
LEARNED_SHARE = 1.0 / 3.0
#: Appearances kept per source after its first ones: the recent medians and the onset's look-back.
HISTORY = 64


@dataclass(frozen=True, slots=True)
class Stall:
    name: str
    step: int  # where its offset to the others last left its first offset (the onset)
    loss: float  # its loss there
    before: float  # its own loss level at its first appearances (not log)
    offset: float  # its log offset to the other sources' median at its first appearances
    own_fall: float  # log units, since its first appearances
    others_fall: float


class SourceLearning:
    """Per source: its first appearances and its recent ones, each as (step, own log loss, log
    median of the other sources at that step), and the step where it was first seen to learn."""

    def __init__(self) -> None:
        self.first: dict[str, list[tuple[int, float, float]]] = {}
        self.recent: dict[str, deque[tuple[int, float, float]]] = {}
        self.learned: dict[str, int] = {}

    def push(self, sig: Signals) -> None:
        srcs = sig.summary.sources
        if not 3 <= len(srcs) <= YOUNG_MAX_SOURCES:
            return
        for name in srcs:
            off = source_offsets(sig, name)
            if off is None:
                continue
            row = (sig.step, off[0], off[1])
            first = self.first.get(name)
            if first is None:
                if len(self.first) >= YOUNG_MAX_SOURCES:
                    continue  # a runaway number of source names must not grow memory
                first = self.first[name] = []
            if len(first) < FIRST:
                first.append(row)
                continue
            rows = self.recent.setdefault(name, deque(maxlen=HISTORY))
            rows.append(row)
            if name not in self.learned:
                falls = _falls(first, list(rows))
                if falls and all(o >= OTHERS_FALL and s >= LEARNED_SHARE * o for s, o in falls):
                    self.learned[name] = sig.step

    def stalled(self, step: int) -> Stall | None:
        """The source of step ``step`` that learned nothing at each of its last ``PERSIST`` appearances
        while the others learned (the largest stall when several do)."""
        found: list[Stall] = []
        for name, first in self.first.items():
            rows = list(self.recent.get(name, ()))
            if name in self.learned or not rows or rows[-1][0] != step:
                continue
            falls = _falls(first, rows)
            if falls and all(o >= OTHERS_FALL and s <= STALL_SHARE * o for s, o in falls):
                off0 = median([r[1] - r[2] for r in first])
                at = _onset(rows, off0)
                own0 = median([r[1] for r in first[:START]])
                found.append(Stall(name, at[0], math.exp(at[1]), math.exp(own0), off0, *falls[0]))
        return max(found, key=lambda x: x.others_fall - x.own_fall) if found else None

    def forget_after(self, step: int) -> None:
        """Take back the appearances after ``step`` (a rollback: they are re-run)."""
        for rows in self.recent.values():
            while rows and rows[-1][0] > step:
                rows.pop()
        for name in list(self.first):
            self.first[name] = [r for r in self.first[name] if r[0] <= step]
            if not self.first[name] and not self.recent.get(name):
                del self.first[name]
                self.recent.pop(name, None)
        self.learned = {n: at for n, at in self.learned.items() if at <= step and n in self.first}

    def state_dict(self) -> dict[str, Any]:
        return {
            "first": {n: [list(r) for r in rows] for n, rows in self.first.items()},
            "recent": {n: [list(r) for r in rows] for n, rows in self.recent.items()},
            "learned": dict(self.learned),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.first = {
            n: [(int(a), float(b), float(c)) for a, b, c in rows]
            for n, rows in state.get("first", {}).items()
        }
        self.recent = {
            n: deque(((int(a), float(b), float(c)) for a, b, c in rows), maxlen=HISTORY)
            for n, rows in state.get("recent", {}).items()
        }
        self.learned = {str(n): int(at) for n, at in state.get("learned", {}).items()}


def _falls(
    first: list[tuple[int, float, float]], rows: list[tuple[int, float, float]]
) -> list[tuple[float, float]]:
    """(own fall, others' fall) in log units since the start (``START``), on the medians of the last
    ``PERSIST`` windows of ``RECENT`` appearances (the latest first); none while too few."""
    if len(first) < FIRST or len(rows) < RECENT + PERSIST - 1:
        return []
    own0, others0 = median([r[1] for r in first[:START]]), median([r[2] for r in first[:START]])
    out = []
    for k in range(PERSIST):
        win = rows[len(rows) - RECENT - k : len(rows) - k]
        out.append((own0 - median([r[1] for r in win]), others0 - median([r[2] for r in win])))
    return out


def _onset(rows: list[tuple[int, float, float]], off0: float) -> tuple[int, float]:
    """(step, own log loss) where the source fell behind: the first of the unbroken run, ending at the
    latest appearance, whose offset to the others stood ``YOUNG_JUMP / 2`` above the first offset."""
    at = rows[-1]
    for r in reversed(rows):
        if r[1] - r[2] - off0 < YOUNG_JUMP / 2:
            break
        at = r
    return at[0], at[1]

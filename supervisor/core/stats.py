"""Robust rolling statistics: exact median and MAD over a sliding window, and a trend-aware z-score.

``RollingWindow`` keeps the last ``size`` values in arrival order and sorted (bisect-maintained):
the median is an index, and the MAD is exact in O(log n) (the deviations either side of the median
are two ascending sequences of the sorted list; the MAD is their merged middle element), so
nothing is re-sorted per step. ``LevelTracker``'s *level* is the median of the last few values (it
follows a falling loss), its *noise* the MAD of the residuals ``x - level`` over the long window.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable
from typing import Any

MAX_LOG_EXCESS = 700.0
"""Largest |excess| of a log-scale metric (e^700 ~ 1e304: exp() of it never overflows)."""

#: MAD -> standard deviation for normally distributed data.
MAD_TO_SIGMA = 1.4826


def sorted_median(s: list[float]) -> float:
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else 0.5 * (s[mid - 1] + s[mid])


def sorted_mad(s: list[float], med: float | None = None) -> float:
    """Median absolute deviation of an ascending list, exact, without building the deviations."""
    n = len(s)
    if n < 2:
        return 0.0
    m = sorted_median(s) if med is None else med
    p = bisect.bisect_left(s, m)
    if n % 2:
        return _kth_deviation(s, m, p, n // 2)
    return 0.5 * (_kth_deviation(s, m, p, n // 2 - 1) + _kth_deviation(s, m, p, n // 2))


def _kth_deviation(s: list[float], m: float, p: int, k: int) -> float:
    """The k-th smallest |x - m| of ascending ``s`` split at ``p`` (values below ``m`` are s[:p]),
    searched over the two ascending runs ``m - s[p-1-i]`` and ``s[p+j] - m``. Written out without
    accessor functions: this runs for every tracker on every learned step, where the accessor calls
    were most of the detector's time."""
    na, nb = p, len(s) - p
    lo, hi = max(0, k + 1 - nb), min(k + 1, na)
    while lo < hi:  # i = how many of the k+1 smallest come from below the median
        i = (lo + hi) // 2
        if m - s[p - 1 - i] < s[p + k - i] - m:
            lo = i + 1
        else:
            hi = i
    i, j = lo, k + 1 - lo
    if i == 0:
        return s[p + j - 1] - m
    if j == 0:
        return m - s[p - i]
    return max(m - s[p - i], s[p + j - 1] - m)


class RollingWindow:
    """The last ``size`` finite values, with exact median and MAD (cached: a step reads it several
    times, the window moves at most once)."""

    __slots__ = ("size", "_fifo", "_sorted", "_mad")

    def __init__(self, size: int, values: Iterable[float] = ()) -> None:
        self.size = size
        self._fifo: deque[float] = deque()
        self._sorted: list[float] = []
        self._mad: float | None = None
        for v in values:
            self.push(v)

    def __len__(self) -> int:
        return len(self._fifo)

    def push(self, x: float) -> None:
        self._mad = None
        self._fifo.append(x)
        bisect.insort(self._sorted, x)
        if len(self._fifo) > self.size:
            self._remove(self._fifo.popleft())

    def pop_newest(self) -> None:
        """Take back the most recent value (steps replayed after a rollback)."""
        self._remove(self._fifo.pop())

    def _remove(self, x: float) -> None:
        self._mad = None
        del self._sorted[bisect.bisect_left(self._sorted, x)]

    def clear(self) -> None:
        self._mad = None
        self._fifo.clear()
        self._sorted.clear()

    def median(self) -> float:
        return sorted_median(self._sorted) if self._sorted else math.nan

    def max(self) -> float:
        return self._sorted[-1] if self._sorted else math.nan

    def mad(self) -> float:
        if self._mad is None:
            self._mad = sorted_mad(self._sorted)
        return self._mad

    def values(self) -> list[float]:
        return list(self._fifo)


class LevelTracker:
    """Robust z-scores of one metric against its level (median of ``level_size`` values) and noise
    (``window`` residuals). ``floor`` bounds the noise scale from below, so a flat history does not
    turn a rounding difference into an alarm. The last ``REWIND`` pushes are kept with their steps
    so a rollback can take them back exactly."""

    REWIND = 512

    __slots__ = ("floor", "_level", "_resid", "_hist", "_settle", "_anchor")

    def __init__(self, window: int, level_size: int, floor: float) -> None:
        self.floor = floor
        self._level = RollingWindow(level_size)
        self._resid = RollingWindow(window)
        self._hist: deque[tuple[int, float, bool]] = deque(maxlen=max(level_size, self.REWIND))
        self._settle = 0  # values the level still needs after a re-anchor before it is trusted
        self._anchor: int | None = None  # the step after which the level was re-anchored

    @property
    def history(self) -> int:
        """How many values the level has seen (residuals lag the level by one value)."""
        return len(self._resid) + (1 if len(self._level) else 0)

    def level(self) -> float:
        return self._level.median()

    def scale(self) -> float:
        mad = self._resid.mad() if len(self._resid) >= 2 else 0.0
        return max(MAD_TO_SIGMA * mad, self.floor)

    def excess(self, x: float) -> float:
        """How far ``x`` is above the level, in the metric's units (NaN when there is no level yet)."""
        if not len(self._level) or self._settle:
            return math.nan
        d = x - self._level.median()  # clamped: log-metrics of 1e-300 vs 1e300 once overflowed math.exp
        return d if math.isnan(d) or abs(d) <= MAX_LOG_EXCESS else math.copysign(MAX_LOG_EXCESS, d)

    def unprecedented(self, x: float, margin: float) -> bool:
        """``x``'s residual exceeds ``margin`` x the largest residual in the window (heavy-tail guard)."""
        if not len(self._level) or not len(self._resid) or self._settle:
            return not self._settle
        return x - self._level.median() > margin * max(self._resid.max(), 0.0)

    @property
    def settling(self) -> bool:
        """Re-anchored and the new level is not formed yet: no z, no excess, no tail verdict."""
        return self._settle > 0

    def reanchor(self, step: int) -> None:
        """An intended change moved this metric: drop the level, keep the noise scale. Until the
        level re-forms (``max(3, level_size // 4)`` values) ``z`` and ``excess`` are NaN and no
        residual is learned, so the jump never widens the noise scale."""
        self._level.clear()
        self._settle = max(3, self._level.size // 4)
        self._anchor = step

    def z(self, x: float) -> float:
        """Robust z of ``x``; NaN without history, so a comparison against a threshold is False."""
        if not len(self._level) or self._settle:
            return math.nan
        resid_med = self._resid.median() if len(self._resid) else 0.0
        return (x - self._level.median() - resid_med) / self.scale()

    def push(self, x: float, step: int) -> None:
        if not math.isfinite(x):
            return
        has_resid = bool(len(self._level)) and not self._settle
        if has_resid:
            self._resid.push(x - self._level.median())
        self._level.push(x)
        if self._settle:
            self._settle -= 1
        self._hist.append((step, x, has_resid))

    def forget_after(self, step: int) -> int:
        """Take back values pushed for steps > ``step`` (a rollback replays them); returns how many.
        Exact for the last ``REWIND`` pushes; older history stays."""
        n = 0
        while self._hist and self._hist[-1][0] > step:
            _, _, has_resid = self._hist.pop()
            if has_resid and len(self._resid):
                self._resid.pop_newest()
            n += 1
        if self._anchor is not None and self._anchor >= step:
            self._anchor, self._settle = None, 0  # rewound to before the re-anchor: the old level holds
            n = max(n, 1)
        if n:
            kept = [x for s, x, _ in self._hist if self._anchor is None or s > self._anchor]
            self._level.clear()
            for x in kept[-self._level.size :]:
                self._level.push(x)
            if self._anchor is not None:
                self._settle = max(0, max(3, self._level.size // 4) - len(kept))
        return n

    def reset(self) -> None:
        """Forget everything (after a gap in the log, or when a new level is accepted)."""
        self._level.clear()
        self._resid.clear()
        self._hist.clear()
        self._settle = 0
        self._anchor = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "resid": self._resid.values(),
            "hist": list(self._hist),  # (step, x, has_resid) tuples: JSON arrays, as lists would be
            "floor": self.floor,
            "settle": self._settle,
            "anchor": self._anchor,
            "level": self._level.values(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reset()
        self.floor = float(state.get("floor", self.floor))
        for v in state["resid"]:
            self._resid.push(float(v))
        for step, x, has_resid in state["hist"]:
            self._hist.append((int(step), float(x), bool(has_resid)))
        if "level" in state:  # exact after a re-anchor, whose level is shorter than the history
            for x in state["level"]:
                self._level.push(float(x))
        else:
            for _, x, _ in list(self._hist)[-self._level.size :]:
                self._level.push(x)
        self._settle = int(state.get("settle", 0))
        self._anchor = state.get("anchor")


def median(values: list[float]) -> float:
    """Median of an unsorted list (NaN when empty)."""
    return sorted_median(sorted(values)) if values else math.nan


def safe_log(x: float | None) -> float | None:
    """log(x) for positive finite x; None otherwise (absent, zero, negative or non-finite)."""
    if x is None or not (x > 0.0) or not math.isfinite(x):
        return None
    return math.log(x)

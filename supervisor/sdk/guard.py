"""The ranks' own guard while no supervisor answers: hold at the step boundary on a severe anomaly.

A supervisor that is dead, restarting or cut off watches nothing: ranks that train on through a
fault meanwhile have to re-train everything after it once the supervisor is back and rolls
back. So rank 0 keeps a short robust band (median and MAD) of its own loss and update ratio
(``update_norm / param_norm``) and counts the steps since the supervisor last answered
(``Transport.supervisor_answers``: replies to record batches and directive polls). Once it has
not answered for ``guard_after_steps`` steps *and* ``guard_after_s`` seconds, a step whose loss
is non-finite, or whose loss or update ratio is more than ``guard_z`` robust deviations above
its band, makes every rank hold at the next boundary (a freeze of the ranks' own, broadcast by
rank 0 like the supervisor's). The hold ends when the supervisor answers again -- it then reads
the records the links kept and decides, with the ranks still at the fault -- or after
``guard_hold_s`` (training goes on, and the guard waits for the supervisor to answer before it
holds again). Off with ``sdk.init(..., guard=False)``; never active without a supervisor at the
other end (an offline trace).

Rank 0 decides on what it sees itself: a fault that shows only on another rank's loss is left
to the supervisor (non-finite gradients and the update ratio are shared by data-parallel ranks).
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

#: Freeze ids of the ranks' own hold (``guard-<step>``); its release is ``guard-release-<step>``.
GUARD_ID = "guard-"
#: Healthy steps in the band before a loss or update-ratio excursion counts (non-finite always does).
MIN_BAND = 20
BAND = 200


class Band:
    """Median and MAD of a metric's recent healthy values."""

    def __init__(self) -> None:
        self.values: deque[float] = deque(maxlen=BAND)

    def z(self, x: float) -> float:
        """Robust deviations above the band (0 while the band is short)."""
        if len(self.values) < MIN_BAND:
            return 0.0
        med = statistics.median(self.values)
        mad = statistics.median(abs(v - med) for v in self.values)
        scale = 1.4826 * mad + 1e-6 * (abs(med) + 1e-12)
        return (x - med) / scale


class Guard:
    def __init__(
        self,
        answers: Callable[[], int | None],
        *,
        after_steps: int,
        after_s: float,
        z: float,
        hold_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.answers = answers
        self.after_steps, self.after_s, self.z_limit, self.hold_s = after_steps, after_s, z, hold_s
        self.clock = clock
        self.loss, self.update = Band(), Band()
        self.anomaly: str | None = None
        """Why the newest step is a severe anomaly (None: it is not)."""
        self._seen = answers()
        self._silent_steps = 0
        self._silent_since = clock()
        self._disarmed = False
        self._held_at: float | None = None
        self._held_answers: int | None = None

    # -- records ----------------------------------------------------------------------------
    def observe(self, rec: dict[str, Any]) -> None:
        """One record as it leaves the rank (step records only; a resume starts the band over)."""
        if rec.get("control") or "loss" not in rec:
            return
        events = rec.get("events") or ()
        if "resumed" in events:
            self.loss.values.clear()
            self.update.values.clear()
        loss = _num(rec.get("loss"))
        if loss is None:
            return
        if not math.isfinite(loss) or rec.get("nonfinite"):
            self.anomaly = f"non-finite loss at step {rec.get('step')}"
            return
        why = []
        zl = self.loss.z(loss)
        if zl > self.z_limit:
            why.append(f"loss {loss:.4g} is {zl:.0f} MADs above its band")
        else:
            self.loss.values.append(loss)
        up, par = _num(rec.get("update_norm")), _num(rec.get("param_norm"))
        if up is not None and par and math.isfinite(up):
            ratio = up / par
            zu = self.update.z(ratio)
            if zu > self.z_limit:
                why.append(f"update ratio {ratio:.3g} is {zu:.0f} MADs above its band")
            else:
                self.update.values.append(ratio)
        if why:
            self.anomaly = f"step {rec.get('step')}: " + "; ".join(why)

    # -- boundaries (rank 0) ------------------------------------------------------------------
    def at_boundary(self, heard: bool) -> str | None:
        """Called at each boundary; ``heard``: directives came from the supervisor. Returns why the
        ranks must hold here (None: train on)."""
        now = self.clock()
        answers = self.answers()
        if heard or answers != self._seen:
            self._seen, self._silent_steps, self._silent_since, self._disarmed = answers, 0, now, False
        else:
            self._silent_steps += 1
        anomaly, self.anomaly = self.anomaly, None
        silent = self._silent_steps >= self.after_steps and now - self._silent_since >= self.after_s
        if anomaly is None or not silent or self._disarmed:
            return None
        self._held_at, self._held_answers = now, answers
        return (f"{anomaly}, and no answer from the supervisor for {self._silent_steps} steps "
                f"({now - self._silent_since:.0f}s)")  # fmt: skip

    def release_due(self) -> str | None:
        """While held: why the hold ends now (the supervisor answered, or guard_hold_s passed)."""
        if self._held_at is None:
            return None
        now = self.clock()
        if self.answers() != self._held_answers:
            why = "the supervisor answers again"
        elif now - self._held_at >= self.hold_s:
            why = f"held guard_hold_s={self.hold_s:g}s without an answer from the supervisor"
            self._disarmed = True  # not again until the supervisor has answered
        else:
            return None
        self._held_at = None
        self._seen, self._silent_steps, self._silent_since = self.answers(), 0, now
        return why


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class Watched:
    """The probe's transport, with every record shown to the guard as it leaves the rank."""

    def __init__(self, inner: Any, guard: Guard) -> None:
        self._inner = inner
        self._guard = guard

    def send(self, batch: list[dict[str, Any]]) -> None:
        for rec in batch:
            self._guard.observe(rec)
        self._inner.send(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

"""Benign shifts: the loss level moves up and stays, while grad norm and update ratio stay normal.

A mixture switch to a harder domain looks like this: recorded (``BenignShift``), never an
incident. The test is on the *level* (median of ``level_window`` steps; one high step barely moves
it): risen over ``level_window`` steps beyond its sampling noise and ``min_loss_jump``, with no
gradient push (``grad_z_threshold``) since the old level's window began.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

from supervisor.core.detect import DetectorSettings, Signals
from supervisor.core.model import BenignShift

#: Standard error of a median relative to the noise sigma, for normal data: sqrt(pi / 2).
_MEDIAN_SE = 1.2533


class ShiftWatch:
    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self._hist: deque[tuple[Signals, float]] = deque(maxlen=settings.level_window + 1)
        self._last_push: int | None = None  # the last step whose grad norm / update ratio was out of band

    def cancel(self) -> None:
        self._hist.clear()

    def state_dict(self) -> dict[str, Any]:
        """The steps watched and their levels (their ``Signals`` are the analyzer's lookback buffer's)."""
        return {"hist": [(sig.step, level) for sig, level in self._hist], "last_push": self._last_push}

    def load_state_dict(self, state: dict[str, Any], recent: Sequence[Signals]) -> None:
        """Watch again from the steps ``state`` names, read from the restored ``recent``; a step not
        there (a level window longer than the buffer) starts the watch afresh, as before a restore."""
        by_step = {sig.step: sig for sig in recent}
        hist = [(by_step.get(int(step)), float(level)) for step, level in state.get("hist", [])]
        self._hist.clear()
        if all(sig is not None for sig, _ in hist):
            self._hist.extend(hist)  # type: ignore[arg-type]
        last = state.get("last_push")
        self._last_push = int(last) if last is not None else None

    def observe(self, sig: Signals, recent: Sequence[Signals]) -> BenignShift | None:
        """Called for steps that opened nothing; returns a shift when the level has clearly moved up."""
        st = self.settings
        if self._last_push is not None and sig.step < self._last_push:
            self._last_push = None  # the run went back before it (a rollback)
        if sig.co_z is not None and sig.co_z >= st.grad_z_threshold:
            self._last_push = sig.step
        if not sig.ready or not math.isfinite(sig.loss_excess):
            self.cancel()
            return None
        level = math.log(sig.summary.loss_main) - sig.loss_excess
        self._hist.append((sig, level))
        if len(self._hist) < self._hist.maxlen:  # type: ignore[operator]
            return None
        (old, old_level), (_, new_level) = self._hist[0], self._hist[-1]
        noise = st.band_z * _MEDIAN_SE * math.sqrt(2.0 / st.level_window) * self._sigma(sig)
        delta = new_level - old_level
        if delta < max(noise, math.log1p(st.min_loss_jump)) or delta >= math.log1p(st.benign_max_jump):
            return None
        # Calm gradients since the old level was measured (its median reaches ``level_window`` steps
        # back): an oversized update shows one step ahead of the loss it breaks.
        if self._last_push is not None and self._last_push >= old.step - st.level_window:
            return None
        start = next((s for s, _ in list(self._hist)[1:] if s.loss_z >= st.band_z), self._hist[1][0])
        shift = self._make(start, old, math.exp(old_level), math.exp(new_level), sig)
        self.cancel()
        return shift

    def _sigma(self, sig: Signals) -> float:
        """The loss noise sigma in log units, read back from this step's z and excess."""
        z, floor = sig.loss_z, self.settings.loss_floor
        return max(abs(sig.loss_excess / z), floor) if z and math.isfinite(z) else floor

    def _make(
        self, start: Signals, before_sig: Signals, before: float, after: float, now: Signals
    ) -> BenignShift:
        source, note = _source_note(before_sig, now)
        parts = [f"loss level {before:.3g} -> {after:.3g} (+{100 * (after / before - 1):.0f}%)"]
        if now.grad_excess is not None:
            parts.append(f"grad norm {math.exp(now.grad_excess):.2g}x its level")
        if note:
            parts.append(note)
        return BenignShift(
            step=start.step, metric="loss", before=round(before, 6), after=round(after, 6), source=source,
            note="; ".join(parts),
        )  # fmt: skip


def _source_note(before: Signals, after: Signals) -> tuple[str | None, str]:
    """The source whose token share grew the most between the two steps (a mixture switch)."""
    b, a = before.summary.sources, after.summary.sources
    if not a:
        return None, ""
    tb, ta = sum(t for t, _ in b.values()), sum(t for t, _ in a.values())
    if ta <= 0:
        return None, ""
    grow = {k: a[k][0] / ta - (b[k][0] / tb if k in b and tb > 0 else 0.0) for k in a}
    name = max(grow, key=grow.__getitem__)
    if grow[name] <= 0.05:
        return None, ""
    share_before = b[name][0] / tb if name in b and tb > 0 else 0.0
    return name, f"token share of `{name}` {100 * share_before:.0f}% -> {100 * a[name][0] / ta:.0f}%"

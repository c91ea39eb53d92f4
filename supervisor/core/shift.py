"""Benign shifts: the loss level moves up and stays, while grad norm and update ratio stay normal.

A mixture switch to a harder domain looks like this. It is recorded (``BenignShift``), never
opened as an incident. A calm-gradient loss excess that is gone within ``shift_steps`` steps is
single-step noise of a heavy-tailed loss and leaves no trace at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from supervisor.core.detect import DetectorSettings, Signals
from supervisor.core.model import BenignShift


class ShiftWatch:
    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self.start: Signals | None = None
        self.before: Signals | None = None
        self.count = 0
        self.cooldown_until = -1

    def cancel(self) -> None:
        self.start, self.before, self.count = None, None, 0

    def observe(self, sig: Signals, recent: Sequence[Signals]) -> BenignShift | None:
        """Called for steps that opened nothing; returns a shift once it has lasted long enough."""
        st = self.settings
        co = sig.co_z
        elevated = (
            sig.ready
            and sig.step > self.cooldown_until
            and sig.loss_z >= st.band_z
            and sig.jump >= st.min_loss_jump / 2
            and (co is None or co < st.band_z)
        )
        if not elevated:
            self.cancel()
            return None
        if self.start is None:
            self.start = sig
            self.before = recent[-2] if len(recent) >= 2 else None
        self.count += 1
        if self.count < st.shift_steps:
            return None
        shift = self._make(sig)
        self.cancel()
        # The level catches up within half a level window; until then the same shift would re-trigger.
        self.cooldown_until = sig.step + st.level_window
        return shift

    def _make(self, sig: Signals) -> BenignShift | None:
        assert self.start is not None
        start = self.start
        level = start.summary.loss_main / math.exp(start.loss_excess) if math.isfinite(start.loss_excess) else math.nan
        after = sig.summary.loss_main
        if not (math.isfinite(level) and after / level - 1 < self.settings.benign_max_jump):
            return None
        source, note = self._source_note()
        grad = sig.grad_excess
        note_parts = [f"loss level {level:.3g} -> {after:.3g} (+{100 * (after / level - 1):.0f}%)"]
        if grad is not None:
            note_parts.append(f"grad norm {math.exp(grad):.2g}x its level")
        if note:
            note_parts.append(note)
        return BenignShift(
            step=start.step, metric="loss", before=round(level, 6), after=round(after, 6), source=source,
            note="; ".join(note_parts),
        )  # fmt: skip

    def _source_note(self) -> tuple[str | None, str]:
        """The source whose token share grew the most between before and after the shift."""
        if self.before is None or self.start is None:
            return None, ""
        b, a = self.before.summary.sources, self.start.summary.sources
        if not a or not b:
            return None, ""
        tb, ta = sum(t for t, _ in b.values()), sum(t for t, _ in a.values())
        if tb <= 0 or ta <= 0:
            return None, ""
        grow = {k: a[k][0] / ta - (b[k][0] / tb if k in b else 0.0) for k in a}
        name = max(grow, key=grow.__getitem__)
        if grow[name] <= 0.05:
            return None, ""
        share_before = b[name][0] / tb if name in b else 0.0
        return name, f"token share of `{name}` {100 * share_before:.0f}% -> {100 * a[name][0] / ta:.0f}%"

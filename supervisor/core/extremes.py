"""Judged against the run's own maxima: evidence that needs no mean/sd baseline.

Before ``min_history`` there is no band to be out of, yet the LR (a schedule moves it gradually)
and the update ratio (it follows the LR and the optimizer's state, both built up over steps) move
only gradually: one far above every earlier value is a fault by itself, whatever the loss does yet
(docs/detection.md, "an LR or an update far above every earlier one"). Both are read with the
supervisor's own LR factor divided out. Only the steps that set a new maximum are kept (thinned to
>= 1% growth), so a rollback forgets the abandoned timeline's maxima exactly and memory stays bounded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any

from supervisor.core.stats import median

#: An LR rising this many times the schedule's own step-to-step ratio in one step...
LR_JUMP = 8.0
#: ... to at least this many times every LR the run has used (a restart of a cyclic schedule
#: goes back up to its peak, never above it).
LR_ABOVE_PEAK = 2.0
#: An update this many times every earlier update (relative to the parameter norm).
UPDATE_JUMP = 8.0
#: A warm restart: the LR rises at least this many times the schedule's own step-to-step ratio in
#: one step...
RESTART_RISE = 1.5
#: ... back to between this share of the run's peak LR and that peak: a level the run trained at.
RESTART_FLOOR = 0.5
#: An LR rising this many times the schedule's own step-to-step ratio in one step, reported so too,
#: anywhere but back into a restart's band: a schedule rises abruptly only to restart near its peak
#: (a warm-up, a cyclic schedule rise gradually), so the rise is a fault of the LR by itself.
LR_STEP = 2.0
#: ... above every LR of this many logged steps before it: a ramp back up after a restore (a re-warm,
#: the supervisor's own seen offline) climbs to where the LR was, never past it.
RECENT_LR = 16
#: LRs kept with their steps, so a rollback takes back exactly the steps it re-runs and the ramp
#: after it is compared with the LR before the target.
LR_KEPT = 512
#: Steps with a value before a maximum is a reference.
MIN_SEEN = 3
#: The schedule's own step-to-step ratio: the median over this many logged steps before.
SCHEDULE_STEPS = 3
#: A new maximum is recorded when it grew by at least this factor (bounds the record list).
GROWTH = 1.01
MAX_RECORDS = 4096


@dataclass(frozen=True, slots=True)
class Extreme:
    metric: str  # "lr" | "update_ratio"
    step: int
    value: float
    before: float  # the run's maximum before this step
    ratio: float  # value / before


class _RunMax:
    """The maximum of a positive quantity over the steps seen, with the steps it was set at."""

    def __init__(self) -> None:
        self.records: deque[tuple[int, float, int]] = deque(maxlen=MAX_RECORDS)  # (step, max, seen)
        self.seen = 0

    def peak(self) -> float | None:
        return self.records[-1][1] if self.records else None

    def push(self, step: int, value: float) -> None:
        self.seen += 1
        top = self.peak()
        if top is None or value >= top * GROWTH:
            self.records.append((step, value, self.seen))
        elif value > top:
            s, _, n = self.records[-1]
            self.records[-1] = (s, value, n)

    def forget_after(self, step: int) -> None:
        while self.records and self.records[-1][0] > step:
            self.records.pop()
        # At most one logged step per step number since the first record.
        self.seen = min(self.seen, step - self.records[0][0] + 1) if self.records else 0

    def state_dict(self) -> dict[str, Any]:
        return {"records": [list(r) for r in self.records], "seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = deque(
            ((int(s), float(v), int(n)) for s, v, n in state.get("records", [])), maxlen=MAX_RECORDS
        )
        self.seen = int(state.get("seen", 0))


class RunExtremes:
    """The LR and update-ratio maxima of the run so far, and the LR's recent step-to-step ratios."""

    def __init__(self) -> None:
        self.lr = _RunMax()
        self.update = _RunMax()
        self.lr_steps: deque[tuple[int, float]] = deque(maxlen=SCHEDULE_STEPS)  # (step, lr / lr before)
        self.last_lr: float | None = None
        self.last_raw: float | None = None  # the previous step's LR as reported (factor not divided out)
        self.recent_lr: deque[tuple[int, float]] = deque(maxlen=LR_KEPT)  # (step, lr) of the last steps

    def judge(
        self,
        step: int,
        lr: float | None,
        update_ratio: float | None,
        raw_lr: float | None = None,
        announced: bool = False,
    ) -> Extreme | None:
        """This step against the maxima before it (call before ``push``). An LR jump must show in the
        reported ``raw_lr`` too: one made only by dividing out the supervisor's factor (ranks that did
        not apply a re-warm, the first step after a rollback) is no fault. ``announced``: the job said
        the LR changes at this step (an ``lr_override`` event, another data-parallel degree), so an
        abrupt rise below twice the peak is no fault."""
        if not announced and (stepped := self._stepped(step, lr, raw_lr)) is not None:
            return stepped
        top = self.lr.peak()
        raw_rose = raw_lr is None or (self.last_raw is not None and raw_lr >= LR_ABOVE_PEAK * self.last_raw)
        if (
            lr is not None and lr > 0 and top and raw_rose
            and self.lr.seen >= MIN_SEEN and lr >= LR_ABOVE_PEAK * top
        ):  # fmt: skip
            rise = lr / self.last_lr if self.last_lr else lr / top
            if rise >= LR_JUMP * self._schedule():
                return Extreme("lr", step, lr, top, lr / top)
        top = self.update.peak()
        if (
            update_ratio is not None
            and top
            and self.update.seen >= MIN_SEEN
            and update_ratio >= UPDATE_JUMP * top
        ):
            return Extreme("update_ratio", step, update_ratio, top, update_ratio / top)
        return None

    def restart(self, lr: float | None, raw_lr: float | None = None) -> bool:
        """This step's LR (own factor divided out) rose abruptly back to a level the run has trained
        at (call before ``push``): a cyclic schedule's restart (SGDR), which the update follows by
        design. The rise must show in the reported ``raw_lr`` too."""
        top = self.lr.peak()
        if lr is None or not top or not self.last_lr or self.lr.seen < MIN_SEEN:
            return False
        if raw_lr is not None and not (self.last_raw and raw_lr >= RESTART_RISE * self.last_raw):
            return False
        return (
            lr >= RESTART_RISE * self._schedule() * self.last_lr and RESTART_FLOOR * top <= lr <= top * GROWTH
        )

    def _schedule(self) -> float:
        """The schedule's own step-to-step ratio lately (at least 1: a decay is no rise)."""
        ratios = [r for _, r in self.lr_steps]
        return max(1.0, median(ratios)) if ratios else 1.0

    def push(
        self, step: int, lr: float | None, update_ratio: float | None, raw_lr: float | None = None
    ) -> None:
        if raw_lr is not None and raw_lr > 0:
            self.last_raw = raw_lr
        if lr is not None and lr > 0:
            if self.last_lr:
                self.lr_steps.append((step, lr / self.last_lr))
            self.last_lr = lr
            self.lr.push(step, lr)
            self.recent_lr.append((step, lr))
        if update_ratio is not None and update_ratio > 0:
            self.update.push(step, update_ratio)

    def _stepped(self, step: int, lr: float | None, raw_lr: float | None) -> Extreme | None:
        """An LR that rose ``LR_STEP`` x the schedule's own ratio in one step (reported so too) above
        every LR of the last ``RECENT_LR`` steps, to a level no restart goes back to (``restart``'s
        band): the schedule did not ask for it."""
        top, last = self.lr.peak(), self.last_lr
        if lr is None or lr <= 0 or not top or not last or self.lr.seen < MIN_SEEN:
            return None
        if raw_lr is not None and not (self.last_raw and raw_lr >= LR_STEP * self.last_raw):
            return None
        if lr < LR_STEP * self._schedule() * last or RESTART_FLOOR * top <= lr <= top * GROWTH:
            return None
        recent = [v for _, v in islice(reversed(self.recent_lr), RECENT_LR)]
        if not recent or lr <= GROWTH * max(recent):
            return None
        return Extreme("lr", step, lr, last, lr / last)

    def forget_after(self, step: int) -> None:
        self.lr.forget_after(step)
        self.update.forget_after(step)
        while self.lr_steps and self.lr_steps[-1][0] > step:
            self.lr_steps.pop()
        while self.recent_lr and self.recent_lr[-1][0] > step:
            self.recent_lr.pop()
        self.last_lr = self.last_raw = None  # the restored step's LR comes with its first record

    def state_dict(self) -> dict[str, Any]:
        return {
            "lr": self.lr.state_dict(),
            "update": self.update.state_dict(),
            "lr_steps": [list(r) for r in self.lr_steps],
            "last_lr": self.last_lr,
            "recent_lr": [list(r) for r in list(self.recent_lr)[-RECENT_LR:]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr.load_state_dict(state.get("lr", {}))
        self.update.load_state_dict(state.get("update", {}))
        self.lr_steps = deque(
            ((int(s), float(r)) for s, r in state.get("lr_steps", [])), maxlen=SCHEDULE_STEPS
        )
        self.recent_lr = deque(((int(s), float(v)) for s, v in state.get("recent_lr", [])), maxlen=LR_KEPT)
        last = state.get("last_lr")
        self.last_lr = float(last) if last is not None else None

"""Per-step detection: all ranks' records of one step -> a summary -> robust signals.

The comparisons, all linear in the number of ranks (temporal on aggregates, one ``LevelTracker``
each in log space; cross-rank; the worst rank against its own band): docs/detection.md, "Method"
and "Which rank moved". ``Detector.score`` reads; ``Detector.learn`` writes. The analyzer decides what is learned
(nothing while an incident is open, so a divergence never becomes the new normal).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict, Field

from supervisor.config.detector import DetectorKnobs
from supervisor.core.stats import MAD_TO_SIGMA, LevelTracker, RollingWindow, median, safe_log, sorted_median
from supervisor.core.summary import StepSummary, summarize

__all__ = ["Detector", "DetectorSettings", "Signals", "StepSummary", "rank_rose", "summarize"]


#: A single-signal alarm (loss alone, or one rank alone) must also beat the window's largest residual
#: by this factor: heavy-tailed healthy losses produce big robust z routinely, never values far beyond
#: all of the last ``window`` steps. No effect on Gaussian noise (window maximum ~3.2 sigma).
TAIL_MARGIN = 1.5

#: Learned steps whose per-rank losses are kept for each rank's own band (``own_band``).
RANK_OWN = 64
#: Fewest residuals of its own before a rank's band is trusted; with fewer it is unknown.
RANK_OWN_MIN_RESID = 8
#: Most per-rank values in the saved state (64 steps of 256 ranks; it is written every half second).
#: Beyond it they are re-learned after a restore, the split between ranks deciding alone meanwhile.
RANK_OWN_STATE = 16_384


class DetectorSettings(DetectorKnobs):
    """Detection and diagnosis thresholds. Robust-z means |x - level| / (1.4826 MAD of residuals).

    The knobs a job.yaml sets (window, min_history, the z thresholds) are ``DetectorKnobs``'s, one
    definition for both; the rest are the engine's own."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    band_z: float = Field(default=3.0, gt=0, description="A quantity is out of its band above this robust-z.")
    level_window: int = Field(default=16, ge=1, description="Steps whose median is a metric's current level.")
    min_loss_jump: float = Field(
        default=0.05, ge=0, description="Smallest relative loss excess that can open an incident."
    )
    loss_only_jump: float = Field(
        default=0.5, ge=0, description="Relative loss excess that opens without co-moving grads."
    )
    benign_max_jump: float = Field(
        default=0.5, ge=0, description="A sustained level change below this is a benign shift."
    )
    loss_floor: float = Field(
        default=0.005, gt=0, description="Lower bound of the loss noise scale (log units)."
    )
    grad_floor: float = Field(
        default=0.05, gt=0, description="Lower bound of grad norm / update ratio noise (log units)."
    )
    rank_floor: float = Field(
        default=0.01, gt=0, description="Lower bound of the cross-rank spread (log units)."
    )
    confirm_steps: int = Field(
        default=3, ge=0, description="Steps after detection before an incident is ready to act on."
    )
    transient_steps: int = Field(
        default=5, ge=1, description="Back in band within this many steps of the peak: transient."
    )
    close_steps: int = Field(default=3, ge=1, description="Consecutive in-band steps that close an incident.")
    max_incident_steps: int = Field(
        default=400, ge=10, description="An incident still open after this many steps closes."
    )
    lookback: int = Field(
        default=16, ge=1, description="Steps searched back for the first abnormal quantity."
    )
    resume_window: int = Field(
        default=5, ge=0, description="Onset within this many steps of a `resumed` event: after_resume."
    )
    gap_factor: float = Field(
        default=4.0, gt=1, description="A step gap this many logging intervals wide resets history."
    )
    period_tolerance: int = Field(
        default=1, ge=0, description="Steps of slack when matching recurring onsets."
    )

    @classmethod
    def from_telemetry(cls, telemetry: Any, **overrides: Any) -> DetectorSettings:
        """Build from a job.yaml ``telemetry`` section (any object with the same attribute names)."""
        kw = {
            n: getattr(telemetry, n)
            for n in DetectorKnobs.model_fields
            if getattr(telemetry, n, None) is not None
        }
        kw.update(overrides)
        return cls(**kw)


@dataclass(slots=True)
class Signals:
    """Robust z-scores of one step against history (NaN where a metric has no history)."""

    summary: StepSummary
    ready: bool
    loss_z: float  # of the trusted loss (token-weighted when possible)
    loss_excess: float  # log(trusted loss) - its level
    reported_z: float  # of the reported (plain-mean) loss
    grad_z: float | None
    grad_excess: float | None
    update_z: float | None
    update_excess: float | None
    loss_unprecedented: bool  # residual beyond TAIL_MARGIN x the largest in the window
    rank_unprecedented: bool
    rank_z: float | None  # worst rank's excess over the others, in units of the typical cross-rank spread
    rank_tail_z: float | None  # the same excess against its own history (the per-step maximum has a tail)
    source_z: dict[str, float]
    lr_ratio: float | None  # this step's lr / the previous step's, the supervisor's own scaling divided out
    lr_norm: float | None = None  # this step's lr with the supervisor's own scaling divided out
    #: log(lr) over its level at the steps the update ratio's level was measured on (every optimizer's
    #: update follows the LR), and the update ratio's robust z per unit of LR (where the LR rose).
    lr_excess: float | None = None
    update_lr_z: float | None = None
    loss_trend: tuple[float, float, float] | None = None  # (level - level W ago, the W before, their noise)
    rank_history: int = 0  # steps in the cross-rank spread window (the within-step baseline's depth)
    #: Sources of ``source_z`` scored against their own history: name -> log excess over their own level.
    source_own: dict[str, float] = field(default_factory=dict)
    #: The worst rank's own learned log losses (oldest first), where it stands out; None elsewhere.
    rank_own_hist: list[float] | None = None
    _own: tuple[tuple[float, float] | None] | None = None  # rank_own's result, once asked

    def rank_own(self, level_window: int, floor: float) -> tuple[float, float] | None:
        """``own_band`` of the worst rank where it stands out (None elsewhere), computed on first use:
        most steps' rules never ask."""
        hist, w = self.rank_own_hist, self.summary.worst_rank
        if hist is None or w is None:
            return None
        if self._own is None:
            self._own = (own_band(hist, self.summary.rank_log_loss[w], level_window, floor),)
        return self._own[0]

    @property
    def step(self) -> int:
        return self.summary.step

    @property
    def co_z(self) -> float | None:
        """The strongest co-moving optimizer signal (grad norm or update ratio), None if neither is logged."""
        vals = [v for v in (self.grad_z, self.update_z) if v is not None and not math.isnan(v)]
        return max(vals) if vals else None

    @property
    def jump(self) -> float:
        """Relative loss excess over the level (0.5 = 50% above)."""
        if not math.isfinite(self.loss_excess) or self.loss_excess > 700:  # expm1 overflows past ~709
            return math.inf
        return math.expm1(self.loss_excess)


def own_band(vals: list[float], x: float, level_window: int, floor: float) -> tuple[float, float] | None:
    """(log excess over its own level, robust z) of ``x`` against one rank's learned log losses
    ``vals`` (oldest first), as ``LevelTracker.z``: the level is the median of the last
    ``level_window``, the noise the MAD of each earlier value's residual against the
    ``level_window`` before it, centred on their median. None with too few residuals."""
    n = len(vals)
    if n < level_window + RANK_OWN_MIN_RESID:
        return None
    win = sorted(vals[:level_window])  # the sliding level window, kept sorted
    resid = []
    for i in range(level_window, n):
        resid.append(vals[i] - sorted_median(win))
        del win[bisect.bisect_left(win, vals[i - level_window])]
        bisect.insort(win, vals[i])
    center = median(resid)
    scale = max(MAD_TO_SIGMA * median([abs(r - center) for r in resid]), floor)
    excess = x - sorted_median(win)
    return excess, (excess - center) / scale


def rank_rose(sig: Signals, st: DetectorSettings) -> bool:
    """The worst rank's own loss left its own band upward (``band_z`` and ``min_loss_jump``), or it
    has no band yet. A split says ranks differ, not which one moved: when one of 2 ranks draws an
    easy batch, the other becomes the "worst" at its usual loss. Only a rank that rose is named."""
    own = sig.rank_own(st.level_window, st.loss_floor)
    if own is None:
        return True
    excess, z = own
    return z >= st.band_z and excess >= math.log1p(st.min_loss_jump)


def _unscaled(x: float | None, mult: float) -> float | None:
    """``x`` with the supervisor's own LR factor divided out; None where the factor is zero (no update)."""
    if x is None or mult == 1.0:
        return x
    return x / mult if mult > 0 else None


class Detector:
    """Holds the rolling statistics; turns a ``StepSummary`` into ``Signals``."""

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        s = settings
        self.loss = LevelTracker(s.window, s.level_window, s.loss_floor)
        self.reported = LevelTracker(s.window, s.level_window, s.loss_floor)
        self.grad = LevelTracker(s.window, s.level_window, s.grad_floor)
        self.update = LevelTracker(s.window, s.level_window, s.grad_floor)
        self.tokens = LevelTracker(s.window, s.level_window, s.grad_floor)
        #: log LR at the steps the update ratio was learned: the LR its level was measured at.
        self.lr = LevelTracker(s.window, s.level_window, s.grad_floor)
        self.sources: dict[str, LevelTracker] = {}
        self.spread = RollingWindow(s.window)
        self.worst = RollingWindow(s.window)
        self.rank_steps: deque[int] = deque(maxlen=LevelTracker.REWIND)  # steps of spread/worst pushes
        #: (step, rank -> log loss) of the last ``RANK_OWN`` learned steps: each rank's own band.
        self.rank_losses: deque[tuple[int, dict[int, float]]] = deque(maxlen=RANK_OWN)
        #: (step, loss level) after each learned step: a rise slow enough for the level to follow it
        #: step by step still shows as two consecutive windows that both went up.
        self.levels: deque[tuple[int, float]] = deque(maxlen=2 * settings.level_window + 1)
        self.last_lr: float | None = None
        self.last_step: int | None = None
        self.intervals = RollingWindow(16)

    # -- reading -------------------------------------------------------------------------
    def score(self, s: StepSummary, lr_mult: float = 1.0) -> Signals:
        """``lr_mult``: the supervisor's own LR factor at this step, divided out of the LR and the
        update ratio (proportional to it), so an intended change never reads as a jump."""
        log_main = safe_log(s.loss_main)
        log_rep = safe_log(s.loss)
        lr, upd = _unscaled(s.lr, lr_mult), _unscaled(s.update_ratio, lr_mult)
        lg, lu = safe_log(s.grad_norm), safe_log(upd)
        lr_log = safe_log(lr)
        lr_exc = upd_lr_z = None
        if lr_log is not None and self.lr.history and lu is not None and self.update.history:
            e = self.lr.excess(lr_log)
            if math.isfinite(e):
                lr_exc = e
                upd_lr_z = self.update.z(lu - max(e, 0.0))
        rank_z = rank_tail_z = None
        rank_new = True
        if s.rank_spread is not None and s.worst_rank is not None:
            typical = self.spread.median() if len(self.spread) else s.rank_spread
            scale = max(MAD_TO_SIGMA * typical, self.settings.rank_floor)
            rank_z = s.worst_dev / scale
            # With many ranks the worst of them is always far out; compare it with the usual worst too.
            if len(self.worst) >= 2:
                tail = max(MAD_TO_SIGMA * self.worst.mad(), self.settings.rank_floor)
                rank_tail_z = (s.worst_dev - self.worst.median()) / tail
                rank_new = s.worst_dev > TAIL_MARGIN * max(self.worst.max(), 0.0)
        # Only where the worst rank stands out (every rule that reads it asks for that first).
        own_hist = None
        st, w = self.settings, s.worst_rank
        if w is not None and rank_z is not None and rank_z >= min(st.band_z, st.rank_z_threshold / 2):
            own_hist = [v for _, d in self.rank_losses if (v := d.get(w)) is not None]
        src_z: dict[str, float] = {}
        own: dict[str, float] = {}
        for name, (_tok, loss) in s.sources.items():
            tr = self.sources.get(name)
            lv = safe_log(loss)
            if lv is None:
                continue
            # A source with no history of its own is compared with the global level and noise.
            if tr is not None and tr.history >= self.settings.min_history:
                src_z[name] = tr.z(lv)
                own[name] = tr.excess(lv)
            else:
                src_z[name] = self.loss.z(lv)
        return Signals(
            summary=s,
            ready=self.loss.history >= self.settings.min_history,
            loss_z=self.loss.z(log_main) if log_main is not None else math.inf,
            loss_excess=self.loss.excess(log_main) if log_main is not None else math.inf,
            reported_z=self.reported.z(log_rep) if log_rep is not None else math.inf,
            grad_z=self.grad.z(lg) if lg is not None and self.grad.history else None,
            grad_excess=self.grad.excess(lg) if lg is not None and self.grad.history else None,
            update_z=self.update.z(lu) if lu is not None and self.update.history else None,
            update_excess=self.update.excess(lu) if lu is not None and self.update.history else None,
            loss_unprecedented=log_main is None or self.loss.unprecedented(log_main, TAIL_MARGIN),
            rank_unprecedented=rank_new,
            rank_z=rank_z,
            rank_tail_z=rank_tail_z,
            source_z=src_z,
            lr_ratio=(lr / self.last_lr) if lr is not None and self.last_lr else None,
            lr_norm=lr,
            lr_excess=lr_exc,
            update_lr_z=upd_lr_z,
            loss_trend=self._trend(),
            rank_history=len(self.spread),
            source_own=own,
            rank_own_hist=own_hist,
        )

    def trend_start(self) -> int | None:
        """Where a slow rise began: the last step whose level was at the window's base (within one
        noise unit), less half a level window (a median lags a rise by that much)."""
        t = self._trend()
        if t is None:
            return None
        base, se = self.levels[0][1], t[2]
        at_base = [step for step, lv in self.levels if lv <= base + se]
        return max(self.levels[0][0], at_base[-1] - self.settings.level_window // 2)

    def _trend(self) -> tuple[float, float, float] | None:
        lv = self.levels
        if len(lv) < lv.maxlen or lv[-1][0] - lv[0][0] > 2 * (lv.maxlen - 1):  # type: ignore[operator]
            return None  # too short, or spread over a gap
        w = self.settings.level_window
        l2, l1, l0 = lv[0][1], lv[w][1], lv[-1][1]
        # Standard error of the difference of two medians of w values: sqrt(2) * 1.2533 * sigma / sqrt(w).
        se = 1.2533 * math.sqrt(2.0 / w) * self.loss.scale()
        return l0 - l1, l1 - l2, se

    def is_gap(self, step: int) -> bool:
        """A jump in step numbers much wider than the usual logging interval: history before it is stale."""
        if self.last_step is None or step <= self.last_step:
            return False
        usual = self.intervals.median() if len(self.intervals) else 1.0
        return step - self.last_step > self.settings.gap_factor * max(usual, 1.0)

    # -- writing -------------------------------------------------------------------------
    def advance(self, s: StepSummary, lr_mult: float = 1.0) -> None:
        """Book-keeping done for every step, learned or not: the step clock and the LR reference."""
        if self.last_step is not None and s.step > self.last_step:
            self.intervals.push(float(s.step - self.last_step))
        self.last_step = s.step
        lr = _unscaled(s.lr, lr_mult)
        if lr is not None:
            self.last_lr = lr

    def learn(self, s: StepSummary, lr_mult: float = 1.0) -> None:
        """Add a normal step to the windows (``lr_mult`` as in ``score``)."""
        step = s.step
        upd = _unscaled(s.update_ratio, lr_mult)
        if safe_log(upd) is not None:  # the LR at the same steps as the update ratio's level
            lr_log = safe_log(_unscaled(s.lr, lr_mult))
            if lr_log is not None:
                self.lr.push(lr_log, step)
        for tracker, value in (
            (self.loss, s.loss_main),
            (self.reported, s.loss),
            (self.grad, s.grad_norm),
            (self.update, upd),
            (self.tokens, s.tokens),
        ):
            lv = safe_log(value)
            if lv is not None:
                tracker.push(lv, step)
                if tracker is self.loss and not tracker.settling:
                    self.levels.append((step, tracker.level()))
        if s.rank_spread is not None:
            self.spread.push(s.rank_spread)
            self.worst.push(s.worst_dev)
            self.rank_steps.append(step)
        if s.rank_log_loss:
            self.rank_losses.append((step, s.rank_log_loss))  # never written after summarize
        for name, (_tok, loss) in s.sources.items():
            lv = safe_log(loss)
            if lv is None:
                continue
            tr = self.sources.get(name)
            if tr is None:
                if len(self.sources) >= 256:  # a runaway number of source names must not grow memory
                    continue
                tr = self.sources[name] = LevelTracker(
                    self.settings.window, self.settings.level_window, self.settings.loss_floor
                )
            tr.push(lv, step)

    def _trackers(self) -> dict[str, LevelTracker]:
        """Every tracker by its name in the saved state (the order is the state's)."""
        names = ("loss", "reported", "grad", "update", "tokens", "lr")
        return {n: getattr(self, n) for n in names} | {f"source:{k}": v for k, v in self.sources.items()}

    def reanchor(self, step: int, metrics: tuple[str, ...]) -> None:
        """An intended change (a new clip, an LR override, other data) moves these metrics' levels:
        each re-forms from the steps after ``step`` while its noise scale is kept."""
        trackers = self._trackers()
        for name in metrics:
            if name in trackers:
                trackers[name].reanchor(step)
        if "update" in metrics and "lr" not in metrics:  # the LR level stays aligned with the update's
            self.lr.reanchor(step)
        if "lr" in metrics:
            self.last_lr = None  # the LR before the change is no reference for the one after

    def reset(self) -> None:
        """Forget all history (a gap in the log: what came before is not this run's recent past)."""
        for tr in self._trackers().values():
            tr.reset()
        self.sources.clear()
        self.spread.clear()
        self.worst.clear()
        self.rank_steps.clear()
        self.rank_losses.clear()
        self.levels.clear()
        self.last_lr = None

    def forget_after(self, step: int) -> None:
        for tr in self._trackers().values():
            tr.forget_after(step)
        while self.levels and self.levels[-1][0] > step:
            self.levels.pop()
        while self.rank_steps and self.rank_steps[-1] > step and len(self.spread) and len(self.worst):
            self.rank_steps.pop()
            self.spread.pop_newest()
            self.worst.pop_newest()
        while self.rank_losses and self.rank_losses[-1][0] > step:
            self.rank_losses.pop()
        self.last_step = step
        self.last_lr = None  # the LR of a later step is no reference for the replayed one

    def state_dict(self) -> dict[str, Any]:
        return {
            "trackers": {k: v.state_dict() for k, v in self._trackers().items()},
            "spread": self.spread.values(),
            "worst": self.worst.values(),
            "rank_steps": list(self.rank_steps),
            # (step, {rank: value}) pairs as they are: JSON writes them as [step, {"rank": value}].
            "rank_losses": list(self.rank_losses)
            if sum(len(d) for _, d in self.rank_losses) <= RANK_OWN_STATE
            else [],
            "levels": list(self.levels),
            "intervals": self.intervals.values(),
            "last_lr": self.last_lr,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        s = self.settings
        self.sources = {}
        for name, st in state["trackers"].items():
            if name.startswith("source:"):
                tr = self.sources[name[len("source:") :]] = LevelTracker(
                    s.window, s.level_window, s.loss_floor
                )
            else:
                tr = self._trackers()[name]
            tr.load_state_dict(st)
        self.spread = RollingWindow(s.window, state.get("spread", []))
        self.worst = RollingWindow(s.window, state.get("worst", []))
        self.rank_steps = deque((int(x) for x in state.get("rank_steps", [])), maxlen=LevelTracker.REWIND)
        self.intervals = RollingWindow(16, state.get("intervals", []))
        self.rank_losses = deque(
            (
                (int(step), {int(k): float(v) for k, v in d.items()})
                for step, d in state.get("rank_losses", [])
            ),
            maxlen=RANK_OWN,
        )
        self.levels = deque(
            ((int(a), float(b)) for a, b in state.get("levels", [])), maxlen=2 * s.level_window + 1
        )
        self.last_lr = state.get("last_lr")
        self.last_step = state.get("last_step")

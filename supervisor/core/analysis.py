"""The streaming analyzer: all ranks' records of a step in, incident updates out.

Online the runtime calls ``observe_step`` after every step and acts on "ready" updates; offline
``analyze_records`` feeds a trace through the same object. Per step: summarize and score the
ranks' records; with an incident open, add the step to it, else ask ``trigger.decide`` (or the
benign-shift watch); learn the step only while no incident is open, so a divergence never
becomes the new normal. An incident's life ("opened" -> "ready" -> "refined" -> "closed"):
docs/detection.md, "Online contract".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal

from supervisor.core.detect import Detector, DetectorSettings, Signals, StepSummary, rank_rose, summarize
from supervisor.core.diagnose import LR_RAISED, MAX_SUSPECTS, Facts, IncidentTrack, lr_still_raised
from supervisor.core.extremes import Extreme, RunExtremes
from supervisor.core.frame import StepFrame
from supervisor.core.interventions import Intervention, Interventions
from supervisor.core.learning import SourceLearning, Stall
from supervisor.core.mixture import MixtureWatch, Move
from supervisor.core.model import BenignShift, Diagnosis, FirstAnomaly
from supervisor.core.periodic import attach_periodic
from supervisor.core.recent import signals_of, signals_state
from supervisor.core.records import Record
from supervisor.core.shift import ShiftWatch
from supervisor.core.summary import nonfinite_origin
from supervisor.core.trigger import (
    RESUME_EVENTS,
    RISE_Z,
    Trigger,
    decide,
    incomplete_resume,
    locate_first,
    misreport_before,
    rise_start,
    standing_misreport,
    young_source_jump,
)
from supervisor.logging import get_logger

UpdateKind = Literal["opened", "ready", "refined", "closed"]

#: Excursions kept for the periodic look-back (at one per step, the last 4,096 steps at least).
EXCURSIONS = 4096
#: Baselines a change of LR, clip or optimizer state moves (the update ratio per unit of LR; the LR
#: reference of the jump test). Grad norm and loss depend on the weights, which a rollback restores.
OPTIMIZER_DERIVED = ("update", "lr")
#: The baselines each override event of a supervised run's trace moves.
EVENT_REANCHORS = {
    "lr_override": ("update", "lr"),
    "grad_clip_override": ("update",),
    "data_override": ("tokens",),
}
#: The baselines a change of the data-parallel degree moves (the global batch changed).
WORLD_SIZE_REANCHORS = ("grad", "update", "tokens")
#: Rules that read the optimizer alone; inside the supervisor's own observation window they open
#: nothing without the loss or a non-finite value (its own fix moves exactly these signals).
OPTIMIZER_ONLY_RULES = frozenset({"grad", "resume"})

#: An LR fault under observation is back when the LR (own factor divided out) jumps, or stands above
#: the LR before its onset, by this share of the fault's size in log units (a x25 fault at x5), and
#: by ``LR_BACK_MIN``x at least: more than a schedule moves in a step (a warm-up doubles it once).
LR_BACK_SHARE = 0.5
LR_BACK_MIN = 2.5
#: The AMP scaler halves its scale at each overflow it skips: this many in a row once the detector
#: has its history (a run's start searches down from the initial scale), or a scale below
#: ``SCALE_FLOOR``, is a loss scale collapsing, no longer the scaler finding its level.
OVERFLOW_RUN = 6
SCALE_FLOOR = 1.0

#: Logged steps before onset whose step-to-step LR ratio gives the schedule's own ramp (``Facts.lr_ramp``).
LR_RAMP_STEPS = 3

#: Steps of loss z kept to date where a sustained rise began (``trigger.rise_start``).
RISE_HISTORY = 256

log = get_logger("supervisor.detect")


@dataclass(frozen=True, slots=True)
class IncidentUpdate:
    kind: UpdateKind
    key: int
    diagnosis: Diagnosis


@dataclass(slots=True)
class AnalysisResult:
    incidents: list[Diagnosis]
    benign_shifts: list[BenignShift] = field(default_factory=list)
    skipped_lines: int = 0

    def to_json(self) -> dict[str, Any]:
        """The stable contract of ``supervisor analyze --json``."""
        return {
            "incidents": [d.to_json() for d in self.incidents],
            "benign_shifts": [b.to_json() for b in self.benign_shifts],
            "skipped_lines": self.skipped_lines,
        }


class StreamingAnalyzer:
    def __init__(self, settings: DetectorSettings | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self.detector = Detector(self.settings)
        self.recent: deque[Signals] = deque(maxlen=self.settings.lookback + 8)
        self.incidents: list[IncidentTrack] = []
        self.open: IncidentTrack | None = None
        self.benign: list[BenignShift] = []
        self.watch = ShiftWatch(self.settings)
        self.last_step: int | None = None
        self.last_resume: int | None = None
        self.known = Interventions()
        #: The target of the supervisor's last rollback (a ``resumed`` right after it is its own
        #: verified restore, no lost state) and the end of the window it observes its fix in (a new
        #: incident there needs the loss or a non-finite value).
        self.own_restore: int | None = None
        self.observe_until: int | None = None
        self.ramp_end: int | None = None
        #: The LR fault being handled (onset, size, LR before it): its return inside the window.
        self.lr_fault: tuple[int, float, float] | None = None
        #: The first step of the current run of overflowed (scaler-skipped) steps, and its length.
        self.overflow_run: tuple[int, int] | None = None
        #: Ranks that reported the last complete step (fewer later: a rank's records were lost).
        self.rank_count = 0
        #: The data-parallel degree the last records named (0: none named one).
        self.world_size = 0
        #: Steps whose loss (or one rank's) left its band, opened or not: a periodic fault's
        #: earlier occurrences under the alarm threshold.
        self.excursions: deque[tuple[int, int | None, float]] = deque(maxlen=EXCURSIONS)
        #: (step, loss z) of recent steps, for dating a slow rise from where it began.
        self.loss_zs: deque[tuple[int, float]] = deque(maxlen=RISE_HISTORY)
        self.learning = SourceLearning()
        self._stall: Stall | None = None
        #: The run's LR and update-ratio maxima (``extremes``), and this step's verdict.
        self.extremes = RunExtremes()
        self.mixture = MixtureWatch()
        self._extreme: Extreme | None = None
        self._restart = False  # this step's LR is a warm restart (``RunExtremes.restart``)
        self._emitted: dict[int, tuple[Any, ...]] = {}
        self._recent_made: dict[int, tuple[Signals, tuple[dict[str, Any], dict[str, Any]]]] = {}

    # -- the loop ------------------------------------------------------------------------
    def observe_step(self, step: int, records: Sequence[Record]) -> list[IncidentUpdate]:
        """Feed all ranks' records of one step; returns what changed."""
        if not records:
            return []
        updates: list[IncidentUpdate] = []
        if self.last_step is not None and step <= self.last_step:
            updates += self._rewind(step - 1)  # a replay nobody announced: same as a rollback
        frame = StepFrame.of(records)
        summary = summarize(step, frame)
        if summary.events & RESUME_EVENTS or incomplete_resume(summary.events):
            self._on_resume(summary.events, step)
        world = max((w for w in frame.col("world_size") if w), default=0)  # 0: none named one
        announced = "lr_override" in summary.events or bool(
            self.world_size and world and world != self.world_size
        )
        self._on_world_size(world, step)
        mult = self.known.lr_multiplier(step)
        if self.detector.is_gap(step):
            updates += self._on_gap(self.detector.score(summary, mult))
        sig = self.detector.score(summary, mult)
        self._restart = self.extremes.restart(sig.lr_norm, summary.lr)
        if self._restart:
            # The schedule sent the LR back up to where the run has trained (a warm restart): the
            # update follows it by design, so its level re-forms from here, as after an LR override.
            # The loss keeps its band: a restart that breaks the loss is an incident.
            self.detector.reanchor(step - 1, ("update",))
            sig = self.detector.score(summary, mult)
            if self.lr_fault is not None and sig.lr_norm is not None:  # the LR the fault is judged against
                onset, size, _before = self.lr_fault
                self.lr_fault = (onset, size, sig.lr_norm)
        moved = self.mixture.push(step, summary.sources)
        if moved is not None:
            sig = self._on_mixture_move(moved, summary, mult)
        self.detector.advance(summary, mult)
        upd = summary.update_ratio / mult if summary.update_ratio is not None and mult > 0 else None
        self._extreme = (
            None if summary.nonfinite else self.extremes.judge(step, sig.lr_norm, upd, summary.lr, announced)
        )
        self.extremes.push(step, sig.lr_norm, upd, summary.lr)
        self.last_step = step
        ranks = len(summary.rank_log_loss) + len(summary.nonfinite_ranks)  # counted by summarize
        missing = ranks < self.rank_count and world != 0 and len(set(frame.col("rank"))) < world
        if not missing:
            self.rank_count = ranks
        if not summary.nonfinite and missing:
            # A rank's records stopped (its process exited, or they are late): the step's mean,
            # tokens and cross-rank spread are over fewer ranks. A worker failure is the runtime's
            # incident, never a loss spike: the step is neither evidence nor baseline.
            return updates
        self._count_overflow(sig)
        self.recent.append(sig)
        self.learning.push(sig)
        self.loss_zs.append((step, sig.loss_z))
        self._note_excursion(sig)
        if self.open is not None:
            updates += self._continue(self.open, sig)
        else:
            updates += self._maybe_open(sig)
        if self.open is None:
            self.detector.learn(summary, mult)
        self._reanchor_on_events(summary.events, step)
        if self.ramp_end is not None and step >= self.ramp_end:
            # The re-warm is over: Adam's update per unit of LR drifted while the steps were small,
            # so the regime after it is judged against itself. The LR reference stays: the ramp's
            # factor is divided out, so a jump at its end (a bug at the onset it was sized to) is one.
            self.ramp_end = None
            self.detector.reanchor(step, ("update",))
        return updates

    def _on_mixture_move(self, moved: Move, summary: StepSummary, mult: float) -> Signals:
        """The sources' token shares moved (``core/mixture.py``): the gradients follow the data by
        design, so their levels re-form from here, as after an LR override. The loss keeps its band,
        and the run's extremes still judge the LR and the update."""
        self.detector.reanchor(moved.step - 1, ("grad", "update"))
        grown = moved.grown()
        self.benign.append(
            BenignShift(
                step=moved.step, metric="token_shares", before=round(moved.before.get(grown, 0.0), 6),
                after=round(moved.after.get(grown, 0.0), 6), source=grown, note=moved.describe(),
            )
        )  # fmt: skip
        return self.detector.score(summary, mult)

    def _on_world_size(self, world: int, step: int) -> None:
        """The records name another data-parallel degree (a group restarted on fewer ranks, an
        elastic run): the global batch changed, and with it the mean gradient's noise, the update
        and a step's tokens. Their levels re-form from this step on; their noise scales are kept."""
        if not world:
            return
        if self.world_size and world != self.world_size:
            self.detector.reanchor(step - 1, WORLD_SIZE_REANCHORS)
        self.world_size = world

    def _on_resume(self, events: set[str], step: int) -> None:
        """A restore. Within ``resume_window`` steps of the supervisor's own rollback target it is
        that verified rollback: no evidence of a lost state, its optimizer baselines re-anchored. A
        ``resume_incomplete`` event is a fact, whatever the optimizer's dynamics show."""
        own = self.own_restore is not None and 0 < step - self.own_restore <= self.settings.resume_window + 1
        if incomplete_resume(events) or not own:
            self.last_resume = step
        if own:
            self.detector.reanchor(step - 1, OPTIMIZER_DERIVED)

    def _note_excursion(self, sig: Signals) -> None:
        st, s = self.settings, sig.summary
        rank_out = sig.rank_z is not None and sig.rank_z >= st.rank_z_threshold / 2 and rank_rose(sig, st)
        loss_out = sig.loss_z >= max(st.band_z, st.z_threshold / 2) and sig.jump >= st.min_loss_jump
        if s.nonfinite or loss_out or rank_out:
            excess = sig.loss_excess if math.isfinite(sig.loss_excess) else 10.0
            if rank_out and s.worst_rank is not None:
                excess = max(excess, s.worst_dev)
            self.excursions.append((sig.step, s.worst_rank if rank_out else None, excess))

    def _maybe_open(self, sig: Signals, found: Trigger | None = None) -> list[IncidentUpdate]:
        """Open the incident this step's evidence makes (``found``: the trigger, already decided)."""
        trig = found or self._vetted(decide(sig, self.recent, self.settings), sig)
        ext = self._extreme
        if trig is None or not trig.immediate:
            if self._lr_back(sig):
                trig = Trigger("lr", True)  # the first abnormal quantity of the fault under observation
            elif self._scale_collapsing(sig):
                trig = Trigger("overflow", True)
            # The LR is a fact of the recipe (the supervisor's own factor divided out); an update
            # ratio is the optimizer's: judged so only while there is no band to judge it in, and
            # inside the window of the supervisor's own fix it needs the loss.
            elif ext is not None and ext.metric == "lr":
                trig = Trigger("lr", True)
            elif ext is not None and not sig.ready and not self.observing(sig.step):
                trig = Trigger("update", True)
        stall = self.learning.stalled(sig.step) if trig is None else None
        self._stall = stall if stall is not None and stall.name in sig.source_z else None
        if self._stall is not None:
            trig = Trigger("source", False, self._stall.name)
        elif trig is None and sig.ready and standing_misreport(sig, self.recent) and not self._said_metric():
            # Said once a run, against a band (the run's first steps are no reference for anything
            # else the incident would cite); a later onset has a band to leave (``decide``).
            trig = Trigger("metric", True)
        if trig is None:
            shift = self.watch.observe(sig, self.recent)
            if shift is not None:
                self.benign.append(shift)
            return []
        self.watch.cancel()
        inc = self._new_incident(sig, trig)
        head, merged = attach_periodic(
            self.incidents, inc, self.settings, self.excursions, self.detector_interval()
        )
        updates = [self._update("closed", m) for m in merged]
        if head is not inc:
            head.observe(sig, self._in_band(head, sig), self.settings)
            self.open = head
            return updates + [self._update("refined", head)]
        self.incidents.append(inc)
        self.open = inc
        inc.observe(sig, self._in_band(inc, sig), self.settings)
        updates.append(self._update("opened", inc))
        if trig.immediate or self.settings.confirm_steps == 0:
            inc.ready = True
            updates.append(self._update("ready", inc))
        return updates

    def _said_metric(self) -> bool:
        """An incident of this run already said the logged loss is wrong (kept across a restart)."""
        return any(inc.facts.trigger == "metric" for inc in self.incidents)

    def _lr_back(self, sig: Signals) -> bool:
        """Inside the window of a fix of an LR fault, the LR (own factor divided out, exactly known)
        jumped, or stands at or after the onset far above the LR before it: the fault is back,
        whatever the loss does yet (SGD can carry a x20 LR for many steps before the loss shows it)."""
        if self.lr_fault is None or sig.lr_norm is None or not self.observing(sig.step):
            return False
        onset, size, before = self.lr_fault
        limit = max(LR_BACK_MIN, size**LR_BACK_SHARE)
        # A warm restart jumps too, back to a level the run trained at: the schedule, not the fault
        # (and from it on, the LR the fault is judged against).
        jumped = sig.lr_ratio is not None and sig.lr_ratio >= limit and not self._restart
        return jumped or (sig.step >= onset and before > 0 and sig.lr_norm >= limit * before)

    def _count_overflow(self, sig: Signals) -> None:
        s, run = sig.summary, self.overflow_run
        if not s.overflow or s.nonfinite:
            self.overflow_run = None
        elif (
            run is None
            or not self.recent
            or self.recent[-1].step != run[0] + (run[1] - 1) * self.detector_interval()
        ):
            self.overflow_run = (s.step, 1)  # the previous logged step did not overflow: a new run
        else:
            self.overflow_run = (run[0], run[1] + 1)

    def _scale_collapsing(self, sig: Signals) -> bool:
        """``OVERFLOW_RUN`` overflows in a row once the run has its history, or the scale under
        ``SCALE_FLOOR``; one overflow now and then is the scaler working."""
        run, s = self.overflow_run, sig.summary
        if run is None:
            return False
        floor = s.loss_scale is not None and s.loss_scale < SCALE_FLOOR
        return floor or (sig.ready and run[1] >= OVERFLOW_RUN)

    def _arm_lr_fault(self) -> None:
        """When the incident acted on (the newest) has an LR that jumped or rose, watch for its return."""
        self.lr_fault = None
        inc = self.open or (self.incidents[-1] if self.incidents else None)
        before = inc.facts.lr_before if inc is not None else None
        if inc is None or before is None or before[1] <= 0:
            return
        f = inc.facts
        size = max(f.lr_jump[1] if f.lr_jump else 0.0, f.lr_rise[1] if f.lr_rise else 0.0)
        if size >= LR_RAISED:
            self.lr_fault = (inc.onset_step, size, before[1])

    def _vetted(self, trig: Trigger | None, sig: Signals) -> Trigger | None:
        """Drop a trigger the supervisor's own intervention explains: an update-ratio jump after its
        own verified rollback, an optimizer-only signal inside its observation window."""
        if trig is None or trig.immediate:
            return trig
        step = sig.step
        if trig.rule == "resume" and (
            self.last_resume is None or not 0 <= step - self.last_resume <= self.settings.resume_window + 1
        ):
            return None
        if trig.rule in OPTIMIZER_ONLY_RULES and self.observing(step):
            return None
        return trig

    def _continue(self, inc: IncidentTrack, sig: Signals) -> list[IncidentUpdate]:
        st = self.settings
        fault = self._training_fault(sig) if inc.facts.trigger == "metric" else None
        if fault is not None:
            # The logging was at fault and the training is now: a fault of its own, which the
            # metric incident (dismissed, alert only) must not carry away with it.
            inc.end_step = inc.trajectory[-1].step if inc.trajectory else inc.onset_step
            return self._close(inc) + self._maybe_open(sig, fault)
        inc.observe(sig, self._in_band(inc, sig), st)
        updates: list[IncidentUpdate] = []
        if not inc.ready and sig.step - inc.detected_step >= st.confirm_steps * self.detector_interval():
            inc.ready = True
            updates.append(self._update("ready", inc))
        if inc.in_band_run >= st.close_steps:
            inc.end_step = inc.trajectory[-inc.in_band_run].step
            return updates + self._close(inc)
        persisting = inc.trajectory and inc.trajectory[-1].rank_out  # a failing rank: one incident
        if sig.step - inc.facts.occurrences[-1] > st.max_incident_steps and not persisting:
            updates += self._close(inc)
            self.detector.reset()  # a level that never came back is the new normal; relearn it
            self.loss_zs.clear()  # z's against the old level say nothing about the new one
            return updates
        if self._emitted.get(inc.key) != _fingerprint(inc.diagnosis(self.settings)):
            updates.append(self._update("refined", inc))
        return updates

    def _training_fault(self, sig: Signals) -> Trigger | None:
        """The trigger this step opens an incident with on the training's own evidence (any but the
        logged loss's, or an LR far above every earlier one), or None."""
        trig = self._vetted(decide(sig, self.recent, self.settings), sig)
        if trig is not None and trig.rule != "metric":
            return trig
        ext = self._extreme
        return Trigger("lr", True) if ext is not None and ext.metric == "lr" else None

    def _close(self, inc: IncidentTrack) -> list[IncidentUpdate]:
        inc.closed = True
        self.open = None
        if inc.facts.trigger == "metric" and self.last_step is not None:
            self.detector.reanchor(self.last_step, ("reported",))  # a logging error that stays: its new level
        if not inc.ready:
            inc.ready = True
            return [self._update("ready", inc), self._update("closed", inc)]
        return [self._update("closed", inc)]

    def _on_gap(self, sig: Signals) -> list[IncidentUpdate]:
        """Steps are missing: judge an open incident by the first step after the gap, then start afresh."""
        updates: list[IncidentUpdate] = []
        inc = self.open
        if inc is not None:
            if self._in_band(inc, sig):
                inc.observe(sig, True, self.settings)
                inc.end_step = sig.step
            updates += self._close(inc)
        self.detector.reset()
        self.recent.clear()
        self.loss_zs.clear()
        self.watch.cancel()
        return updates

    # -- pieces --------------------------------------------------------------------------
    def detector_interval(self) -> int:
        d = self.detector.intervals
        return max(1, int(round(d.median()))) if len(d) else 1

    def _in_band(self, inc: IncidentTrack, sig: Signals) -> bool:
        s, band = sig.summary, self.settings.band_z
        if s.nonfinite:
            return False
        rule = inc.facts.trigger
        if rule == "metric":
            if sig.reported_z < band and not s.misreported:
                return True
            # A logging error that stays must not hold the incident open for the rest of the run (no
            # other could open): it is over once training itself has been in band for ``lookback``
            # steps since the onset, and the logged loss's level re-forms at the close (``_close``).
            return sig.loss_z < band and sig.step - inc.onset_step >= self.settings.lookback
        if rule == "rank":
            return not (sig.rank_z is not None and sig.rank_z >= band and rank_rose(sig, self.settings))
        if rule == "trend":  # a slow rise: over only once the loss is back near its pre-incident level
            return sig.loss_z < RISE_Z
        if (source_ok := inc.source_in_band(sig, band)) is not None:  # judged on that source
            return source_ok
        if rule == "overflow":  # open while the scaler keeps overflowing
            return not s.overflow and not (sig.loss_z >= band)
        if rule == "lr":  # open while the LR stays raised: one incident while the bug is in the schedule
            return not lr_still_raised(inc) and not (sig.loss_z >= band)
        if rule in ("grad", "resume"):  # open while the optimizer signal is still out of band
            return (sig.co_z or 0.0) < band and sig.loss_z < band
        if rule == "checksum" and s.checksum_minority:
            return False
        if lr_still_raised(inc) and (sig.co_z or 0.0) >= band:
            return False  # the LR that jumped is still up and the updates show it: not over yet
        return not (sig.loss_z >= band)

    def _new_incident(self, sig: Signals, trig: Trigger) -> IncidentTrack:
        st = self.settings
        s = sig.summary
        first = locate_first(self.recent, st, trig.rule, self.detector_interval())
        if trig.rule == "overflow" and self.overflow_run is not None:
            at = next((r for r in self.recent if r.step == self.overflow_run[0]), sig)
            first = FirstAnomaly(step=at.step, metric="loss_scale", value=at.summary.loss_scale)
        ext = self._extreme if trig.rule in ("lr", "update") else None
        if ext is not None and not (trig.rule == "lr" and self.lr_fault is not None):
            first = FirstAnomaly(step=s.step, metric=ext.metric, value=ext.value, baseline=ext.before)
        elif trig.rule == "lr":
            first = FirstAnomaly(
                step=s.step, metric="lr", value=sig.lr_norm, baseline=(self.lr_fault or (0, 0, None))[2]
            )
        # The source fault's own onset: a young run's jump of its source, or where a stall began.
        young = young_source_jump(sig, self.recent) if trig.rule == "source" else None
        found = next((x for x in (young, self._stall) if x is not None and x.name == trig.source), None)
        if found is not None:
            first = FirstAnomaly(
                step=found.step, metric=f"source_loss:{found.name}", value=found.loss, baseline=found.before
            )
        elif trig.source is not None:
            first = self._source_onset(trig.source, first)
        start = self.detector.trend_start() if trig.rule == "trend" else None
        if start is not None and start < first.step:  # a slow rise: its first step is long before any alarm
            first = FirstAnomaly(step=start, metric="loss_level", value=first.value, baseline=first.baseline)
        level = self.detector.loss.level()
        facts = Facts(trigger=trig.rule, baseline_loss=math.exp(level) if math.isfinite(level) else None)
        # A logged loss already off its loss_sum / tokens before this step says nothing about it.
        facts.misreport_known = trig.rule != "metric" and misreport_before(sig, self.recent)
        if trig.source is not None:
            facts.source = (trig.source, sig.source_z[trig.source], s.sources[trig.source][1])
            facts.source_offset = found.offset if found is not None else None
            if isinstance(found, Stall):
                facts.source_stall = (found.own_fall, found.others_fall)
        inc = IncidentTrack(
            key=len(self.incidents) + 1,
            onset_step=first.step,
            detected_step=s.step,
            first_anomaly=first,
            baseline_log=level,
            facts=facts,
        )
        facts.occurrences.append(first.step)
        if first.metric in ("loss", "loss_level"):
            facts.rise_from = rise_start(self.loss_zs, first.step, self.detector_interval())
        if self.last_resume is not None and -1 <= first.step - self.last_resume <= st.resume_window:
            inc.after_resume = True
            facts.resume_step = self.last_resume
        self._localize(inc, sig, first.rank)
        before = [r for r in self.recent if r.step < first.step]
        if before and before[-1].summary.loss_scale is not None:
            facts.loss_scale_drop = (before[-1].summary.loss_scale, before[-1].summary.loss_scale)
        if before and before[-1].lr_norm is not None:
            facts.lr_before = (before[-1].step, before[-1].lr_norm)
            ramp = [r.lr_ratio for r in before[-LR_RAMP_STEPS:] if r.lr_ratio is not None]
            facts.lr_ramp = max(ramp) if ramp else None
        if trig.rule == "lr" and self.lr_fault is not None:
            # The fault's own reference: the LR before its first onset (the step before this one
            # may already run at the raised LR, when the bug is in the schedule of every timeline).
            onset, size, lr_ref = self.lr_fault
            facts.lr_before = (onset - 1, lr_ref)
            if sig.lr_norm is not None and lr_ref > 0 and self.observing(s.step):
                facts.lr_back = (s.step, sig.lr_norm / lr_ref, size, self._rollback_over(onset))
            if sig.lr_ratio is not None and sig.lr_ratio >= LR_RAISED:
                facts.lr_jump = (s.step, sig.lr_ratio)
        elif ext is not None and ext.metric == "lr":
            facts.lr_jump = (s.step, sig.lr_ratio if sig.lr_ratio is not None else ext.ratio)
        elif ext is not None:
            facts.update_spike = (s.step, ext.ratio)
        for r in self.recent:  # the steps between onset and detection belong to the incident too
            if first.step <= r.step < s.step:
                inc.observe(r, self._in_band(inc, r), st)
        return inc

    def _rollback_over(self, onset: int) -> int | None:
        """The target of the supervisor's latest rollback from at or after ``onset`` to before it
        (the one that undid the fault's steps), or None when it acted in place."""
        back = [
            iv for iv in self.known.log if iv.kind == "rollback" and iv.step < onset <= (iv.from_step or 0)
        ]
        return back[-1].step if back else None

    def _source_onset(self, name: str, first: FirstAnomaly) -> FirstAnomaly:
        """The first of the source's latest appearances in a row out of its band (the mixture's loss
        may have stayed in band), unless ``first`` is earlier."""
        band = self.settings.band_z
        start: Signals | None = None
        for r in reversed(self.recent):
            if name not in r.source_own:
                continue
            if not r.source_z[name] >= band:
                break
            start = r
        if start is None or start.step >= first.step:
            return first
        loss = start.summary.sources[name][1]
        z = start.source_z[name]
        return FirstAnomaly(
            step=start.step,
            metric=f"source_loss:{name}",
            value=loss,
            baseline=loss / math.exp(start.source_own[name]),
            z=round(z, 2) if math.isfinite(z) else None,
        )

    def _localize(self, inc: IncidentTrack, sig: Signals, first_rank: int | None) -> None:
        """rank_local / first_rank and the suspect samples (that rank's batch at the first abnormal step)."""
        st, s, f = self.settings, sig.summary, inc.facts
        # Facts that name some ranks, not all: the checksum minority, the misreporting ranks, the
        # ranks whose own loss went non-finite first (not through the all-reduce), any non-finite.
        origin = nonfinite_origin(s) if s.nonfinite_ranks else []
        named = (s.checksum_minority, [m[0] for m in s.misreported], origin, s.nonfinite_ranks)
        ranks = next((r for r in named if 0 < len(r) < s.record_count), None)
        if ranks is not None:
            inc.rank_local, inc.first_rank = True, ranks[0]
        elif (
            f.trigger != "source"  # one source's data: the rank that drew most of it stands out by it
            and s.worst_rank is not None
            and sig.rank_z is not None
            and sig.rank_z >= st.rank_z_threshold
            and rank_rose(sig, st)  # a rank at its own level is not named because another one fell
        ):
            w = s.worst_rank
            worst = s.rank_log_loss[w] - inc.baseline_log
            others = math.log(s.ranks_median_loss) - inc.baseline_log if s.ranks_median_loss else 0.0
            if not math.isfinite(worst) or others < 0.3 * worst:
                inc.rank_local, inc.first_rank = True, w
                f.rank = (s.step, w, math.exp(s.rank_log_loss[w]), s.ranks_median_loss or 0.0)
                f.rank_z = sig.rank_z
        if first_rank is not None and inc.first_rank is None and inc.rank_local:
            inc.first_rank = first_rank
        onset_sig = next((r for r in self.recent if r.step == inc.onset_step), sig)
        rank = inc.first_rank if inc.first_rank is not None else onset_sig.summary.worst_rank
        rec = onset_sig.summary.record_of(rank) if rank is not None else None
        if rec is None and onset_sig.summary.records:
            rec = onset_sig.summary.records[0]
        inc.suspect_samples = list(rec.samples or [])[:MAX_SUSPECTS] if rec is not None else []

    def _update(self, kind: UpdateKind, inc: IncidentTrack) -> IncidentUpdate:
        diag = inc.diagnosis(self.settings)
        self._emitted[inc.key] = _fingerprint(diag)
        # Debug level: offline analysis of a long trace must not flood stderr; the runtime logs its own.
        log.debug(
            f"incident {kind}",
            incident=inc.key,
            step=self.last_step,
            rule=inc.facts.trigger,
            onset=diag.onset_step,
            phenotype=diag.phenotype.value,
            cause=diag.top_cause.value if diag.top_cause else None,
            severity=diag.severity.value,
            z_threshold=self.settings.z_threshold,
            grad_z_threshold=self.settings.grad_z_threshold,
        )
        return IncidentUpdate(kind, inc.key, diag)

    # -- the supervisor's own interventions (docs/detection.md) -----------------------------
    def notify_rollback(
        self,
        to_step: int,
        *,
        from_step: int | None = None,
        reason: str = "",
        observe_steps: int | None = None,
    ) -> list[IncidentUpdate]:
        """Training went back to checkpoint ``to_step`` (an open incident closes). Later steps are
        taken back from every baseline, so re-run steps meet the history before the target, and
        overrides noted at or after it are dropped (the workers restore the target's own)."""
        self.known.add(
            Intervention("rollback", to_step, from_step=from_step or self.last_step, reason=reason)
        )
        updates = self._rewind(to_step)
        self.own_restore = to_step
        self._arm_lr_fault()
        self._observe(to_step, observe_steps)
        # The restored optimizer state meets a changed LR and data order: re-anchor its baselines.
        self.detector.reanchor(to_step, OPTIMIZER_DERIVED)
        return updates

    def _observe(self, step: int, observe_steps: int | None) -> None:
        """Open (or extend) the window in which the supervisor watches its own fix."""
        n = observe_steps if observe_steps is not None else 2 * self.settings.level_window
        end = step + max(0, self.known.ramp_left(step)) + n
        self.observe_until = (
            max(end, self.observe_until or end) if (self.observe_until or -1) >= step else end
        )

    def observing(self, step: int) -> bool:
        """``step`` lies inside the window of the supervisor's own last fix."""
        return self.observe_until is not None and step <= self.observe_until

    def note_overrides(
        self,
        step: int,
        *,
        lr_scale: float | None = None,
        warmup_steps: int | None = None,
        grad_clip: float | None = None,
        data: bool = False,
        precision: str | None = None,
        reason: str = "",
        observe_steps: int | None = None,
    ) -> None:
        """The supervisor applied overrides after step ``step``, as the SDK's ``ApplyOverrides``
        does (``data``: batches or samples excluded or skipped). Its LR factor is divided out of the
        LR and update ratio, and the baselines the change moves are re-anchored."""
        iv = Intervention(
            "override", step, lr_scale=lr_scale, warmup_steps=warmup_steps, grad_clip=grad_clip,
            data=data, reason=reason,
        )  # fmt: skip
        self.known.add(iv)
        lr_changed = lr_scale is not None or bool(warmup_steps)
        metrics = (OPTIMIZER_DERIVED if lr_changed or grad_clip is not None else ()) + (
            ("tokens",) if data else ()
        )
        if precision is not None:  # other rounding: every level moves a little, the loss scale too
            metrics += ("loss", "reported", "grad") + OPTIMIZER_DERIVED
        if metrics:
            self.detector.reanchor(step, metrics)
        if warmup_steps:
            self.ramp_end = step + warmup_steps
        if self.lr_fault is None or not self.observing(step):
            self._arm_lr_fault()
        self._observe(step, observe_steps)

    def lr_multiplier(self, step: int) -> float:
        """The supervisor's own LR factor at ``step`` (1.0 when it changed nothing)."""
        return self.known.lr_multiplier(step)

    @property
    def interventions(self) -> list[Intervention]:
        return list(self.known.log)

    def _reanchor_on_events(self, events: set[str], step: int) -> None:
        """Offline traces of supervised runs carry the overrides as events: re-anchor on them too,
        unless the supervisor already said so through ``note_overrides``."""
        told = any(x.kind == "override" and step - 2 <= x.step <= step for x in self.known.log)
        if told or not events:
            return
        metrics = tuple(dict.fromkeys(m for e, ms in EVENT_REANCHORS.items() if e in events for m in ms))
        if metrics:
            self.detector.reanchor(step, metrics)

    def _rewind(self, to_step: int) -> list[IncidentUpdate]:
        """Forget steps after ``to_step`` so their replay is not counted twice."""
        updates: list[IncidentUpdate] = []
        if self.open is not None:
            updates += self._close(self.open)
        self.detector.forget_after(to_step)
        self.learning.forget_after(to_step)
        self.extremes.forget_after(to_step)
        self.mixture.forget_after(to_step)
        self.benign = [b for b in self.benign if b.step <= to_step]  # the abandoned timeline's
        while self.recent and self.recent[-1].step > to_step:
            self.recent.pop()
        while self.loss_zs and self.loss_zs[-1][0] > to_step:
            self.loss_zs.pop()
        while self.excursions and self.excursions[-1][0] > to_step:
            self.excursions.pop()
        self.watch.cancel()
        self.last_step = to_step
        return updates

    def finish(self) -> AnalysisResult:
        """Close what is still open (end unknown) and return the final diagnoses."""
        if self.open is not None:
            self._close(self.open)
        incidents = [inc.diagnosis(self.settings) for inc in self.incidents if inc.merged_into is None]
        return AnalysisResult(incidents=incidents, benign_shifts=list(self.benign))

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume as if the analyzer had never stopped: its windows, and the
        short lookback buffer (``core.recent``)."""
        return {
            "version": 2,
            "detector": self.detector.state_dict(),
            "interventions": self.known.state_dict(),
            "incidents": [inc.state_dict() for inc in self.incidents],
            "open": self.open.key if self.open is not None else None,
            "benign": [b.to_json() for b in self.benign],
            **{name: getattr(self, name) for name in _PLAIN_STATE},
            "world_size": self.world_size,
            "lr_fault": list(self.lr_fault) if self.lr_fault is not None else None,
            "excursions": [list(e) for e in self.excursions],
            "learning": self.learning.state_dict(),
            "extremes": self.extremes.state_dict(),
            "mixture": self.mixture.state_dict(),
            "recent": self._recent_state(),
            "loss_zs": list(self.loss_zs),
            "watch": self.watch.state_dict(),
        }

    def _recent_state(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The lookback buffer as ``core.recent`` saves it, each step's entry made once: the same
        tuple while the step stays in the buffer (``runtime.state.BufferJSON`` reuses its text)."""
        made = self._recent_made
        self._recent_made = {
            id(sig): (
                sig,
                made[id(sig)][1] if id(sig) in made and made[id(sig)][0] is sig else signals_state(sig),
            )
            for sig in self.recent
        }
        return [entry for _, entry in self._recent_made.values()]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.detector.load_state_dict(state["detector"])
        self.incidents = [IncidentTrack.from_state(d) for d in state["incidents"]]
        key = state.get("open")
        self.open = next((i for i in self.incidents if i.key == key), None)
        self.benign = [BenignShift(**b) for b in state.get("benign", [])]
        for name in _PLAIN_STATE:
            setattr(self, name, state.get(name))
        self.world_size = int(state.get("world_size") or 0)
        lf = state.get("lr_fault")
        self.lr_fault = (int(lf[0]), float(lf[1]), float(lf[2])) if lf else None
        self.known.load_state_dict(state.get("interventions", []))
        self.excursions = deque(
            ((int(s), r, float(x)) for s, r, x in state.get("excursions", [])), maxlen=EXCURSIONS
        )
        self.learning.load_state_dict(state.get("learning", {}))
        self.extremes.load_state_dict(state.get("extremes", {}))
        self.mixture.load_state_dict(state.get("mixture", {}))
        self.recent.clear()
        self.recent.extend(signals_of(entry) for entry in state.get("recent", []))
        self.loss_zs.clear()
        self.loss_zs.extend((int(step), float(z)) for step, z in state.get("loss_zs", []))
        self.watch.load_state_dict(state.get("watch", {}), self.recent)
        self._emitted = {i.key: _fingerprint(i.diagnosis(self.settings)) for i in self.incidents}


#: Steps kept in ``state_dict`` as they are (int or None).
_PLAIN_STATE = ("last_step", "last_resume", "own_restore", "observe_until", "ramp_end")


#: What makes a diagnosis worth a "refined" update.
_fingerprint = attrgetter(
    "phenotype", "top_cause", "severity", "rank_local", "source_local", "nonfinite", "period", "end_step"
)


def group_steps(records: Iterable[Record]) -> Iterable[tuple[int, list[Record]]]:
    """Consecutive records of the same step, in trace order (a step number going back is a replay)."""
    step: int | None = None
    batch: list[Record] = []
    for rec in records:
        if step is not None and rec.step != step:
            yield step, batch
            batch = []
        step = rec.step
        batch.append(rec)
    if step is not None and batch:
        yield step, batch


def trace_order(records: Iterable[Record]) -> list[Record]:
    """Records in the order to feed them: as written when a (rank, step) pair repeats (a replay
    after a rollback), else by step, stably (a step going back means per-rank blocks)."""
    recs = list(records)
    seen: set[tuple[int, int]] = set()
    monotonic, last = True, None
    for r in recs:
        key = (r.rank, r.step)
        if key in seen:
            return recs
        seen.add(key)
        if last is not None and r.step < last:
            monotonic = False
        last = r.step
    return recs if monotonic else sorted(recs, key=lambda r: r.step)


def analyze_records(records: Iterable[Record], settings: DetectorSettings | None = None) -> AnalysisResult:
    """Offline analysis: the streaming analyzer fed step by step."""
    analyzer = StreamingAnalyzer(settings)
    for step, batch in group_steps(trace_order(records)):
        analyzer.observe_step(step, batch)
    return analyzer.finish()

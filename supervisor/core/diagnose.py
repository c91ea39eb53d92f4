"""One incident from onset to close: the facts gathered step by step, and the diagnosis made of them.

An ``IncidentTrack`` only accumulates facts as ``Signals`` arrive; phenotype (``classify``), causes
(``causes.rank_causes``) and severity are pure functions of them, recomputed on every diagnosis, so
the preliminary diagnosis at "opened" is refined into the final one without special cases.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from supervisor.core.causes import calm_grads, rank_causes, typical_step
from supervisor.core.detect import DetectorSettings, Signals, rank_rose
from supervisor.core.model import Diagnosis, FirstAnomaly, Phenotype, Severity
from supervisor.core.trigger import YOUNG_JUMP, incomplete_resume, source_offsets

#: Most sample IDs kept as suspects (a global bad step on 1,024 ranks must not carry them all).
MAX_SUSPECTS = 32


@dataclass(slots=True)
class Point:
    """One step of an incident's trajectory."""

    step: int
    excess: float  # log(loss) - pre-incident level; inf when non-finite
    loss: float
    in_band: bool
    nonfinite: bool
    grad: float | None = None  # grad norm / its level
    update: float | None = None  # update ratio / its level
    loss_in_band: bool = True  # the loss alone (the phenotype is the loss curve's shape)
    rank_out: bool = False  # the incident's rank still stands out from the others (loss or fingerprint)
    lr: float | None = None  # the step's learning rate (the supervisor's own scaling divided out)


@dataclass(slots=True)
class Facts:
    """Everything the cause ranking may cite. Numbers, never prose; prose is made in causes.py."""

    trigger: str = "loss"
    baseline_loss: float | None = None  # pre-incident loss level (not log)
    peak_loss: float | None = None
    grad_known: bool = False
    grad_ratio_at_peak: float | None = None  # grad norm / its level at the loss peak
    update_ratio_at_peak: float | None = None
    update_spike: tuple[int, float] | None = None  # (step, ratio) of the largest update-ratio excess
    lr_jump: tuple[int, float] | None = None  # (step, lr / previous lr)
    lr_before: tuple[int, float] | None = None  # (step, lr) just before onset
    lr_rise: tuple[int, float] | None = None  # (step, lr / lr before onset), the largest rise
    #: The largest step-to-step LR ratio of the steps just before onset (the schedule's own ramp,
    #: e.g. a warm-up's): a rise after onset counts only at steps that rose faster than it.
    lr_ramp: float | None = None
    #: An LR fault the supervisor acted on, back after its fix: (step, the LR's factor over the LR
    #: before the fault's first onset with the supervisor's own factor divided out, the factor it
    #: had the first time, the rollback target or None when the fix was applied in place).
    lr_back: tuple[int, float, float, int | None] | None = None
    nonfinite_step: int | None = None
    nonfinite_at: str | None = None
    nonfinite_ranks: list[int] = field(default_factory=list)
    #: Non-finite steps seen, and how many of them were not skipped (the SDK's
    #: ``step_skipped_nonfinite`` event or the AMP scaler's overflow skip: no weights changed).
    nonfinite_steps: int = 0
    nonfinite_applied: int = 0
    rose_before_nonfinite: bool = False
    overflow_steps: int = 0
    first_overflow: int | None = None
    scale_drop_step: int | None = None  # first step whose loss scale is below the pre-incident one
    loss_scale_drop: tuple[float, float] | None = None  # (before, lowest)
    rank: tuple[int, int, float, float] | None = None  # (step, rank, its loss, ranks' median)
    rank_z: float | None = None
    checksum: tuple[int, list[int]] | None = None  # (first step, minority ranks)
    misreport: tuple[int, int, float, float] | None = None  # (step, rank, reported, recomputed)
    misreport_known: bool = False  # the logged loss was off before the onset: not this incident's evidence
    reported_vs_true: tuple[int, float, float] | None = None  # (step, reported mean, token-weighted)
    collapse: tuple[int, int, float, float] | None = None  # (step, rank, tokens, median tokens)
    batch_mean: tuple[int, int, float, float] | None = None  # (step, rank, batch_mean_loss, loss)
    source: tuple[str, float, float] | None = None  # (name, z, loss) when one source carries the spike
    #: A young run's source fault (``trigger.young_source_jump``): the source's log offset to the
    #: other sources' median before it jumped (the incident lasts while the offset stays out).
    source_offset: float | None = None
    #: A source that does not learn while the others do (``learning.SourceLearning``): its own
    #: log-loss fall and the other sources' since its first appearances.
    source_stall: tuple[float, float] | None = None
    resume_step: int | None = None
    #: State components a restore said it did not bring back (``resume_incomplete:<component>``).
    resume_missing: list[str] = field(default_factory=list)
    rising_steps: int = 0  # steps after onset that set a new loss peak
    rise_from: int | None = None  # where a sustained rise began, before its first out-of-band step
    occurrences: list[int] = field(default_factory=list)


@dataclass(slots=True)
class IncidentTrack:
    """The detector's mutable state of one incident (one key), open or closed; the stored record
    of an incident, with its timeline, is ``supervisor.incidents.Incident``."""

    key: int
    onset_step: int
    detected_step: int
    first_anomaly: FirstAnomaly
    baseline_log: float  # pre-incident loss level, log units
    facts: Facts
    suspect_samples: list[str] = field(default_factory=list)
    first_rank: int | None = None
    rank_local: bool = False
    after_resume: bool = False
    peak_step: int = 0
    peak_excess: float = -math.inf
    trajectory: list[Point] = field(default_factory=list)
    end_step: int | None = None
    closed: bool = False
    ready: bool = False
    period: int | None = None
    merged_into: int | None = None
    in_band_run: int = 0
    last_phenotype: str | None = None
    last_top: str | None = None

    # -- facts ---------------------------------------------------------------------------
    def observe(self, sig: Signals, in_band: bool, settings: DetectorSettings) -> None:
        s = sig.summary
        excess = sig.loss_excess if not s.nonfinite else math.inf
        grad = math.exp(sig.grad_excess) if sig.grad_excess is not None else None
        upd = math.exp(sig.update_excess) if sig.update_excess is not None else None
        source_ok = self.source_in_band(sig, settings.band_z)  # its curve is that source's loss
        loss_ok = not s.nonfinite and (
            source_ok if source_ok is not None else not sig.loss_z >= settings.band_z
        )
        rank = self.first_rank
        worst = s.worst_rank == rank and sig.rank_z is not None and sig.rank_z >= settings.band_z
        rank_out = (
            self.rank_local
            and rank is not None
            and (
                (worst and rank_rose(sig, settings))  # above its own band, not left there by another's dip
                # Its replica disagrees and its loss shows it: in the step's loss, or in its own against
                # the other ranks' (one rank's drift moves the mean by a 1/N share only).
                or (rank in s.checksum_minority and (sig.loss_z >= settings.band_z or worst))
                or rank in s.nonfinite_ranks
            )
        )
        point = Point(
            s.step, excess, s.loss_main, in_band, s.nonfinite, grad, upd, loss_ok, rank_out, sig.lr_norm
        )
        self.trajectory.append(point)
        if len(self.trajectory) > settings.max_incident_steps + 8:
            del self.trajectory[0]
        self.in_band_run = self.in_band_run + 1 if in_band else 0
        f = self.facts
        if excess > self.peak_excess:
            if len(self.trajectory) > 1:
                f.rising_steps += 1
            self.peak_excess, self.peak_step = excess, s.step
            f.peak_loss = s.loss_main
            f.grad_ratio_at_peak = grad if grad is not None else f.grad_ratio_at_peak
            f.update_ratio_at_peak = upd if upd is not None else f.update_ratio_at_peak
        f.grad_known = f.grad_known or sig.grad_z is not None or sig.update_z is not None
        note_step_facts(f, sig, settings)
        missing = incomplete_resume(s.events)
        if missing and not f.resume_missing:
            f.resume_missing = missing
            f.resume_step = f.resume_step if f.resume_step is not None else s.step
            self.after_resume = True
        if s.nonfinite:
            f.nonfinite_steps += 1
            f.nonfinite_applied += not ("step_skipped_nonfinite" in s.events or s.overflow)
        if s.nonfinite and f.nonfinite_step is None:
            f.nonfinite_step, f.nonfinite_at = s.step, s.nonfinite_at
            f.nonfinite_ranks = list(s.nonfinite_ranks)
            f.rose_before_nonfinite = self.onset_step < s.step - 1 and f.rising_steps >= 1

    def source_in_band(self, sig: Signals, band: float) -> bool | None:
        """A ``source`` incident's source at this step: in its own band, or for a young run's source
        its offset to the other sources back near the one before the jump; None where not judged."""
        f = self.facts
        if f.trigger != "source" or f.source is None:
            return None
        name = f.source[0]
        if name in sig.source_own:
            return not sig.source_z[name] >= band
        if f.source_offset is None or (off := source_offsets(sig, name)) is None:
            return None
        return off[2] - f.source_offset < YOUNG_JUMP / 2

    # -- verdicts ------------------------------------------------------------------------
    def onset(self, phen: Phenotype) -> int:
        """The onset; for a sustained rise first seen in the loss, where that rise began."""
        sustained = phen in (Phenotype.DIVERGENCE, Phenotype.SLOW_RECOVERY) and self.facts.rising_steps >= 2
        first_in_loss = self.first_anomaly.metric in ("loss", "loss_level")
        if sustained and self.facts.rise_from is not None and first_in_loss:
            return min(self.onset_step, self.facts.rise_from)
        return self.onset_step

    def diagnosis(self, settings: DetectorSettings) -> Diagnosis:
        phen = classify(self, settings)
        causes = rank_causes(self, phen, settings)
        nonfinite = self.facts.nonfinite_step is not None
        return Diagnosis(
            onset_step=min(self.onset(phen), self.detected_step),  # never after its own detection
            peak_step=self.peak_step,
            end_step=self.end_step,
            phenotype=phen,
            period=self.period if phen is Phenotype.PERIODIC else None,
            nonfinite=nonfinite,
            nonfinite_at=self.facts.nonfinite_at if nonfinite else None,
            rank_local=self.rank_local,
            first_rank=self.first_rank,
            after_resume=self.after_resume,
            source_local=self.facts.source[0] if self.facts.source else None,
            causes=causes,
            suspect_samples=list(self.suspect_samples),
            severity=severity(self, phen, causes[0].cause.value if causes else None),
            first_anomaly=self.first_anomaly,
            detected_step=self.detected_step,
        )

    def state_dict(self) -> dict[str, Any]:
        """What ``asdict`` gives, built without its deep copies: it is written with every state
        write while an incident is open (``asdict`` took ~40 ms for a 200-step trajectory)."""
        return _plain(self)

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> IncidentTrack:
        d = dict(d)
        d["first_anomaly"] = FirstAnomaly(**d["first_anomaly"])
        facts = dict(d["facts"])
        for k, v in facts.items():
            if isinstance(v, list) and k not in ("nonfinite_ranks", "occurrences", "resume_missing"):
                facts[k] = tuple(v)
        if facts.get("checksum"):
            facts["checksum"] = (facts["checksum"][0], list(facts["checksum"][1]))
        d["facts"] = Facts(**facts)
        d["trajectory"] = [Point(**p) for p in d["trajectory"]]
        return cls(**d)


def _plain(v: Any) -> Any:
    """A dataclass as ``dataclasses.asdict`` renders it, for values whose leaves are immutable."""
    t = type(v)
    if t in _LEAVES:
        return v
    if t is list:
        return [_plain(x) for x in v]
    if t is tuple:
        return tuple(_plain(x) for x in v)
    if t is dict:
        return {_plain(k): _plain(x) for k, x in v.items()}
    if is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in fields(v)}
    return copy.deepcopy(v)


_LEAVES = frozenset((int, float, str, bool, type(None)))


def note_step_facts(f: Facts, sig: Signals, settings: DetectorSettings) -> None:
    """Record the first occurrence of each kind of evidence seen at this step."""
    s = sig.summary
    if s.checksum_minority and f.checksum is None:
        f.checksum = (s.step, list(s.checksum_minority))
    if s.misreported and f.misreport is None and not f.misreport_known:
        rank, rep, true = max(s.misreported, key=lambda m: abs(m[1] - m[2]))
        f.misreport = (s.step, rank, rep, true)
    if (
        s.loss_true is not None
        and f.reported_vs_true is None
        and not f.misreport_known
        and math.isfinite(s.loss)
        and s.loss > s.loss_true * (1 + settings.min_loss_jump)
        and sig.reported_z >= settings.z_threshold
    ):
        f.reported_vs_true = (s.step, s.loss, s.loss_true)
    if s.collapsed_ranks and f.collapse is None:
        rank, tok, med = min(s.collapsed_ranks, key=lambda c: c[1])
        f.collapse = (s.step, rank, tok, med)
    if s.batch_mean_gap is not None and f.batch_mean is None:
        rank, bm, loss = s.batch_mean_gap
        if bm > loss * (1 + 2 * settings.min_loss_jump):
            f.batch_mean = (s.step, rank, bm, loss)
    if s.overflow:
        f.overflow_steps += 1
        if f.first_overflow is None:
            f.first_overflow = s.step
    if s.loss_scale is not None:
        before = f.loss_scale_drop[0] if f.loss_scale_drop else s.loss_scale
        if s.loss_scale < before and f.scale_drop_step is None:
            f.scale_drop_step = s.step
        lowest = min(f.loss_scale_drop[1] if f.loss_scale_drop else s.loss_scale, s.loss_scale)
        f.loss_scale_drop = (before, lowest)
    # A warm-up rises 1.5x and more in a step by design (2x at its second step): an upward jump or
    # rise counts only at a step faster than the schedule's own ramp before onset. An LR that fell
    # (a step decay's milestone) takes size out of every update: no cause of a loss that rose.
    ratio = sig.lr_ratio or 0.0  # 0: no LR, or none the step before
    jumped = ratio >= 1.5 and ratio > (f.lr_ramp or 1.0) * RAMP_TOL
    if jumped and (f.lr_jump is None or abs(math.log(ratio)) > abs(math.log(f.lr_jump[1]))):
        f.lr_jump = (s.step, ratio)
    faster = ratio > max(1.0, f.lr_ramp or 1.0)
    if faster and sig.lr_norm is not None and f.lr_before is not None and f.lr_before[1] > 0:
        rise = sig.lr_norm / f.lr_before[1]
        if rise >= 1.5 and (f.lr_rise is None or rise > f.lr_rise[1]):
            f.lr_rise = (s.step, rise)
    z, excess = sig.update_z, sig.update_excess
    if lr_scheduled(f) and sig.lr_excess is not None and sig.lr_excess > 0 and excess is not None:
        # Every optimizer family's update follows the LR (Lion lr * sign, Adam ~lr * m / sqrt(v), SGD
        # lr * buf): while the LR moves as scheduled, what counts is the update per unit of LR.
        z, excess = sig.update_lr_z, excess - sig.lr_excess
    if z is not None and excess is not None and z >= settings.grad_z_threshold:
        ratio = math.exp(excess)
        if f.update_spike is None or ratio > f.update_spike[1]:
            f.update_spike = (s.step, ratio)
    _note_source(f, sig, settings)


#: A step's LR ratio within this factor of the schedule's ramp before onset is that ramp (rounding).
RAMP_TOL = 1.05


def lr_scheduled(f: Facts) -> bool:
    """The incident's LR moved as the schedule did before onset (no ``lr_jump``, no ``lr_rise``)."""
    return f.lr_ramp is not None and f.lr_jump is None and f.lr_rise is None


def _note_source(f: Facts, sig: Signals, settings: DetectorSettings) -> None:
    """One source far out of band while every other source of the step stays in band."""
    if len(sig.source_z) < 2 or f.source is not None:
        return
    ranked = sorted(sig.source_z.items(), key=lambda kv: -kv[1] if math.isfinite(kv[1]) else math.inf)
    (name, z), rest = ranked[0], ranked[1:]
    # A source with no baseline of its own is scored against the global level: its usual offset to
    # the other sources (a young run's, whose global noise is small) is no evidence of its own.
    own = name in sig.source_own
    if own and math.isfinite(z) and z >= settings.z_threshold and all(r[1] < settings.band_z for r in rest):
        f.source = (name, z, sig.summary.sources[name][1])


def classify(inc: IncidentTrack, settings: DetectorSettings) -> Phenotype:
    """The phenotype from the trajectory after onset (the shape of the curve, not its cause)."""
    if inc.period is not None:
        return Phenotype.PERIODIC
    if persistent_rank_fault(inc, settings):
        return Phenotype.DIVERGENCE  # one rank broke and stays broken: it never comes back by itself
    if source_persisting(inc, settings):
        return Phenotype.SLOW_RECOVERY  # the source still serves bad data: the cause is in place
    traj = inc.trajectory
    if not traj:
        return Phenotype.TRANSIENT
    nonfinite_run = next((i for i, p in enumerate(reversed(traj)) if not p.nonfinite), len(traj))
    if nonfinite_run >= 2 or (nonfinite_run == 1 and inc.facts.rose_before_nonfinite):
        return Phenotype.DIVERGENCE
    after_peak = [p for p in traj if p.step > inc.peak_step]
    if all(p.loss_in_band for p in traj):
        # The loss never left its band (e.g. an update-ratio-only incident): a transient, unless the
        # LR that jumped is still up: the cause is in place whatever the loss does yet (SGD carries
        # a x20 LR for many steps; a sign update makes a young run's loss fall faster for a while).
        return Phenotype.SLOW_RECOVERY if lr_still_raised(inc) else Phenotype.TRANSIENT
    recovered = next((p for p in after_peak if p.loss_in_band), None)
    if recovered is not None:
        quick = recovered.step - inc.peak_step <= settings.transient_steps or _abrupt(traj, recovered, inc)
        if quick and not lr_still_raised(inc):
            return Phenotype.TRANSIENT
        # Slow to come back, or back while the LR that jumped stays up (a 30x LR under Adam: up, back,
        # and on again): the cause is still in place.
        return Phenotype.SLOW_RECOVERY
    last = traj[-1]
    since_onset = last.step - inc.onset_step
    if inc.facts.rising_steps >= 2 and inc.peak_step >= last.step - 1 and since_onset >= 2:
        return Phenotype.DIVERGENCE
    if inc.facts.rising_steps >= 2 and _still_rising(traj, inc.onset_step):
        return Phenotype.DIVERGENCE  # noisy, but each third of the way higher than the one before
    if _never_recovering(traj, inc.onset_step):
        return Phenotype.DIVERGENCE  # up and staying up for a long stretch: not on its way back
    if inc.facts.rising_steps >= 2 and last.excess >= DIVERGED and last.excess >= 0.5 * inc.peak_excess:
        return Phenotype.DIVERGENCE  # rose step after step to 10x its level and stays there: broken
    if last.step - inc.peak_step <= settings.transient_steps and last.excess >= 0.5 * inc.peak_excess:
        # Still up and not yet falling: too early to tell a plateau from the start of a recovery.
        early = since_onset <= 1 and not lr_still_raised(inc)
        return Phenotype.TRANSIENT if early else Phenotype.SLOW_RECOVERY
    return Phenotype.SLOW_RECOVERY


#: An LR this many times its pre-onset value is raised (the same factor makes an LR jump a fact).
LR_RAISED = 1.5


def lr_still_raised(inc: IncidentTrack) -> bool:
    """The LR rose ``LR_RAISED``x or more against the step before onset and the incident's latest
    step still runs at it: the loss coming back does not end the fault. An LR back down by half the
    rise (log units) is on its schedule, even where a warm-up has since carried it ``LR_RAISED``x
    above the step before onset (x20 at step 6 of a linear warm-up: step 9 runs 1.5x step 5's LR)."""
    f = inc.facts
    if f.lr_rise is None or f.lr_before is None or f.lr_before[1] <= 0 or not inc.trajectory:
        return False
    last = inc.trajectory[-1].lr
    if last is None or last / f.lr_before[1] < LR_RAISED:
        return False
    return last >= f.lr_before[1] * math.sqrt(f.lr_rise[1])


def source_persisting(inc: IncidentTrack, settings: DetectorSettings) -> bool:
    """A ``source`` incident whose source is out of its band at most of the last ``transient_steps``
    steps: one noisy appearance back in band (a source has few samples a step) is no recovery."""
    if inc.facts.trigger != "source":
        return False
    tail = [p for p in inc.trajectory if p.step >= inc.onset_step][-settings.transient_steps :]
    return len(tail) >= settings.transient_steps and 2 * sum(not p.loss_in_band for p in tail) > len(tail)


#: A rank-local fault still present after this many steps (and at the latest step) is persistent.
PERSIST_STEPS = 20


def persistent_rank_fault(inc: IncidentTrack, settings: DetectorSettings) -> bool:
    """The incident's rank stood out at (nearly) every step since onset, for ``PERSIST_STEPS`` steps
    and up to now: a failing rank, not a bad batch."""
    if not inc.rank_local:
        return False
    traj = [p for p in inc.trajectory if p.step >= inc.onset_step]
    if len(traj) < 2 or traj[-1].step - traj[0].step < PERSIST_STEPS:
        return False
    tail = traj[-settings.transient_steps :]
    return all(p.rank_out for p in tail) and sum(p.rank_out for p in traj) >= 0.8 * len(traj)


#: A loss this far above its level (log units: 10x) that does not come back has diverged, even once
#: it stops rising (a saturated loss plateaus; a slow recovery is on its way down).
DIVERGED = math.log(10.0)


def _still_rising(traj: list[Point], onset: int) -> bool:
    """Split the steps since onset in thirds: each third's median excess is above the previous
    third's, by >= 5% in all. A slow recovery comes down in its last third; a plateau stays level."""
    ex = [p.excess for p in traj if p.step >= onset and math.isfinite(p.excess)]
    if len(ex) < 9:
        return False
    k = len(ex) // 3
    m1, m2, m3 = (sorted(part)[len(part) // 2] for part in (ex[:k], ex[k : 2 * k], ex[2 * k :]))
    return m1 < m2 < m3 and m3 - m1 >= math.log(1.05)


#: Steps after onset before a loss that shows no decline at all is called diverged, not recovering.
NO_RECOVERY_STEPS = 40


def _never_recovering(traj: list[Point], onset: int) -> bool:
    """``NO_RECOVERY_STEPS`` or more since onset, the loss never back in band, and its last third
    as high as its first (median excess >= 0.8x): a slow recovery would be visibly on its way down."""
    pts = [p for p in traj if p.step >= onset and math.isfinite(p.excess)]
    if not pts or pts[-1].step - pts[0].step < NO_RECOVERY_STEPS or any(p.loss_in_band for p in pts[1:]):
        return False
    ex, k = [p.excess for p in pts], len(pts) // 3
    m1, m3 = (sorted(part)[len(part) // 2] for part in (ex[:k], ex[-k:]))
    return m1 > 0 and m3 >= 0.8 * m1


def _abrupt(traj: list[Point], recovered: Point, inc: IncidentTrack) -> bool:
    """The logged step just before returning to band was still at >= half the peak excess:
    input-driven, not model decay (across a gap in the log the path is unknown)."""
    prev = [p for p in traj if p.step < recovered.step]
    if not prev or not math.isfinite(prev[-1].excess) or prev[-1].excess < 0.5 * inc.peak_excess:
        return False
    return recovered.step - prev[-1].step <= typical_step(inc)


#: A one-step transient below this loss excess (and below ``BLIP_MAX_GRAD``) is a note: heavy-tailed
#: healthy runs do this (llm.c GPT-2 124M: loss 3.48 -> 3.78 with the grad norm 5x, back next step).
BLIP_MAX_JUMP = math.log(1.5)
BLIP_MAX_GRAD = 10.0


def _blip(inc: IncidentTrack) -> bool:
    """Only the peak step rose and the next logged one is back; no rank, no NaN, nothing large."""
    f = inc.facts
    if f.nonfinite_step is not None or inc.rank_local or f.checksum is not None or inc.period is not None:
        return False
    if not math.isfinite(inc.peak_excess) or inc.peak_excess >= BLIP_MAX_JUMP:
        return False
    big_update = f.update_spike is not None and f.update_spike[1] >= BLIP_MAX_GRAD
    if (f.grad_ratio_at_peak or 0.0) >= BLIP_MAX_GRAD or big_update:
        return False
    # The peak step, and at most one step before it (noise that the onset search picked up).
    if sum(1 for p in inc.trajectory if not p.loss_in_band and p.step < inc.peak_step) > 1:
        return False
    after = [p for p in inc.trajectory if p.step > inc.peak_step]
    if not after or not after[0].loss_in_band:
        return False
    return after[0].step - inc.peak_step <= typical_step(inc)


def acted_on(inc: IncidentTrack) -> str | None:
    """The first specific finding a policy acts on whatever the size of the loss's reaction, or None:
    each names where the fault is and what to undo, so none is a note."""
    f = inc.facts
    found = (
        ("nonfinite", f.nonfinite_step is not None),
        ("lr_jump", f.lr_jump is not None or (f.lr_rise is not None and f.lr_before is not None)),
        ("update_jump", f.update_spike is not None),
        ("checksum", f.checksum is not None),
        ("rank_local", inc.rank_local),
        ("source_local", f.source is not None),
        ("after_resume", inc.after_resume and f.resume_step is not None),
        ("overflow", f.trigger == "overflow"),  # a loss scale collapsing, not one overflow the scaler handled
    )
    return next((name for name, hit in found if hit), None)


def severity(inc: IncidentTrack, phen: Phenotype, top: str | None) -> Severity:
    """How bad it is for training (not how sure we are). ``low`` is a note; ``medium`` and above mean
    the policy will act, so a specific finding (``acted_on``) is ``medium`` at least, however small
    the loss's reaction (a 30x LR under Adam can leave the loss within its noise for steps)."""
    size = _severity_of_shape(inc, phen, top)
    if top == "metric_artifact" or size is not Severity.LOW or acted_on(inc) is None:
        return size
    return Severity.MEDIUM


def _severity_of_shape(inc: IncidentTrack, phen: Phenotype, top: str | None) -> Severity:
    """Severity from the curve's shape and size alone."""
    if top == "metric_artifact":
        return Severity.LOW
    if inc.facts.resume_missing:
        return Severity.HIGH  # the run goes on with part of its state lost, whatever the loss shows
    if phen is Phenotype.TRANSIENT and inc.facts.nonfinite_step is None and calm_grads(inc):
        return Severity.LOW  # gradients and updates stayed normal: the weights were not hurt
    unconfirmed = not inc.facts.grad_known and inc.facts.checksum is None and not inc.rank_local
    brief = sum(1 for p in inc.trajectory if not p.loss_in_band) <= 2
    if phen is Phenotype.TRANSIENT and inc.facts.nonfinite_step is None and unconfirmed and brief:
        return Severity.LOW  # a one-off loss blip with nothing logged to confirm it: heavy tails do this
    if phen is Phenotype.TRANSIENT and top not in ("distributed", "resume_state") and _blip(inc):
        return Severity.LOW  # one step out and straight back, on every rank: a note, not a page
    if inc.facts.nonfinite_step is not None and phen is not Phenotype.TRANSIENT:
        return Severity.CRITICAL
    if phen is Phenotype.DIVERGENCE:
        return Severity.CRITICAL
    if top in ("distributed", "resume_state") or phen in (Phenotype.SLOW_RECOVERY, Phenotype.PERIODIC):
        return Severity.HIGH
    peak = inc.peak_excess if math.isfinite(inc.peak_excess) else 10.0
    grad = inc.facts.grad_ratio_at_peak
    if inc.facts.nonfinite_step is not None or peak >= math.log(2.0) or (grad is not None and grad >= 10.0):
        return Severity.HIGH if peak >= math.log(2.0) else Severity.MEDIUM
    return Severity.MEDIUM if peak >= math.log(1.2) or (grad is not None and grad >= 3.0) else Severity.LOW

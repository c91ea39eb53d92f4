"""Cause ranking: each cause category gets a score in [0, 1] and the evidence behind it, in words.

The phenotype is a prior, never a verdict: it contributes a modest score, and measured facts (a
fingerprint mismatch, a resume just before, a reported loss the recomputed one contradicts)
dominate. Scores are additive weights clipped to [0, 1], listed in one table (``W``) to be tuned.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from supervisor.core.detect import DetectorSettings
from supervisor.core.model import Cause, CauseScore, Phenotype
from supervisor.core.trigger import SOURCE_PERSIST


def typical_step(inc: IncidentTrack) -> int:
    """The usual distance between logged steps of an incident (1 for per-step telemetry)."""
    steps = [p.step for p in inc.trajectory]
    gaps = sorted(b - a for a, b in zip(steps, steps[1:], strict=False) if b > a)
    return gaps[len(gaps) // 2] if gaps else 1


if TYPE_CHECKING:
    from supervisor.core.diagnose import IncidentTrack

#: The cause each piece of evidence speaks for and its weight (one row per rule in ``rank_causes``;
#: the phenotype's cause is its prior, ``PHENOTYPE_PRIOR``).
W: dict[str, tuple[Cause | None, float]] = {
    "phenotype": (None, 0.3),
    "checksum": (Cause.DISTRIBUTED, 0.8),
    "after_resume": (Cause.RESUME_STATE, 0.6),
    "resume_update": (Cause.RESUME_STATE, 0.3),
    "resume_missing": (Cause.RESUME_STATE, 0.4),
    "nonfinite": (Cause.NUMERIC, 0.5),
    "nonfinite_sudden": (Cause.NUMERIC, 0.2),
    "nonfinite_skipped": (Cause.NUMERIC, 0.0),
    "nonfinite_after_rise": (Cause.NUMERIC, -0.3),
    "overflow": (Cause.NUMERIC, 0.2),
    "update_spike": (Cause.OPTIMIZER, 0.3),
    "lr_jump": (Cause.OPTIMIZER, 0.3),
    "lr_back": (Cause.OPTIMIZER, 0.0),
    "grad_lead": (Cause.OPTIMIZER, 0.2),
    "rank_local": (Cause.DATA, 0.3),
    "rank_persistent": (Cause.DISTRIBUTED, 0.6),
    "source_local": (Cause.DATA, 0.3),
    "source_persistent": (Cause.DATA, 0.3),
    "metric_mismatch": (Cause.METRIC_ARTIFACT, 0.6),
    "token_collapse": (Cause.METRIC_ARTIFACT, 0.3),
    "calm_grads": (Cause.METRIC_ARTIFACT, 0.35),
    "batch_mean": (Cause.METRIC_ARTIFACT, 0.2),
}

#: The cause each phenotype lends its prior to; its first evidence sentence describes the curve.
PHENOTYPE_PRIOR = {
    Phenotype.TRANSIENT: Cause.DATA,
    Phenotype.PERIODIC: Cause.DATA,
    Phenotype.SLOW_RECOVERY: Cause.OPTIMIZER,
    Phenotype.DIVERGENCE: Cause.OPTIMIZER,
}


def _g(x: float) -> str:
    """A number for a person: 3 significant digits, no exponent unless it is tiny or huge."""
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e5 or x == 0 else f"{x:.2e}"


class _Board:
    def __init__(self) -> None:
        self.score = {c: 0.0 for c in Cause}
        self.evidence: dict[Cause, list[str]] = {c: [] for c in Cause}

    def add(self, key: str, text: str | None = None, cause: Cause | None = None) -> None:
        owner, weight = W[key]
        to = cause if cause is not None else owner
        assert to is not None, key
        self.score[to] += weight
        if text:
            self.evidence[to].append(text)

    def ranked(self) -> list[CauseScore]:
        out = [
            CauseScore(c, round(min(1.0, max(0.0, s)), 4), self.evidence[c])
            for c, s in self.score.items()
            if s > 0.0 or self.evidence[c]
        ]
        out.sort(key=lambda cs: (-cs.score, list(Cause).index(cs.cause)))
        return out


def _lr_back_text(back: tuple[int, float, float, int | None], before: tuple[int, float] | None) -> str:
    step, factor, first, target = back
    where = "the run's start" if target is not None and target <= 0 else f"step {target}"
    after, fix = (f"the rollback to {where}", "a rollback") if target is not None else ("the fix", "the fix")
    ref = f" ({_g(before[1])} at step {before[0]})" if before is not None else ""
    return (
        f"learning rate {_g(factor)}x the LR before the fault{ref} at step {step} again after {after}, "
        f"the supervisor's own LR factor divided out ({_g(first)}x the first time): the job's own "
        f"schedule produces it, {fix} does not cure it"
    )


def rank_causes(inc: IncidentTrack, phen: Phenotype, settings: DetectorSettings) -> list[CauseScore]:
    from supervisor.core.diagnose import persistent_rank_fault

    f = inc.facts
    b = _Board()
    prior = PHENOTYPE_PRIOR[phen]
    if f.lr_back is not None:  # the first abnormal quantity, and why the fix did not hold
        b.add("lr_back", _lr_back_text(f.lr_back, f.lr_before))
    b.add("phenotype", _phenotype_text(inc, phen), cause=prior)
    calm = calm_grads(inc)
    if f.checksum is not None:
        step, ranks = f.checksum
        b.add("checksum", f"param fingerprints of ranks {ranks} differ from the others' from step {step}")
    resumed = inc.after_resume and f.resume_step is not None
    if resumed:
        b.add("after_resume", f"resumed at step {f.resume_step}; onset at {inc.onset_step}")
        if f.resume_missing:
            b.add(
                "resume_missing",
                f"the restore at step {f.resume_step} did not bring back: {', '.join(f.resume_missing)} "
                "(checked where the state was loaded)",
            )
    if f.update_spike is not None and (resumed or not calm):
        step, ratio = f.update_spike
        key = "resume_update" if resumed else "update_spike"  # after a restore: its lost optimizer state
        b.add(key, f"update ratio {_g(ratio)}x its level at step {step}")
    if f.lr_jump is not None:
        step, ratio = f.lr_jump
        b.add("lr_jump", f"learning rate changed {_g(ratio)}x from the previous step at step {step}")
    if f.lr_rise is not None and f.lr_before is not None and f.lr_jump is None:
        step, rise = f.lr_rise
        b.add(
            "lr_jump",
            f"learning rate {_g(f.lr_before[1])} at step {f.lr_before[0]} -> {_g(f.lr_before[1] * rise)} at step {step} ({_g(rise)}x)",
        )
    lead = _grad_lead(inc)
    if lead is not None:
        b.add("grad_lead", lead)
    _numeric(inc, b)
    if inc.rank_local and inc.first_rank is not None and f.checksum is None:
        text = f"rank {inc.first_rank} deviated first"
        if f.rank is not None:
            step, rank, loss, med = f.rank
            text = f"rank {rank} loss {_g(loss)} vs ranks' median {_g(med)} at step {step}"
        b.add("rank_local", text)
        if phen is Phenotype.DIVERGENCE and persistent_rank_fault(inc, settings):
            since = inc.trajectory[-1].step - inc.onset_step
            b.add(
                "rank_persistent",
                f"rank {inc.first_rank} has stood out from the other ranks at every step for {since} steps "
                "since onset: a failing rank (device, link or its data pipeline), not one bad batch",
            )
    if f.source is not None:
        name, z, loss = f.source
        b.add("source_local", f"source `{name}` loss {_g(loss)} (robust z {_g(z)}); other sources in band")
        if f.trigger == "source" and f.source_stall is not None:  # learned nothing while the others did
            own, others = f.source_stall
            b.add(
                "source_persistent",
                f"source `{name}` has not learned: its loss x{_g(math.exp(-own))} of its first level while the "
                f"other sources' fell to x{_g(math.exp(-others))}, at {SOURCE_PERSIST} appearances in a row: "
                "that source's data (no model learns it), not the model",
            )
        elif f.trigger == "source":  # measured against the source's own baseline, and persistent
            b.add(
                "source_persistent",
                f"source `{name}` out of its own band at {SOURCE_PERSIST} appearances in a row from step "
                f"{inc.onset_step} while the other sources stayed in theirs: that source's data, not the model",
            )
    # Calm gradients say the loss moved without the model's updates moving: a logging artifact, unless
    # one source alone carries the rise -- its own loss (the model's losses on its samples) out of its
    # band while the others stay in theirs is what the model saw, whatever the gradients did.
    _metric(inc, b, calm and f.source is None)
    if not any(b.evidence[c] for c in Cause if c is not prior) and len(b.evidence[prior]) == 1:
        b.evidence[prior].append(THIN)
    return b.ranked()


#: Said when the loss curve is all there is: the cause is the phenotype's prior, not a finding.
THIN = (
    "less certain: only the loss curve is evidence (no grad norm, update ratio, LR or per-rank "
    "metric confirms it); log them to tell data from optimizer from rank"
)


def _phenotype_text(inc: IncidentTrack, phen: Phenotype) -> str:
    f = inc.facts
    base, peak = f.baseline_loss, f.peak_loss
    shape = f"loss {_g(base)} -> {_g(peak)} at step {inc.peak_step}" if base and peak else "loss spike"
    if phen is Phenotype.PERIODIC:
        return f"recurs every {inc.period} steps (onsets {f.occurrences[:6]})"
    if phen is Phenotype.DIVERGENCE:
        return f"{shape}; kept rising ({f.rising_steps} new peaks after onset)"
    if phen is Phenotype.SLOW_RECOVERY:
        if inc.trajectory and all(p.loss_in_band for p in inc.trajectory):
            return f"{shape}; the loss in its band while the learning rate stays raised"
        end = f"back in band at {inc.end_step}" if inc.end_step is not None else "not yet back in band"
        return f"{shape}; slow return ({end})"
    return f"{shape}; back in band within {max(0, (inc.end_step or inc.peak_step) - inc.peak_step)} steps"


def calm_grads(inc: IncidentTrack) -> bool:
    """Grad norm and update ratio stayed normal from onset to the loss peak (only when they are logged)."""
    f = inc.facts
    if not f.grad_known or f.update_spike is not None or f.nonfinite_step is not None:
        return False
    ratios = [
        r for p in inc.trajectory if p.step <= inc.peak_step for r in (p.grad, p.update) if r is not None
    ]
    return bool(ratios) and max(ratios) < 2.0


def _grad_lead(inc: IncidentTrack) -> str | None:
    """Grad norm out of band before the loss peaked: the BLOOM-31219 pattern (instability builds up first)."""
    before = [p for p in inc.trajectory if p.step < inc.peak_step and p.grad is not None]
    first = next((p for p in before if p.grad is not None and p.grad >= 3.0), None)
    if first is None:
        return None
    top = max(before, key=lambda p: p.grad or 0.0)
    text = f"grad norm {_g(first.grad or 0.0)}x its level at step {first.step}, {inc.peak_step - first.step} steps before the loss peak at {inc.peak_step}"
    if top.step != first.step:
        text += f"; {_g(top.grad or 0.0)}x at step {top.step}"
    return text


def _numeric(inc: IncidentTrack, b: _Board) -> None:
    f = inc.facts
    if f.nonfinite_step is not None:
        where = f" in `{f.nonfinite_at}`" if f.nonfinite_at else ""
        b.add(
            "nonfinite",
            f"non-finite values first at step {f.nonfinite_step}{where} on ranks {f.nonfinite_ranks}",
        )
        if f.rose_before_nonfinite:
            b.add(
                "nonfinite_after_rise",
                f"but {inc.first_anomaly.metric} left its band at step {inc.onset_step}, before the first NaN",
            )
        else:
            b.add("nonfinite_sudden", "nothing was out of band before it")
        # Each non-finite step's own record says whether its update was set aside (the SDK's
        # ``step_skipped_nonfinite`` event, the AMP scaler's overflow): no later step is needed to
        # know that no weights changed. A NaN that keeps coming is still a divergence (``classify``).
        if f.nonfinite_applied == 0 and f.nonfinite_steps:
            b.add(
                "nonfinite_skipped",
                f"the non-finite step {f.nonfinite_step} was skipped: no weights changed "
                "(the SDK or the AMP scaler set its update aside)",
            )
    dropped = f.loss_scale_drop is not None and f.loss_scale_drop[1] < f.loss_scale_drop[0]
    if f.overflow_steps or dropped:
        text = f"{f.overflow_steps} overflowed (skipped) steps" if f.overflow_steps else "loss scale dropped"
        if f.loss_scale_drop is not None and dropped:
            text += f"; loss scale {_g(f.loss_scale_drop[0])} -> {_g(f.loss_scale_drop[1])}"
        b.add("overflow", text)
        if f.first_overflow is not None and abs(f.first_overflow - inc.onset_step) <= 1:
            b.add("overflow", f"the first overflow is at step {f.first_overflow}, with the onset")
        elif f.scale_drop_step is not None and abs(f.scale_drop_step - inc.onset_step) <= typical_step(inc):
            b.add("overflow", f"the loss scale fell at step {f.scale_drop_step}, with the onset")


def _metric(inc: IncidentTrack, b: _Board, calm: bool) -> None:
    f = inc.facts
    if f.misreport is not None:
        step, rank, rep, true = f.misreport
        b.add(
            "metric_mismatch",
            f"rank {rank} reported loss {_g(rep)} but loss_sum/tokens = {_g(true)} at step {step}",
        )
    elif f.reported_vs_true is not None:
        step, rep, true = f.reported_vs_true
        b.add(
            "metric_mismatch",
            f"reported mean loss {_g(rep)} vs token-weighted {_g(true)} recomputed from loss_sum/tokens at step {step}",
        )
    if f.collapse is not None:
        step, rank, tok, med = f.collapse
        b.add(
            "token_collapse", f"rank {rank} had {_g(tok)} effective tokens vs median {_g(med)} at step {step}"
        )
    if f.batch_mean is not None:
        step, rank, bm, loss = f.batch_mean
        b.add(
            "batch_mean", f"rank {rank} batch-mean loss {_g(bm)} vs token-weighted {_g(loss)} at step {step}"
        )
    if calm:
        ratios = (("grad norm", f.grad_ratio_at_peak), ("update ratio", f.update_ratio_at_peak))
        parts = [f"{name} {_g(r)}x" for name, r in ratios if r is not None]
        text = " and ".join(parts) + f" their levels at the loss peak (step {inc.peak_step})"
        b.add("calm_grads", text)

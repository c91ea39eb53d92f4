"""Traces with only step and loss keep what the loss alone can show (issue 19), and a persistent
rank-local fault is one incident with its own phenotype."""

from __future__ import annotations

import math

from supervisor.core.analysis import analyze_records
from supervisor.core.causes import THIN
from supervisor.core.model import Cause, Phenotype, Severity
from supervisor.core.records import Record
from supervisor.traces.synthetic import set_loss, synthetic_records


def _loss_only(seed: int, n: int = 400) -> list[Record]:
    return [Record(step=r.step, loss=r.loss) for r in synthetic_records(n, 1, seed=seed)]


def test_lr_divergence_from_the_loss_alone_dates_the_rise_and_plateau_is_divergence() -> None:
    recs = _loss_only(41)
    for r in recs:
        if r.step >= 250:  # a slow start, then it blows up and saturates 1000x above its level
            r.loss *= min(1000.0, math.exp(0.012 * (r.step - 250) ** 1.6))
    (d,) = analyze_records(recs).incidents
    assert d.phenotype is Phenotype.DIVERGENCE and d.severity is Severity.CRITICAL
    assert d.detected_step is not None and d.onset_step < d.detected_step  # dated before its first alarm
    # Dated where the sum of the loss's excess began; noise can move that a few steps either way,
    # and an early date is the safe side (a rollback goes back before it). Never a level window early.
    assert 250 - 16 <= d.onset_step <= 252
    assert THIN in d.causes[0].evidence  # the cause is the shape's prior only: said so


def test_a_long_elevated_stretch_is_acted_on_even_without_gradients() -> None:
    recs = _loss_only(42)
    for r in recs:
        if 250 <= r.step < 262:
            r.loss *= 1.3
    (d,) = analyze_records(recs).incidents
    assert abs(d.onset_step - 250) <= 1 and d.severity.rank >= Severity.MEDIUM.rank


def test_one_step_loss_only_blip_stays_a_note() -> None:
    recs = _loss_only(43)
    for r in recs:
        if r.step == 250:
            r.loss *= 1.7
    assert [d.severity for d in analyze_records(recs).incidents] in ([], [Severity.LOW])


def test_persistent_rank_fault_is_one_divergence_incident() -> None:
    """One rank's computation broken for good from step 200 on, for longer than an incident lasts."""
    recs = synthetic_records(700, 4, seed=31)
    for r in recs:
        if r.step >= 200 and r.rank == 2:
            set_loss(r, r.loss * 1.6)
    (d,) = analyze_records(recs).incidents
    assert d.onset_step == 200 and d.rank_local and d.first_rank == 2
    assert d.phenotype is Phenotype.DIVERGENCE and d.top_cause is Cause.DISTRIBUTED


def test_a_rank_that_recovers_is_not_persistent() -> None:
    recs = synthetic_records(400, 4, seed=32)
    for r in recs:
        if 200 <= r.step < 208 and r.rank == 1:
            set_loss(r, r.loss * 1.6)
    ds = analyze_records(recs).incidents
    assert ds and all(d.phenotype is not Phenotype.DIVERGENCE for d in ds)


def test_a_divergence_too_slow_for_any_step_to_stand_out_is_found() -> None:
    """+0.4% a step from 400 on: the level follows it, no single step is out of band for long."""
    recs = _loss_only(44, 700)
    for r in recs:
        if r.step >= 400:
            r.loss *= math.exp(0.004 * (r.step - 400))
    (d,) = analyze_records(recs).incidents
    assert d.phenotype is Phenotype.DIVERGENCE
    assert 395 <= d.onset_step <= 420 and d.detected_step is not None and d.detected_step <= 460


def test_a_step_change_in_the_level_is_not_a_trend() -> None:
    recs = _loss_only(45, 700)
    for r in recs:
        if r.step >= 400:
            r.loss *= 1.12  # a harder data mix from 400 on: up once, then flat
    assert [d for d in analyze_records(recs).incidents if d.severity.rank >= Severity.MEDIUM.rank] == []


def _lr_fault(lr_factor: float) -> list[Record]:
    """A user-owned loop (``probe.record``) under a hot LR from step 200: the loss jumps, Adam's
    normalised steps pull it back within a few steps, the update ratio stays up while the LR does.
    The trace ends at 210, as a supervised run's does when the rollback cuts the incident short."""
    recs = [r for r in synthetic_records(210, 2, seed=51) if r.step <= 210]
    bump = {201: 2.3, 202: 1.25, 203: 1.2, 204: 1.1}
    for r in recs:
        if r.step >= 200:
            r.lr = (r.lr or 0.0) * lr_factor
            fade = max(0.4, 1.0 - 0.06 * (r.step - 200))  # Adam's second moments catch up a little
            r.update_norm = (r.update_norm or 0.0) * max(1.0, 0.8 * lr_factor * fade)
        set_loss(r, r.loss * bump.get(r.step, 1.0))
    return recs


def test_a_loss_back_in_band_under_a_raised_lr_is_not_a_transient() -> None:
    """Issue 15's remark: an injected 30x LR read as ``transient`` because the loss came back fast."""
    (d,) = analyze_records(_lr_fault(30.0)).incidents
    assert d.phenotype is Phenotype.SLOW_RECOVERY and d.top_cause is Cause.OPTIMIZER
    assert any("learning rate" in e for e in d.causes[0].evidence)
    assert d.severity.rank >= Severity.HIGH.rank


def test_the_same_loss_shape_with_the_lr_unchanged_stays_transient() -> None:
    (d,) = analyze_records(_lr_fault(1.0)).incidents
    assert d.phenotype is Phenotype.TRANSIENT

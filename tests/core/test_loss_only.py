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

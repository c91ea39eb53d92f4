"""Periodic faults: found with a long period, from the first occurrence, across unrelated incidents."""

from __future__ import annotations

from supervisor.core.analysis import analyze_records
from supervisor.core.model import Phenotype
from supervisor.traces.synthetic import at, set_loss, synthetic_records


def _spike(recs, step: int, loss: float = 2.0, grad: float = 8.0, rank: int | None = None) -> None:  # type: ignore[no-untyped-def]
    for r in at(recs, step, rank):
        set_loss(r, r.loss * loss)
        r.grad_norm = (r.grad_norm or 1.0) * grad


def test_long_period_across_an_unrelated_incident() -> None:
    recs = synthetic_records(1500, 2, seed=21)
    for s in (300, 700, 1100):
        _spike(recs, s)
    _spike(recs, 850, loss=1.8, grad=12.0)  # something else between two occurrences
    res = analyze_records(recs)
    periodic = [d for d in res.incidents if d.phenotype is Phenotype.PERIODIC]
    assert len(periodic) == 1 and periodic[0].period == 400 and periodic[0].onset_step == 300
    assert any(d.onset_step == 850 and d.phenotype is not Phenotype.PERIODIC for d in res.incidents)


def test_first_occurrence_below_the_alarm_is_found() -> None:
    """The first occurrence fell in the first steps of the run (no history yet to open anything):
    the chain of the later two reaches back to it."""
    recs = synthetic_records(900, 2, seed=22)
    for s in (40, 340, 640):
        _spike(recs, s)
    res = analyze_records(recs)
    (d,) = res.incidents
    assert d.phenotype is Phenotype.PERIODIC and d.period == 300 and d.onset_step == 40


def test_noise_is_not_an_occurrence() -> None:
    recs = synthetic_records(700, 2, seed=23, heavy_tail=True)
    for s in (300, 500):
        _spike(recs, s)
    res = analyze_records(recs)
    assert all(d.phenotype is not Phenotype.PERIODIC for d in res.incidents)

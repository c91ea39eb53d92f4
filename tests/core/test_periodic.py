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


def test_each_occurrence_brings_its_own_suspects_and_is_detected_where_it_is() -> None:
    """Issue 24 point 4: a bad shard on rank 1 every 80 steps serves other samples each time; the
    chain's exclusion must cover the latest occurrence's, not only the first's, and the chain is
    never dated as detected before the occurrence it reports."""
    from supervisor.core.analysis import StreamingAnalyzer, group_steps

    recs = synthetic_records(430, 2, seed=24)
    occ = (80, 160, 240, 320, 400)
    for s in occ:
        (r,) = at(recs, s, rank=1)
        set_loss(r, r.loss * 2.2)
    a = StreamingAnalyzer()
    seen: dict[int, object] = {}
    for step, batch in group_steps(recs):
        for u in a.observe_step(step, batch):
            seen[step] = u.diagnosis
    head = next(i for i in a.incidents if i.period is not None)
    assert head.period == 80 and head.facts.occurrences[-2:] == [320, 400]
    d = head.diagnosis(a.settings)
    assert d.suspect_samples[:2] == ["s400r1i0", "s400r1i1"], d.suspect_samples
    assert {f"s{s}r1i0" for s in (160, 240, 320, 400)} <= set(d.suspect_samples)
    assert d.detected_step is not None and d.detected_step >= 400

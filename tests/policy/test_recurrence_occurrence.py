"""A recurring fault is fixed where it recurs (issue 24 point 4): an occurrence after "resolved" is
a recurrence with its own numbers and an exclusion that covers it."""

from __future__ import annotations

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.policy.recurrence import Resolved, occurrence_after
from supervisor.traces.synthetic import at, set_loss, synthetic_records


def _chain(until: int):
    recs = synthetic_records(until, 2, seed=24)
    for s in (80, 160, 240, 320, 400):
        if s < until:
            (r,) = at(recs, s, rank=1)
            set_loss(r, r.loss * 2.2)
    a = StreamingAnalyzer()
    for step, batch in group_steps(recs):
        a.observe_step(step, batch)
    head = next(i for i in a.incidents if i.period is not None)
    return head, head.diagnosis(a.settings)


def test_an_occurrence_after_the_fix_is_a_recurrence_with_its_own_numbers() -> None:
    resolved = Resolved(incident_id=7, onset_step=240, window_end_step=342)
    head, d = _chain(330)
    occ = occurrence_after(resolved, d, head.facts.occurrences)
    assert occ is None  # 320 is inside the window that ended at 342: the window's own failure
    head, d = _chain(430)
    occ = occurrence_after(resolved, d, head.facts.occurrences)
    assert occ is not None and occ.onset_step == 400 and occ.number == len(head.facts.occurrences)
    assert occ.detected_step is not None and occ.detected_step >= occ.onset_step
    ex = occ.exclusion()
    assert ex["samples"][:2] == ["s400r1i0", "s400r1i1"] and ex["batch_range"][0] == 400
    msg = occ.message()
    assert "from step 400" in msg and "rank 1" in msg and "every 80 steps" in msg and "160" not in msg

"""Recurring incidents: the third onset at the same spacing makes a chain with a period.

A chain is one incident (the first occurrence, "the head") whose ``period`` is set and whose
``facts.occurrences`` lists every onset. The second occurrence, opened before the period was
known, is merged into the head; later occurrences attach to the head directly.
"""

from __future__ import annotations

from supervisor.core.detect import DetectorSettings
from supervisor.core.diagnose import Incident

#: Shortest period we call periodic: anything closer is one incident's aftershock.
MIN_PERIOD = 4


def attach_periodic(
    incidents: list[Incident], new: Incident, st: DetectorSettings
) -> tuple[Incident, Incident | None]:
    """Returns (the incident the new occurrence belongs to, an incident merged away or None)."""
    # Only earlier onsets: after a rollback the abandoned timeline's incidents lie ahead of a
    # re-run step, and a fault that recurs at its old step is a recurrence, not a period.
    live = [i for i in incidents if i.merged_into is None and i.onset_step < new.onset_step]
    if not live:
        return new, None
    onset, tol = new.onset_step, st.period_tolerance
    last = live[-1]
    if last.period is not None:
        if abs(onset - last.facts.occurrences[-1] - last.period) <= tol:
            _reopen(last, new)
            return last, None
        return new, None
    if len(live) < 2:
        return new, None
    a, b = live[-2], live[-1]
    gap1, gap2 = b.onset_step - a.onset_step, onset - b.onset_step
    if gap1 < MIN_PERIOD or abs(gap2 - gap1) > tol or a.period is not None:
        return new, None
    a.period = gap2
    a.facts.occurrences = [a.onset_step, b.onset_step]
    b.merged_into, b.period = a.key, gap2
    b.closed = True
    _absorb(a, b)
    _reopen(a, new)
    return a, b


def _absorb(head: Incident, other: Incident) -> None:
    if other.peak_excess > head.peak_excess:
        head.peak_excess, head.peak_step = other.peak_excess, other.peak_step
        head.facts.peak_loss = other.facts.peak_loss
    head.trajectory.extend(other.trajectory)
    if head.facts.source is None:
        head.facts.source = other.facts.source


def _reopen(head: Incident, new: Incident) -> None:
    """Attach a new occurrence: the head is open again until this occurrence is back in band."""
    head.facts.occurrences.append(new.onset_step)
    head.closed = False
    head.end_step = None
    head.in_band_run = 0
    if head.facts.source is None:
        head.facts.source = new.facts.source
    if not head.rank_local and new.rank_local:
        head.rank_local, head.first_rank = True, new.first_rank

"""Recurring incidents: three onsets at one spacing make a chain with a period.

A chain is one incident (the first occurrence, "the head") whose ``period`` is set and whose
``facts.occurrences`` lists every onset; occurrences opened before the period was known are merged
into it. How a chain is found so that a long period is neither missed nor found late (earlier
occurrences searched among recent incidents, excursions under the alarm threshold counted):
docs/detection.md, "Periodic faults".
"""

from __future__ import annotations

from collections.abc import Sequence

from supervisor.core.detect import DetectorSettings
from supervisor.core.diagnose import MAX_SUSPECTS, IncidentTrack

#: Shortest period we call periodic: anything closer is one incident's aftershock (or a burst).
MIN_PERIOD = 20
#: Earlier incidents searched for the first two occurrences of a chain.
SEARCH = 32

#: (step, worst rank or None, loss excess in log units) of a step whose loss left its band.
Excursion = tuple[int, int | None, float]
#: An excursion counts as an occurrence when its excess is at least this share of the incident's.
LIKENESS = 0.5


def attach_periodic(
    incidents: list[IncidentTrack],
    new: IncidentTrack,
    st: DetectorSettings,
    excursions: Sequence[Excursion] = (),
    interval: int = 1,
) -> tuple[IncidentTrack, list[IncidentTrack]]:
    """Returns (the incident the new occurrence belongs to, incidents merged away into it)."""
    # Only earlier onsets: after a rollback the abandoned timeline's incidents lie ahead of a
    # re-run step, and a fault that recurs at its old step is a recurrence, not a period.
    live = [i for i in incidents if i.merged_into is None and i.onset_step < new.onset_step][-SEARCH:]
    onset, tol = new.onset_step, max(st.period_tolerance, interval)
    for head in reversed(live):  # an established chain this onset continues
        if head.period is not None and _fits(onset - head.facts.occurrences[-1], head.period, tol):
            _reopen(head, new)
            return head, []
    for j in range(len(live) - 1, -1, -1):  # two earlier incidents at the same spacing
        b = live[j]
        gap = onset - b.onset_step
        if gap < MIN_PERIOD or b.period is not None or not _alike(b, new):
            continue
        for a in live[:j]:
            if a.period is None and _fits(b.onset_step - a.onset_step, gap, tol) and _alike(a, new):
                return _chain(a, [b], new, gap, excursions, tol), [b]
        if _excursion_at(excursions, b.onset_step - gap, tol, b) is not None:  # a first one below threshold
            return _chain(b, [], new, gap, excursions, tol), []
    return new, []


def _chain(
    head: IncidentTrack, others: list[IncidentTrack], new: IncidentTrack, period: int,
    excursions: Sequence[Excursion], tol: int,
) -> IncidentTrack:  # fmt: skip
    head.period = period
    head.facts.occurrences = [head.onset_step, *(o.onset_step for o in others)]
    for o in others:
        o.merged_into, o.period, o.closed = head.key, period, True
        _absorb(head, o)
    _extend_back(head, excursions, tol, min([head, *others], key=lambda i: i.peak_excess))
    _reopen(head, new)
    return head


def _extend_back(head: IncidentTrack, excursions: Sequence[Excursion], tol: int, like: IncidentTrack) -> None:
    """``like``: the weakest occurrence seen as an incident; an excursion must look like it."""
    # Earlier excursions on the chain's spacing are its first occurrences: the onset moves back.
    while True:
        hit = _excursion_at(excursions, head.facts.occurrences[0] - head.period, tol, like)  # type: ignore[operator]
        if hit is None:
            return
        head.facts.occurrences.insert(0, hit)
        head.onset_step = hit


def _excursion_at(excursions: Sequence[Excursion], step: int, tol: int, like: IncidentTrack) -> int | None:
    size = like.peak_excess if like.peak_excess > 0 else 0.0
    for s, rank, excess in excursions:
        if abs(s - step) > tol or excess < LIKENESS * size:
            continue
        if not like.rank_local or rank is None or rank == like.first_rank:
            return s
    return None


def _fits(gap: int, period: int, tol: int) -> bool:
    return abs(gap - period) <= tol


def _alike(a: IncidentTrack, b: IncidentTrack) -> bool:
    """Occurrences of one fault: rank-local ones on the same rank (others are not told apart)."""
    return not (a.rank_local and b.rank_local) or a.first_rank == b.first_rank


def _absorb(head: IncidentTrack, other: IncidentTrack) -> None:
    if other.peak_excess > head.peak_excess:
        head.peak_excess, head.peak_step = other.peak_excess, other.peak_step
        head.facts.peak_loss = other.facts.peak_loss
    head.trajectory.extend(other.trajectory)
    head.trajectory.sort(key=lambda p: p.step)
    if head.facts.source is None:
        head.facts.source = other.facts.source
    _take_occurrence(head, other)


def _take_occurrence(head: IncidentTrack, occ: IncidentTrack) -> None:
    """The chain's suspects are every occurrence's, the latest first: a recurring bad shard serves
    other samples each time, so an exclusion of the first occurrence's alone would let the next
    ones through. The chain is detected again where this occurrence was (its dates never invert)."""
    merged = list(dict.fromkeys([*occ.suspect_samples, *head.suspect_samples]))
    head.suspect_samples = merged[:MAX_SUSPECTS]
    head.detected_step = max(head.detected_step, occ.detected_step)


def _reopen(head: IncidentTrack, new: IncidentTrack) -> None:
    """Attach a new occurrence: the head is open again until this occurrence is back in band."""
    head.facts.occurrences.append(new.onset_step)
    head.closed = False
    head.end_step = None
    head.in_band_run = 0
    if head.facts.source is None:
        head.facts.source = new.facts.source
    if not head.rank_local and new.rank_local:
        head.rank_local, head.first_rank = True, new.first_rank
    _take_occurrence(head, new)

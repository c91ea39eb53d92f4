"""Keep an incident's telemetry complete for its review.

The incident flow attaches the per-step aggregates around the onset when it makes a plan.
What a person reviewing the incident also needs, this recorder adds to the incident store
(``IncidentStore.attach_series``) while the incident is open:

- **per-rank rows** (loss, grad norm, ... of every rank, at most ``MAX_RANKS``), step by step from
  the incident's first sight, and the ring of recent steps before it written once its plan has
  begun, ``BACKFILL_STEPS`` ring steps in each step's transaction (all of it when the incident ends
  or the job does), so a rank-local incident can be drawn rank by rank (its own rank, when past
  the first ``MAX_RANKS``, for the ``RING_ALL_RANKS_STEPS`` ring steps up to its first sight);
- the **abandoned timeline** up to the rollback (the steps between the plan and the freeze);
- the **new timeline** after each rollback, as ``replay`` n (n-th rollback of that incident),
  through the observation window, so the plots can overlay both.

A supervisor that restarts carries on with the newest ``replay`` number already stored.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from supervisor.core.frame import StepFrame
from supervisor.incidents.states import IncidentState
from supervisor.logging import get_logger

log = get_logger("supervisor.observability.series")

#: Recent steps kept in memory, so an incident's per-rank rows start before its onset.
RING_STEPS = 128
#: Ranks stored per step (the first of them, plus the incident's first rank when it is beyond).
MAX_RANKS = 64
#: Ring steps written per analysed step once an incident's plan has begun (its earlier rows).
BACKFILL_STEPS = 4
#: The newest ring steps that keep every rank's record; older ring steps keep the first
#: ``MAX_RANKS`` ranks' only. A rank-local incident on a rank past them gets its own rows for this
#: many steps up to its first sight (that step included), and the ring's memory stays ``RING_STEPS x MAX_RANKS`` records
#: plus this many steps of every rank (every rank's 128 steps held ~190 MB at 1,024 ranks).
RING_ALL_RANKS_STEPS = 16


def _rows(records: Sequence[Any], keep_rank: int | None) -> Sequence[Any]:
    # Choose by rank before converting: a job of 1,024 ranks must not convert 1,024 records a step
    # (131,072 for the ring) to keep 65 of them (tests/scale/test_rank_costs.py). The store converts
    # and scrubs what it is given (``IncidentStore.attach_series``), once.
    if type(records) is StepFrame:  # by its rank column: no record built
        ranks = records.col("rank")
        return records.take([i for i, rk in enumerate(ranks) if rk < MAX_RANKS or rk == keep_rank]).kept()
    return [r for r in records if (rk := _rank(r)) < MAX_RANKS or rk == keep_rank]


def _rank(record: Any) -> int:
    rank = record.get("rank", 0) if isinstance(record, dict) else getattr(record, "rank", 0)
    try:
        return int(rank)
    except (TypeError, ValueError, OverflowError):
        return 0


Ring = tuple[int, Sequence[Any], dict[str, Any] | None]
"""(step, every rank's record, the step's aggregate) of one recent step."""


class IncidentSeries:
    def __init__(self, store: Any, job: str) -> None:
        self.store = store
        self.job = job
        self.ring: deque[Ring] = deque(maxlen=RING_STEPS)
        self.replay: dict[int, int] = {}  # open incident id -> the replay number its rows go to
        self.backfill: dict[int, tuple[int, list[Ring]]] = {}
        """Per incident: the replay number and the ring's steps before its first sight still to
        write, ``BACKFILL_STEPS`` a step once its plan has begun (no longer ``open``) -- the steps
        right after a detection are those of its plan and freeze, which must not wait on a write
        of the whole ring."""

    def on_rewind(self, to_step: int) -> None:
        """Training went back to ``to_step``: what follows is a new timeline of every open incident."""
        while self.ring and self.ring[-1][0] > to_step:
            self.ring.pop()
        for incident_id in self.replay:
            self.replay[incident_id] += 1

    def on_step(self, step: int, records: Sequence[Any], aggregate: dict[str, Any] | None) -> None:
        ring = self.ring
        ring.append((step, records, aggregate))
        if len(ring) > RING_ALL_RANKS_STEPS and len(ring[-RING_ALL_RANKS_STEPS - 1][1]) > MAX_RANKS:
            old, kept, agg = ring[-RING_ALL_RANKS_STEPS - 1]  # an incident's pending back-fill keeps its own
            ring[-RING_ALL_RANKS_STEPS - 1] = (old, _rows(kept, None), agg)
        open_now = {inc.id: inc for inc in self.store.active(self.job)}
        if not open_now and not self.replay:
            return
        with self.store.transaction():  # one commit a step, whatever it writes
            for gone in set(self.replay) - set(open_now):
                del self.replay[gone]
                self._backfill(gone, None, everything=True)  # the incident ended: its review is complete
            for incident_id, inc in open_now.items():
                first_rank = (inc.diagnosis_json or {}).get("first_rank")
                if incident_id not in self.replay:
                    self.replay[incident_id] = self._stored_replay(incident_id)
                    onset = inc.onset_step if inc.onset_step is not None else step
                    earlier = [e for e in list(self.ring)[:-1] if e[0] >= onset - RING_STEPS]
                    if earlier:
                        self.backfill[incident_id] = (self.replay[incident_id], earlier)
                self._write(incident_id, [self.ring[-1]], first_rank)
                if inc.state is not IncidentState.OPEN:  # its plan has begun: the freeze is not waiting
                    self._backfill(incident_id, first_rank)

    def flush(self) -> None:
        """Write every back-fill still pending (the job ends)."""
        if not self.backfill:
            return
        with self.store.transaction():
            for incident_id in list(self.backfill):
                self._backfill(incident_id, None, everything=True)

    def _backfill(self, incident_id: int, first_rank: Any, *, everything: bool = False) -> None:
        pending = self.backfill.get(incident_id)
        if pending is None:
            return
        replay, steps = pending
        if first_rank is None:
            inc = self.store.get(incident_id)
            first_rank = (inc.diagnosis_json or {}).get("first_rank")
        cut = 0 if everything else max(0, len(steps) - BACKFILL_STEPS)
        self._write(incident_id, steps[cut:], first_rank, replay=replay)  # newest first: nearest the onset
        if cut:
            self.backfill[incident_id] = (replay, steps[:cut])
        else:
            del self.backfill[incident_id]

    def _stored_replay(self, incident_id: int) -> int:
        rows = self.store.series(incident_id, replay=None)
        return max((int(r.get("replay", 0)) for r in rows), default=0)

    def _write(
        self, incident_id: int, steps: list[Ring], first_rank: Any, *, replay: int | None = None
    ) -> None:
        keep = first_rank if isinstance(first_rank, int) else None
        rows: list[Any] = []
        for step, records, aggregate in steps:
            rows.extend(_rows(records, keep))
            if aggregate is not None:
                rows.append({k: v for k, v in {**aggregate, "step": step}.items() if k != "rank"})
        if rows:
            self.store.attach_series(
                incident_id, rows, replay=self.replay[incident_id] if replay is None else replay
            )

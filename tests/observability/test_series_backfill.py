"""An incident's earlier rows (the ring of recent steps before its first sight) are written once
its plan has begun (it is no longer ``open``), ``BACKFILL_STEPS`` ring steps with each analysed
step, in that step's one transaction -- not at once on the control loop: at 1,024 emulated ranks
that one write of ~80 steps took 0.8 s of CPU (1.8 s wall on a loaded box) at the detection step,
in front of the plan and its freeze. What ends up stored is unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.records import Record
from supervisor.incidents import IncidentStore
from supervisor.observability.series import (
    BACKFILL_STEPS,
    MAX_RANKS,
    RING_ALL_RANKS_STEPS,
    RING_STEPS,
    IncidentSeries,
)
from tests.incidents.builders import diagnosis

RANKS = MAX_RANKS + 8  # more ranks than are kept: the first MAX_RANKS and the incident's rank


def _step(step: int) -> tuple[list[Record], dict[str, Any]]:
    recs = [Record(step=step, loss=3.0 + 0.01 * rank, rank=rank, world_size=RANKS, grad_norm=1.0) for rank in range(RANKS)]  # fmt: skip
    return recs, {"loss": 3.0, "grad_norm": 1.0}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IncidentStore]:
    with IncidentStore(tmp_path / "incidents.sqlite") as s:
        yield s


def _feed(series: IncidentSeries, steps: range) -> None:
    for step in steps:
        series.on_step(step, *_step(step))


def _stored(store: IncidentStore, incident_id: int, replay: int = 0) -> dict[int, set[int | None]]:
    out: dict[int, set[int | None]] = {}
    for row in store.series(incident_id, replay=replay):
        out.setdefault(row["step"], set()).add(row.get("rank"))
    return out


def test_the_first_sight_writes_its_own_step_and_the_ring_follows_in_slices(store: IncidentStore) -> None:
    series = IncidentSeries(store, "tinylm")
    _feed(series, range(1, 100))  # no incident yet: the ring only
    inc = store.open_incident("tinylm", diagnosis(onset_step=100, first_rank=MAX_RANKS + 3), key=1)
    _feed(series, range(100, 102))
    kept = set(range(MAX_RANKS)) | {MAX_RANKS + 3, None}  # None: the step's aggregate
    assert set(_stored(store, inc.id)) == {100, 101}  # open: its own steps only, its plan comes first
    store.transition(inc.id, "frozen", "plan: freeze", actor="supervisor")
    _feed(series, range(102, 103))
    first = _stored(store, inc.id)
    assert set(first) == {100, 101, 102, *range(100 - BACKFILL_STEPS, 100)}  # the nearest ring slice
    earlier = len([s for s in range(1, 100) if s >= 100 - RING_STEPS])
    for _ in range(-(-earlier // BACKFILL_STEPS)):
        _feed(series, range(series.ring[-1][0] + 1, series.ring[-1][0] + 2))
    last = series.ring[-1][0]
    stored = _stored(store, inc.id)
    assert set(stored) == set(range(1, last + 1))  # the whole ring before it, then step by step
    recent = range(101 - RING_ALL_RANKS_STEPS, last + 1)  # its own rank only where every rank was kept
    assert all(
        ranks == (kept if step in recent else kept - {MAX_RANKS + 3}) for step, ranks in stored.items()
    )
    assert series.backfill == {}


def test_a_rollback_before_the_backfill_ends_keeps_it_on_the_first_timeline(store: IncidentStore) -> None:
    series = IncidentSeries(store, "tinylm")
    _feed(series, range(1, 100))
    inc = store.open_incident("tinylm", diagnosis(onset_step=100, first_rank=1), key=1)
    store.transition(inc.id, "acting", "plan: rollback", actor="supervisor")
    _feed(series, range(100, 103))
    series.on_rewind(80)  # rolled back to 80 while earlier rows are still to write
    assert series.backfill
    end = 81 + -(-99 // BACKFILL_STEPS)  # enough steps for the whole ring
    _feed(series, range(81, end))
    assert series.backfill == {}
    assert set(_stored(store, inc.id, replay=0)) == set(range(1, 103))
    again = {r["step"] for r in store.series(inc.id, replay=None) if r.get("replay") == 1}
    assert again == set(range(81, end))


def test_what_is_still_held_back_is_written_when_the_incident_ends_or_the_job_does(
    store: IncidentStore,
) -> None:
    series = IncidentSeries(store, "tinylm")
    _feed(series, range(1, 100))
    inc = store.open_incident("tinylm", diagnosis(onset_step=100, first_rank=1), key=1)
    _feed(series, range(100, 101))
    assert series.backfill  # steps still to write
    series.flush()
    assert set(_stored(store, inc.id)) == set(range(1, 101)) and series.backfill == {}

    other = store.open_incident("tinylm", diagnosis(onset_step=101, first_rank=1), key=2)
    _feed(series, range(101, 102))
    assert series.backfill
    store.transition(other.id, "resolved", "observation passed", actor="supervisor")
    store.transition(inc.id, "resolved", "observation passed", actor="supervisor")
    _feed(series, range(102, 103))  # resolved: its earlier rows go out at once, nothing more after
    assert set(_stored(store, other.id)) == set(range(101 - RING_STEPS, 102)) & set(range(1, 102))
    assert series.backfill == {}


def test_the_ring_holds_every_rank_only_for_its_newest_steps(store: IncidentStore) -> None:
    """A job of many ranks does not hold ``RING_STEPS`` steps of every rank's record: past the newest
    ``RING_ALL_RANKS_STEPS`` the ring keeps the first ``MAX_RANKS`` ranks (the rows it would write)."""
    series = IncidentSeries(store, "tinylm")
    _feed(series, range(1, RING_STEPS + 10))
    sizes = [len(records) for _, records, _ in series.ring]
    assert len(sizes) == RING_STEPS
    assert sizes[-RING_ALL_RANKS_STEPS:] == [RANKS] * RING_ALL_RANKS_STEPS
    assert sizes[:-RING_ALL_RANKS_STEPS] == [MAX_RANKS] * (RING_STEPS - RING_ALL_RANKS_STEPS)
    assert all(
        r.rank < MAX_RANKS for _, records, _ in list(series.ring)[:-RING_ALL_RANKS_STEPS] for r in records
    )

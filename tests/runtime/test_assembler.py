"""StepAssembler: steps released in order, complete or past a deadline; rewinds drop the old timeline."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.runtime import assembler
from supervisor.runtime.assembler import StepAssembler


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def rec(step: int, rank: int, loss: float = 1.0) -> dict:
    return {"step": step, "rank": rank, "loss": loss}


@pytest.fixture
def gaps(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, list[int]]]:
    """(step, ranks) of every ``rank_record_missing`` line the assembler logs."""
    seen: list[tuple[int, list[int]]] = []

    def warning(event: str, **kw: Any) -> None:
        seen.append((kw["step"], kw["ranks"]))

    monkeypatch.setattr(assembler, "log", SimpleNamespace(warning=warning))
    return seen


def test_step_released_only_when_all_ranks_reported() -> None:
    a = StepAssembler(2, deadline_s=5.0, clock=Clock())
    a.add(0, rec(1, 0))
    assert a.ready() == []
    a.add(1, rec(1, 1))
    [(step, records)] = a.ready()
    assert step == 1 and [r.rank for r in records] == [0, 1]


def test_partial_step_released_after_deadline_and_in_order(gaps: list[tuple[int, list[int]]]) -> None:
    clock = Clock()
    a = StepAssembler(2, deadline_s=5.0, clock=clock)
    a.add(0, rec(1, 0))
    a.add(0, rec(2, 0))
    assert a.ready() == []  # rank 1 may still send step 1: it reported nothing newer
    clock.t = 6.0
    out = a.ready()
    assert [s for s, _ in out] == [1, 2]
    assert [len(r) for _, r in out] == [1, 1]
    assert a.missing == 2 and gaps == [(1, [1]), (2, [1])]


def test_a_rank_that_moved_on_releases_the_step_at_once_and_the_gap_is_reported(
    gaps: list[tuple[int, list[int]]],
) -> None:
    """Records of one rank arrive in order: rank 1 reporting step 2 means its step 1 is lost."""
    clock = Clock()
    a = StepAssembler(2, deadline_s=5.0, clock=clock)
    a.add(0, rec(1, 0))
    a.add(0, rec(2, 0))
    a.add(1, rec(2, 1))
    out = a.ready()
    assert [s for s, _ in out] == [1, 2] and [len(r) for _, r in out] == [1, 2]
    assert a.missing == 1 and gaps == [(1, [1])]


def test_tags_are_released_once_their_step_no_longer_waits() -> None:
    released: list[tuple[str, int]] = []
    a = StepAssembler(2, deadline_s=5.0, clock=Clock(), on_release=released.append)
    a.add(0, rec(1, 0), ("L0", 1))
    a.add(0, {"step": 1, "rank": 0, "control": True, "events": []}, ("L0", 2))
    assert released == [("L0", 2)]  # a control message never waits
    a.add(1, rec(1, 1), ("L1", 1))
    assert len(a.ready()) == 1 and sorted(released) == [("L0", 1), ("L0", 2), ("L1", 1)]
    a.add(0, rec(1, 0), ("L0", 3))  # below the watermark: dropped, released at once
    assert ("L0", 3) in released


def test_resent_steps_below_watermark_are_dropped() -> None:
    a = StepAssembler(1, deadline_s=5.0, clock=Clock())
    a.add(0, rec(1, 0))
    assert len(a.ready()) == 1
    a.add(0, rec(1, 0))
    assert a.ready() == []


def test_rewind_ignores_records_of_the_abandoned_timeline_until_each_rank_resyncs() -> None:
    a = StepAssembler(2, deadline_s=5.0, clock=Clock())
    for s in range(1, 11):
        a.add(0, rec(s, 0))
        a.add(1, rec(s, 1))
    assert len(a.ready()) == 10
    a.rewind(4)
    a.add(1, rec(11, 1, loss=99.0))  # late record of the old timeline
    a.add(0, rec(5, 0))
    a.add(1, rec(5, 1))
    [(step, records)] = a.ready()
    assert step == 5 and all(r.loss == 1.0 for r in records)


def test_reached_is_the_furthest_step_of_any_rank_on_the_current_timeline() -> None:
    a = StepAssembler(2, deadline_s=5.0, clock=Clock())
    assert a.reached() is None
    for s in range(1, 8):
        a.add(0, rec(s, 0))
    for s in range(1, 5):  # rank 1 died; its records for steps 5-7 were lost in its send buffer
        a.add(1, rec(s, 1))
    assert a.reached() == 7 and [s for s, _ in a.ready()] == [1, 2, 3, 4]
    a.rewind(2)
    assert a.reached() is None
    a.add(0, rec(9, 0))  # in flight from the abandoned timeline
    assert a.reached() is None
    a.add(0, rec(3, 0))
    assert a.reached() == 3


def test_control_messages_are_heartbeats_not_steps() -> None:
    clock = Clock()
    a = StepAssembler(1, deadline_s=5.0, clock=clock)
    a.add(0, {"step": 3, "rank": 0, "control": True, "events": ["directive_applied:x:freeze"]})
    assert a.ready() == [] and a.skipped == 0
    clock.t = 10.0
    assert a.silent_ranks(5.0, range(1), 100.0) == [0]
    a.add(0, {"step": 3, "rank": 0, "control": True, "events": []})
    assert a.silent_ranks(5.0, range(1), 100.0) == []


def test_a_rank_not_heard_from_since_start_gets_the_startup_timeout() -> None:
    clock = Clock()
    a = StepAssembler(2, deadline_s=5.0, clock=clock)
    clock.t = 50.0
    a.add(0, rec(1, 0))
    assert a.silent_ranks(5.0, range(2), 100.0) == []
    clock.t = 101.0
    assert a.silent_ranks(5.0, range(2), 100.0) == [0, 1]
    a.touch(started=True)
    assert a.silent_ranks(5.0, range(2), 100.0) == []


def test_unusable_records_are_counted() -> None:
    a = StepAssembler(1, deadline_s=5.0, clock=Clock())
    a.add(0, {"step": "x"})
    a.add(0, {"loss": 1.0})
    assert a.skipped == 2


def test_silent_ranks_with_every_rank_heard_or_one_stale_missing_or_foreign() -> None:
    """The answer when every rank of the range was heard from recently (found without a walk over the
    ranks) and each way it is not: one rank stale, one never heard, a rank outside the range heard."""
    clock = Clock()
    a = StepAssembler(4, deadline_s=5.0, clock=clock)
    for r in range(4):
        a.add(r, rec(1, r))
    assert a.silent_ranks(5.0, range(4), 100.0) == []
    clock.t = 4.0
    for r in (0, 1, 3):
        a.add(r, rec(2, r))
    clock.t = 6.0
    assert a.silent_ranks(5.0, range(4), 100.0) == [2]  # rank 2 last heard at 0.0
    a.add(2, rec(2, 2))
    assert a.silent_ranks(5.0, range(4), 100.0) == []
    assert a.silent_ranks(5.0, range(5), 1.0) == [4]  # one more rank, never heard from
    b = StepAssembler(3, deadline_s=5.0, clock=clock)
    for r in (0, 1, 7):  # a record naming rank 7 of a 3-rank group: rank 2 is still silent
        b.add(r, rec(1, r))
    clock.t = 200.0
    b.touch()
    assert b.silent_ranks(5.0, range(3), 100.0) == [2]


# -- batches decoded as one frame (add_frame) --------------------------------------------------------
def frame(*recs: dict) -> Any:
    from supervisor.core.frame import StepFrame

    return StepFrame(
        len(recs),
        {
            "step": [r["step"] for r in recs],
            "rank": [r["rank"] for r in recs],
            "loss": [r["loss"] for r in recs],
        },
    )


def losses(f: Any) -> list[tuple[int, float]]:
    return [(r.rank, r.loss) for r in f]


def test_a_step_that_came_in_one_batch_in_rank_order_is_that_batch() -> None:
    released: list[int] = []
    a = StepAssembler(3, deadline_s=5.0, clock=Clock(), on_release_unit=released.append)
    whole = frame(rec(1, 0), rec(1, 1), rec(1, 2))
    a.add_frame(whole, unit=7)
    assert released == []  # held until its step is analysed
    [(step, got)] = a.ready()
    assert step == 1 and got is whole and released == [7]
    a.add_frame(frame(rec(2, 2, 3.0), rec(2, 0, 1.0), rec(2, 1, 2.0)), unit=8)
    [(_, got)] = a.ready()
    assert losses(got) == [(0, 1.0), (1, 2.0), (2, 3.0)]  # in rank order, as record by record


def test_a_step_over_several_batches_and_a_rank_sent_again_read_as_record_by_record() -> None:
    a = StepAssembler(3, deadline_s=5.0, clock=Clock())
    a.add_frame(frame(rec(1, 0, 1.0), rec(1, 1, 1.0)))
    a.add(2, rec(1, 2, 9.0), ("l2", 1))
    a.add_frame(frame(rec(1, 1, 5.0)))  # rank 1 again: the newer record counts
    [(_, got)] = a.ready()
    assert losses(got) == [(0, 1.0), (1, 5.0), (2, 9.0)]


def test_a_batch_of_several_steps_feeds_each_and_is_released_with_the_last() -> None:
    released: list[int] = []
    a = StepAssembler(2, deadline_s=5.0, clock=Clock(), on_release_unit=released.append)
    a.add_frame(frame(rec(1, 0), rec(2, 0), rec(3, 0), rec(1, 1), rec(2, 1)), unit=1)
    assert [s for s, _ in a.ready()] == [1, 2] and released == []  # step 3 still waits for rank 1
    a.add_frame(frame(rec(3, 1)), unit=2)
    assert [(s, len(f)) for s, f in a.ready()] == [(3, 2)] and released == [1, 2]


def test_a_frame_obeys_the_watermark_and_the_resync_after_a_rewind() -> None:
    released: list[int] = []
    a = StepAssembler(2, deadline_s=5.0, clock=Clock(), on_release_unit=released.append)
    a.add_frame(frame(rec(1, 0), rec(1, 1), rec(2, 0), rec(2, 1)), unit=1)
    assert [s for s, _ in a.ready()] == [1, 2]
    a.add_frame(frame(rec(2, 0), rec(2, 1)), unit=2)  # a resend below the watermark
    assert a.ready() == [] and released == [1, 2]
    a.rewind(1)
    a.add_frame(frame(rec(3, 0), rec(2, 1)), unit=3)  # rank 0 still on the abandoned timeline
    a.add_frame(frame(rec(2, 0)), unit=4)
    [(step, got)] = a.ready()
    assert step == 2 and losses(got) == [(0, 1.0), (1, 1.0)] and released == [1, 2, 3, 4]


def test_once_every_rank_is_back_on_the_timeline_a_batch_is_taken_in_columns_again() -> None:
    a = StepAssembler(2, deadline_s=5.0, clock=Clock())
    a.add_frame(frame(rec(1, 0), rec(1, 1)))
    a.ready()
    a.rewind(0)
    a.add_frame(frame(rec(1, 0), rec(1, 1)))  # both ranks resync at their first step
    assert [s for s, _ in a.ready()] == [1]
    whole = frame(rec(2, 0), rec(2, 1))
    a.add_frame(whole)
    [(step, got)] = a.ready()
    assert step == 2 and got is whole  # no record built: the batch's own columns

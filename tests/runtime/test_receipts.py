"""Receipts: which numbered records are consumed, what is durable, and when a link must resend."""

from __future__ import annotations

from pathlib import Path

from supervisor.runtime.receipts import Receipts


def test_the_consumed_mark_stays_below_a_record_still_waiting_for_its_step() -> None:
    r = Receipts()
    for seq in (1, 2, 3):
        assert r.fresh("L", seq)
    r.hold(("L", 2))
    r.hold(("L", 3))
    assert r.consumed() == {"L": 1}
    r.release(("L", 2))
    assert r.consumed() == {"L": 2}
    r.release(("L", 3))
    assert r.consumed() == {"L": 3}
    assert r.ack_for("L") == 0  # nothing is durable until the state is written
    r.made_durable(r.consumed())
    assert r.ack_for("L") == 3


def test_duplicates_are_refused_and_gaps_are_counted() -> None:
    r = Receipts({"L": 5})
    assert not r.fresh("L", 5) and not r.fresh("L", 3)
    assert r.fresh("L", 6) and r.lost == 0
    assert r.fresh("L", 9) and r.lost == 2


def test_a_new_incarnation_asks_for_what_the_link_still_holds() -> None:
    r = Receipts({"L": 10})  # what the dead supervisor had made durable
    # The link holds 11..20 (sent to the dead one, never made durable) and now sends 21..22.
    assert r.offer("L", [21, 22], (11, 22)) == 11
    assert r.offer("L", [11, 12], (11, 22)) is None  # the resend, in order, is taken
    assert r.offer("L", [13], (11, 22)) is None


def test_an_idle_link_gets_its_records_back_and_a_dropped_range_is_not_asked_for() -> None:
    r = Receipts({"L": 10})
    assert r.offer("L", [], (11, 14)) == 11  # an acknowledgement poll with records not durable here
    assert r.offer("L", [], (5, 10)) is None
    fresh = Receipts({"M": 10})
    # The link's buffer dropped 11..14: it holds 15.. only; the supervisor takes them (a counted gap).
    assert fresh.offer("M", [15, 16], (15, 16)) is None


def test_a_record_waiting_for_its_step_is_not_acknowledged_and_a_successor_gets_it_back(
    tmp_path: Path,
) -> None:
    """Rank 0's record of a step rank 1 has not reported yet waits, unanalysed: the state written
    meanwhile does not reflect it, so its link keeps it, and a supervisor killed now loses none."""
    from supervisor.runtime.controller import Controller
    from tests.runtime.conftest import FAST, make_job
    from tests.runtime.harness import FakeRanks, FakeWorkers

    job = make_job(tmp_path, "waiting", max_steps=200, resources={"num_workers": 2})
    ranks = FakeRanks(2, 200)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    ranks.train(ctl, 10)
    ranks.step += 1
    ranks.send(ctl, 0, [ranks.record(ranks.step, 0)])  # rank 1's record of step 11 is still to come
    ctl.iterate()
    ctl.persist(force=True)
    ranks.resend(ctl)  # the link's acknowledgement poll
    assert ctl.assembler.watermark == 10 and ranks.unacked(0) == 1
    # Killed here: the successor asks for the record again and analyses step 11 with both ranks.
    again = Controller(job, FAST, attach=True, workers=FakeWorkers(ranks))
    ranks.resend(again)
    ranks.send(again, 1, [ranks.record(ranks.step, 1)])
    again.iterate()
    assert again.assembler.watermark == 11 and again.assembler.missing == 0


def test_a_batch_held_whole_keeps_each_links_mark_below_its_lowest_record() -> None:
    from supervisor.runtime.receipts import Receipts

    r = Receipts()
    assert r.fresh_batch(["a", "b"], [1, 1], [1, 1]) is None  # every record the next of its link
    unit = r.hold_unit({"a": 1, "b": 1})
    assert r.fresh_batch(["a", "b"], [1, 1], [2, 2]) is None
    later = r.hold_unit({"a": 2, "b": 2})
    assert r.consumed() == {"a": 0, "b": 0}
    r.release_unit(unit)
    assert r.consumed() == {"a": 1, "b": 1}
    r.release_unit(later)
    assert r.consumed() == {"a": 2, "b": 2}
    # A resend and a gap: told record by record, as ``fresh`` tells them.
    assert r.fresh_batch(["a", "b"], [1, 1], [2, 5]) == [False, True] and r.lost == 2
    assert r.offer_next(["c"], [1]) and not r.offer_next(["c"], [1])  # the next once, then not again

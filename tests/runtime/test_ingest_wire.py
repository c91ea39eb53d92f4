"""The supervisor actor's ingest over the packed wire (sdk/wire.py), its only way in: good
batches are analysed as before, and malformed or hostile input is refused with a reason or made
harmless -- the control loop never dies of it and goes on analysing the records that follow."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

from supervisor.logging import get_logger
from supervisor.runtime.actor import SupervisorActor
from supervisor.runtime.controller import Controller
from supervisor.sdk.wire import WIRE_VERSION, pack
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers
from tests.sdk.test_wire import _mutations


def _actor(tmp_path: Path, ranks: FakeRanks) -> SupervisorActor:
    """The actor's ingest methods around a real controller (no Ray: its __init__ only adds those)."""
    job = make_job(tmp_path, "wire", max_steps=400, resources={"num_workers": ranks.world_size})
    actor = SupervisorActor.__new__(SupervisorActor)
    actor.ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    actor.ctl.boot()
    actor.refused, actor._dicts, actor.log = 0, False, get_logger("test")
    actor.record_calls, actor._calls_lock = 0, threading.Lock()
    return actor


def _step(actor: SupervisorActor, ranks: FakeRanks, seqs: dict[int, int]) -> list[Any]:
    """Every rank's record of the next step in one packed batch (as the emulator sends them)."""
    ranks.step += 1
    groups = []
    for r in range(ranks.world_size):
        seqs[r] = seqs.get(r, 0) + 1
        groups.append((r, f"w{r}", (seqs[r], seqs[r]), [seqs[r]], [ranks.record(ranks.step, r)]))
    replies = actor.ingest_packed(pack(groups))
    actor.ctl.iterate()
    return replies  # type: ignore[return-value]


def test_packed_batches_are_analysed_step_by_step(tmp_path: Path) -> None:
    ranks = FakeRanks(4, 400)
    actor = _actor(tmp_path, ranks)
    seqs: dict[int, int] = {}
    for _ in range(30):
        replies = _step(actor, ranks, seqs)
        assert len(replies) == 4 and all("acked" in r and "refused" not in r for r in replies)
    assert actor.ctl.assembler.watermark == 30 and actor.ctl.assembler.missing == 0
    assert actor.ctl.assembler.skipped == 0 and actor.ctl.receipts.lost == 0
    assert actor.record_calls == 30  # one packed batch per step, whatever the ranks in it


def test_hostile_input_is_refused_or_harmless_and_the_loop_goes_on(tmp_path: Path) -> None:
    ranks = FakeRanks(2, 400)
    actor = _actor(tmp_path, ranks)
    seqs: dict[int, int] = {}
    for _ in range(5):
        _step(actor, ranks, seqs)
    # Record dicts of the wrong shape where the bookkeeping reads them (rank, events, attrs), and
    # calls of the wrong shape: refused with a reason, or taken and counted as unusable.
    bad_records = [{"step": 6, "rank": "x", "loss": 1.0}, {"step": 6, "events": 5, "loss": 1.0},
                   {"step": 6, "attrs": [1], "loss": 1.0}, "not a record", {"step": 6, "rank": None}]  # fmt: skip
    for i, rec in enumerate(bad_records):
        actor.ingest_packed(pack([(1, "hostile", (100 + i, 100 + i), [100 + i], [rec])]))  # type: ignore[list-item]
        actor.ctl.iterate()
    groups = pack([(0, "l", None, [1], [ranks.record(6, 0)])])["groups"]
    for batch in ["abc", [], {"wire": -1}, {"wire": WIRE_VERSION, "groups": "x"},
                  {"wire": WIRE_VERSION, "groups": groups, "m": 1, "seq": ["1"]}]:  # fmt: skip
        assert "refused" in actor.ingest_packed(batch)
    # Packed batches damaged anywhere.
    rng = random.Random(7)
    good = pack([(r, f"h{r}", (1, 1), [1], [ranks.record(6, r)]) for r in range(2)])
    for _ in range(300):
        reply = actor.ingest_packed(_mutations(good, rng))
        assert isinstance(reply, list) or "refused" in reply
        actor.ctl.iterate()
    assert actor.refused > 5
    # The loop is alive and analyses what honest links send next.
    at = actor.ctl.assembler.watermark
    for _ in range(5):
        _step(actor, ranks, seqs)
    assert actor.ctl.assembler.watermark >= at + 4


def test_a_batch_mixing_a_link_without_an_id_still_numbers_the_others(tmp_path: Path) -> None:
    """A link without an id numbers nothing; the links beside it in the same batch are still checked
    for resends and acknowledged once their step is analysed."""
    ranks = FakeRanks(2, 400)
    actor = _actor(tmp_path, ranks)
    batch = pack([(0, None, None, [1], [ranks.record(1, 0)]), (1, "l1", (1, 1), [1], [ranks.record(1, 1)])])
    actor.ingest_packed(batch)
    actor.ctl.iterate()
    assert actor.ctl.assembler.watermark == 1
    assert actor.ctl.receipts.consumed().get("l1") == 1  # analysed: l1's record 1 may be forgotten
    actor.ingest_packed(batch)  # sent again: l1's record is known, the other is past the watermark
    actor.ctl.iterate()
    assert actor.ctl.receipts.received["l1"] == 1 and actor.ctl.receipts.lost == 0


def test_a_batch_of_several_steps_is_noted_as_its_records_one_by_one(tmp_path: Path) -> None:
    """A fast run's batch (every link's run of steps, some records carrying events) read in columns
    leaves the bookkeeping as the same records noted one by one: checkpoints seen in order, batch
    indices per step, directive acknowledgements, every step analysed."""
    outcome = []
    for as_dicts in (False, True):
        ranks = FakeRanks(4, 400)
        actor = _actor(tmp_path / str(as_dicts), ranks)
        noted: list[tuple[int, int, list[str]]] = []
        note_events = actor.ctl.directives.note_events

        def spy(
            rank: int, step: int, evs: list[str], note: Any = note_events, seen: list[Any] = noted
        ) -> None:
            seen.append((rank, step, list(evs)))
            note(rank, step, evs)

        actor.ctl.directives.note_events = spy  # type: ignore[method-assign]
        for first in (1, 6):
            groups = []
            for r in range(4):
                recs = []
                for step in range(first, first + 5):
                    rec = ranks.record(step, r, ["checkpoint_saved:4"] if step == 4 and r == 2 else None)
                    if step == 7:
                        rec["events"] = [f"checkpoint_saved:{step}", "resumed"] if r else []
                    rec["attrs"] = {"batch": 100 + step, **({"grad_clip": 1.0} if r == 3 else {})}
                    recs.append(rec)
                groups.append((r, f"l{r}", (first, first + 4), list(range(first, first + 5)), recs))
            actor.ctl.ingest_wire(pack(groups), as_dicts=as_dicts)
            actor.ctl.iterate()
        ctl = actor.ctl
        assert ctl.assembler.watermark == 10 and ctl.receipts.lost == 0
        outcome.append((noted, dict(ctl.batches), ctl.state.reported_grad_clip))
    columns, records = outcome
    assert columns == records
    assert [(rank, step) for rank, step, _ in columns[0]] == [(2, 4), (1, 7), (2, 7), (3, 7)]
    assert columns[1][7] == 107 and columns[2] == 1.0

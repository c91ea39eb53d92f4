"""The supervisor's state file is written when the state changed, and is never behind what it acks.

The real controller with fake workers (tests/runtime/harness.py). Every ``persist`` leaves the
file equal to the state in memory; an unchanged state is not written again (no rewrite and
fsync while the workers are frozen or held); the durable mark a link is answered is the one
the file holds. Plus the worker group's health check, which asks Ray at most once per
``loop_interval_s``.
"""

from __future__ import annotations

import json
import random
from collections import deque
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.runtime import RuntimeSettings
from supervisor.runtime import group as group_module
from supervisor.runtime import state as state_module
from supervisor.runtime.controller import Controller
from supervisor.runtime.group import WorkerGroup
from supervisor.runtime.observe import StepStats
from supervisor.runtime.state import BufferJSON, RuntimeState, StepHistory
from supervisor.sdk.directives import Freeze
from tests.runtime.conftest import FAST, make_job, wait_for
from tests.runtime.harness import FakeRanks, FakeWorkers, send


def setup(tmp_path: Path) -> tuple[FakeRanks, Controller]:
    job = make_job(tmp_path, "persist", max_steps=100)
    ranks = FakeRanks(2, 100)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    return ranks, ctl


def written(ctl: Controller) -> tuple[int, str]:
    """(inode, text) of the state file: every write replaces the file, so a new inode is a write."""
    return ctl.state_path.stat().st_ino, ctl.state_path.read_text(encoding="utf-8")


def test_an_unchanged_state_is_not_written_again(tmp_path: Path) -> None:
    ranks, ctl = setup(tmp_path)
    ranks.train(ctl, 10)
    ctl.persist(force=True)
    first = written(ctl)
    assert first[1] == ctl.state.dump()
    for _ in range(3):
        ctl.iterate()  # nothing arrives: the state stays as it is
        ctl.persist(force=True)
    assert written(ctl) == first, "an identical state was written again"


def test_a_changed_state_is_on_disk_before_its_records_are_acked(tmp_path: Path) -> None:
    ranks, ctl = setup(tmp_path)
    ranks.train(ctl, 10)
    ctl.persist(force=True)
    inode, _ = written(ctl)
    ranks.train(ctl, 3)  # steps 11-13: consumed, and acknowledged only once written
    ctl.persist(force=True)
    inode_after, text = written(ctl)
    assert inode_after != inode and text == ctl.state.dump()
    saved = RuntimeState.model_validate_json(text)
    assert saved.watermark == ctl.assembler.watermark >= 13
    for rank in range(2):
        link = ranks.link(rank)
        assert ctl.receipts.ack_for(link) == saved.receipts[link] > 0, "acked beyond what the file holds"
        assert send(ctl, rank, [], [], link)["acked"] == saved.receipts[link]


def test_a_directive_written_outside_persist_does_not_hide_the_next_write(tmp_path: Path) -> None:
    """``issue`` writes the state itself; the next persist compares with the file, not its own copy."""
    ranks, ctl = setup(tmp_path)
    ranks.train(ctl, 5)
    ctl.persist(force=True)
    ctl.issue(Freeze(reason="test", id="freeze-1"))
    assert [d["id"] for d in RuntimeState.model_validate_json(written(ctl)[1]).directives] == ["freeze-1"]
    ctl.persist(force=True)
    assert written(ctl)[1] == ctl.state.dump()


def test_step_stats_json_is_every_field() -> None:
    stats = StepStats(step=3, loss=2.5, grad_norm=None, update_ratio=1e-3, tokens_per_s=10.0, lr=1e-4,
                      nonfinite=True, ranks=2)  # fmt: skip
    assert stats.to_json() == asdict(stats)
    assert StepStats(**stats.to_json()) == stats


def test_the_group_asks_ray_at_most_once_per_loop_interval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[list[Any]] = []

    def wait(refs: list[Any], num_returns: int, timeout: float) -> tuple[list[Any], list[Any]]:
        calls.append(list(refs))
        return [], list(refs)

    monkeypatch.setattr(group_module.ray, "wait", wait)
    settings = RuntimeSettings.model_validate({"loop_interval_s": 0.2})
    group = WorkerGroup(make_job(tmp_path, "health"), settings, 0)
    group._waits = {0: "ref-0", 1: "ref-1"}
    assert [group.health().state for _ in range(20)] == ["running"] * 20
    assert calls == [["ref-0", "ref-1"]], "asked Ray more than once within loop_interval_s"
    wait_for(lambda: {"n": len(calls), "state": group.health().state}, lambda st: st["n"] == 2, timeout_s=10)


def test_the_history_is_written_as_the_model_writes_it_and_read_back_whole(tmp_path: Path) -> None:
    """The state file's history is joined from each entry's JSON, made once when its step came; it
    reads as the field would have been written (NaN and infinity as such, never null: a restarted
    controller must see the diverged step it had) and restores the same aggregates, also after a
    rewind dropped the newest."""
    odd = [
        StepStats(step=1, loss=float("nan"), nonfinite=True),
        StepStats(step=2, loss=2.5, grad_norm=float("inf")),
    ]
    history = StepHistory(
        [*odd, *(StepStats(step=s, loss=1.0 / s, lr=1e-3) for s in range(3, 40))], maxlen=30
    )
    assert [h.step for h in history] == list(range(10, 40)), "the oldest go past maxlen"
    history.drop_after(31)
    state = RuntimeState(job="j", watermark=31)
    state.hold_history(history)
    whole = RuntimeState(job="j", watermark=31, history=[h.to_json() for h in history])
    assert json.loads(state.dump()) == json.loads(whole.model_dump_json())
    both = StepHistory(odd)
    state.hold_history(both)
    assert (
        json.loads(state.dump())["history"]
        == json.loads(RuntimeState(job="j", history=[h.to_json() for h in odd]).model_dump_json())["history"]
    )
    state.save(tmp_path / "s.json")
    loaded = RuntimeState.load(tmp_path / "s.json")
    assert loaded is not None and [h["step"] for h in loaded.history] == [1, 2]
    nan, inf = loaded.history[0]["loss"], loaded.history[1]["grad_norm"]
    assert nan != nan and inf == float("inf")
    assert [StepStats(**h).to_json() for h in loaded.history][1] == odd[1].to_json()


def test_a_write_serializes_no_step_of_the_history_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A state write costs the same at step 1,000 as at step 10: each step's aggregate is serialized
    once, when it comes, not once per write; a restarted controller reads every step back."""
    ranks, ctl = setup(tmp_path)
    ranks.train(ctl, 30)
    made: list[int] = []
    to_json = StepStats.to_json
    monkeypatch.setattr(StepStats, "to_json", lambda self: made.append(self.step) or to_json(self))
    for _ in range(5):
        ranks.train(ctl, 2)
        ctl.persist(force=True)
    assert set(made) == set(range(31, 41)), "a write serialized older steps again"
    monkeypatch.undo()
    again = Controller(ctl.job, FAST, attach=True, workers=FakeWorkers(ranks))
    assert [h.step for h in again.history] == [h.step for h in ctl.history] == list(range(1, 41))
    assert [h.to_json() for h in again.history] == [h.to_json() for h in ctl.history]


def _buffers_state(bufs: dict[str, deque[Any]]) -> dict[str, Any]:
    """A state shaped as the analyzer's: buffers (lists of tuples) in nested dicts beside other values."""
    return {
        "version": 2,
        "detector": {
            "trackers": {
                name: {"hist": list(b), "floor": 0.1, "level": [1.0, 2.0]} for name, b in bufs.items()
            },
            "rank_steps": [1, 2, 3],
            "rank_losses": [(s, {r: s / (r + 1) for r in range(3)}) for s in range(4)],
        },
        "open": None,
        "excursions": [[1, None, 0.5]],
    }


def test_the_analyzers_buffers_are_written_as_the_whole_state_would_be_through_any_change() -> None:
    """Byte for byte the serialization of the whole state, write after write, while the buffers take
    a new value (dropping the oldest past their length), give back the newest (a rollback), are
    rebuilt from some of their entries, cleared, or hold NaN and infinity."""
    rng = random.Random(7)
    bufs = {name: deque(maxlen=40) for name in ("loss", "grad", "source:web")}
    enc, whole = BufferJSON(), state_module._ANY
    step = 0
    for _ in range(400):
        for b in bufs.values():
            op = rng.random()
            if op < 0.7:
                step += 1
                x = rng.choice([rng.gauss(0, 1), float("nan"), float("inf"), 1e-300])
                b.append((step, x, rng.random() < 0.5))
            elif op < 0.85 and b:
                b.pop()
            elif op < 0.93:
                kept = [t for t in b if t[0] % 3]
                b.clear()
                b.extend(kept)
            elif op < 0.96:
                b.clear()
        state = _buffers_state(bufs)
        assert enc.dump(state) == whole.dump_json(state).decode()
        assert state["detector"]["trackers"]["loss"]["hist"] == list(bufs["loss"]), "the state was changed"


def test_a_write_serializes_only_the_buffers_new_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state write costs the same at step 1,000 as at step 10: a buffer entry already written is
    not serialized again while it is still there."""
    hist: deque[tuple[int, float, bool]] = deque(((s, s / 10, True) for s in range(512)), maxlen=512)
    enc = BufferJSON()
    enc.dump(_buffers_state({"loss": hist}))
    made: list[Any] = []
    real = state_module._ANY

    class Counting:
        def dump_json(self, value: Any) -> bytes:
            if type(value) is tuple:
                made.append(value)
            return real.dump_json(value)

    monkeypatch.setattr(state_module, "_ANY", Counting())
    hist.extend((s, s / 10, True) for s in range(512, 515))
    enc.dump(_buffers_state({"loss": hist}))
    assert [t[0] for t in made if len(t) == 3] == [512, 513, 514], "older entries serialized again"


def test_the_analyzers_state_is_read_back_whole_by_a_restarted_controller(tmp_path: Path) -> None:
    """The state file holds the analyzer's state as the analyzer gives it: a restarted controller's
    analyzer gives the same state again."""
    ranks, ctl = setup(tmp_path)
    ranks.train(ctl, 40)
    ctl.persist(force=True)
    on_disk = json.loads(ctl.state_path.read_text(encoding="utf-8"))["analyzer"]
    as_field = RuntimeState(job="j", analyzer=ctl.flow.analyzer.state_dict()).model_dump_json()
    assert on_disk == json.loads(as_field)["analyzer"], "not what the model's own field would hold"
    assert any(tr["hist"] for tr in on_disk["detector"]["trackers"].values()), "no buffer was written"
    again = Controller(ctl.job, FAST, attach=True, workers=FakeWorkers(ranks))
    # As JSON: a NaN read back is another object, and NaN equals no other NaN.
    assert json.dumps(again.flow.analyzer.state_dict(), sort_keys=True) == json.dumps(
        ctl.flow.analyzer.state_dict(), sort_keys=True
    )

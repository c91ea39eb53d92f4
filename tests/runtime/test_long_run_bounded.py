"""A long run's bookkeeping stays bounded (issue 26, point 4): the runtime state's checkpoint lists
hold what retention left in the store, not every checkpoint the run ever saved, and the batch
numbers kept in memory are those a restarted supervisor would read back. Before, at 64 emulated
ranks over 20,000 steps, the state file grew with every checkpoint saved (549 -> 584 KB), and
every analysed step walked the whole list."""

from __future__ import annotations

from pathlib import Path

from supervisor.runtime.controller import HISTORY_KEPT, Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, saver


def test_checkpoint_lists_and_batches_stay_bounded_over_a_long_clean_run(tmp_path: Path) -> None:
    every, steps, keep = 5, 400, 2
    job = make_job(tmp_path, "long", max_steps=steps, resources={"num_workers": 1},
                   checkpoint={"every_steps": every, "keep": keep})  # fmt: skip
    ranks = FakeRanks(1, steps)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    saved = 0
    for _ in range(steps // 50):
        ranks.train(ctl, 50, checkpoint_every=every)
        saved += 50 // every
        ctl.persist(force=True)
        state = ctl.state
        stored = set(ctl.checkpoints.steps())
        # Every step still listed is one the store still has, and the store keeps `keep` healthy
        # ones plus those still inside their healthy window.
        for name in ("checkpoints_seen", "checkpoints_verified", "checkpoints_healthy"):
            listed = getattr(state, name)
            assert set(listed) <= stored, (name, listed, sorted(stored))
            assert len(listed) <= keep + FAST.healthy_after_steps // every + 1, (name, listed)
        assert len(stored) < saved
    assert ranks.step == steps and max(state.checkpoints_healthy) >= steps - FAST.healthy_after_steps - every


def test_the_batch_numbers_kept_in_memory_are_those_persisted(tmp_path: Path) -> None:
    steps = 2 * HISTORY_KEPT + 300
    job = make_job(tmp_path, "batches", max_steps=steps + 10, resources={"num_workers": 1})
    ranks = FakeRanks(1, steps + 10)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    for step in range(1, steps + 1):
        rec = ranks.record(step, 0) | {"attrs": {"batch": step + 7}}
        ranks.send(ctl, 0, [rec])
        ctl.iterate()
    ctl.persist(force=True)
    assert ctl.current_step == steps
    assert set(ctl.batches) == {int(s) for s in ctl.state.batches}
    assert min(ctl.batches) > steps - 2 * HISTORY_KEPT
    assert ctl.batch_range(steps - 5, steps) == (steps + 2, steps + 7)

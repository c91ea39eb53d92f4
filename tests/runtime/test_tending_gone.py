"""A checkpoint that is not ``verified`` when its healthy window has passed (quarantined since, or
removed by retention) never counts as healthy: the end of a run moved `latest` to it and stopped
the job with "no checkpoint at step 100" (the scale smoke under load: the re-run after a rollback
to 25 left the abandoned timeline's quarantined saves of 50-100, and retention removed them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from supervisor.checkpoint import CheckpointStore, verify
from supervisor.core.model import HealthMark
from supervisor.runtime import tending as tending_mod
from supervisor.runtime.state import RuntimeState
from supervisor.runtime.tending import CheckpointTending
from supervisor.storage import open_backend
from tests.checkpoint.conftest import save_plain


def test_a_checkpoint_gone_or_quarantined_is_never_counted_healthy(tmp_path: Path) -> None:
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    for step in (25, 50, 100):
        save_plain(store, step)
        assert verify(store, step).ok
    store.quarantine(50, "abandoned timeline: training went back to step 25")
    store.quarantine(100, "abandoned timeline: training went back to step 25")
    gone = [o.key for o in store.backend.list(store.key(100, ""))]
    store.backend.delete(gone)  # retention removed it
    state = RuntimeState(job="job", checkpoints_seen=[25, 50, 100], checkpoints_verified=[25, 50, 100])
    tending = CheckpointTending(store, world_size=1, healthy_after_steps=20, keep=0)
    tending.tend(state, 130, quiet=True, near_incident=lambda _s: False, final=True)
    assert state.checkpoints_healthy == [25]
    assert tending.catch_up_latest(state) == 25


class _Log:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.events.append({"event": event, "level": level, **kw})


def test_catching_up_latest_skips_steps_gone_since_and_moves_to_the_newest_healthy_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The state counts 25, 50, 75 and 100 healthy; since then 100 was removed (retention) and 75
    # quarantined (an abandoned timeline): `latest` goes to 50, the run is not stopped.
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    for step in (25, 50, 75, 100):
        save_plain(store, step)
        assert verify(store, step).ok
        store.mark(step, HealthMark.HEALTHY, "20 steps after it without anomaly")
    store.retreat_latest(25)
    store.quarantine(75, "abandoned timeline: training went back to step 50")
    store.backend.delete([o.key for o in store.backend.list(store.key(100, ""))])
    state = RuntimeState(job="job", checkpoints_seen=[25, 50, 75, 100], checkpoints_verified=[25, 50, 75, 100],
                         checkpoints_healthy=[25, 50, 75, 100])  # fmt: skip
    tending = CheckpointTending(store, world_size=1, healthy_after_steps=20, keep=0)
    monkeypatch.setattr(tending_mod, "log", logs := _Log())
    assert tending.catch_up_latest(state) == 50
    assert store.latest() == 50
    skipped = {e["step"]: e["why"] for e in logs.events if e["event"] == "latest_candidate_skipped"}
    assert set(skipped) == {75, 100} and "quarantined" in skipped[75] and "no checkpoint" in skipped[100]
    assert state.checkpoints_healthy == [25, 50] and 100 not in state.checkpoints_verified


def test_catching_up_latest_with_no_healthy_step_left_leaves_latest_as_it_is(tmp_path: Path) -> None:
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    save_plain(store, 25)
    assert verify(store, 25).ok
    store.quarantine(25, "the ranks' restore check refused it")
    state = RuntimeState(job="job", checkpoints_seen=[25, 100], checkpoints_verified=[25, 100],
                         checkpoints_healthy=[25, 100])  # fmt: skip
    tending = CheckpointTending(store, world_size=1, healthy_after_steps=20, keep=0)
    assert tending.catch_up_latest(state) is None
    assert state.checkpoints_healthy == []


@pytest.mark.parametrize("how", ["corrupt", "abandoned"])
def test_a_step_whose_save_failed_verification_is_verified_again_when_it_is_saved_again(
    tmp_path: Path, how: str
) -> None:
    """The corrupt-checkpoint drill under load: a late record of the dead generation named the
    corrupt save of step 100 after the restart's rewind; its verification (failed, or passed on
    the files of a save already quarantined) left 100 counted as verified, so the new timeline's
    re-save of 100 was never verified, never healthy, and retention removed it together with the
    quarantined save kept beside it."""
    store = CheckpointStore(open_backend(str(tmp_path / "store")), "job")
    m = save_plain(store, 100)
    if how == "corrupt":  # its files damaged: verification fails and quarantines it
        model = store.file_key(m, next(f.name for f in m.files if "model" in f.components))
        store.backend.put_bytes(model, bytes(len(store.backend.get_bytes(model))))
    else:  # intact, but of the timeline a rollback abandoned: quarantined before any verification
        store.quarantine(100, "abandoned timeline: training went back to step 75")
    state = RuntimeState(job="job", checkpoints_seen=[100])
    tending = CheckpointTending(store, world_size=1, healthy_after_steps=20, keep=0)
    tending.tend(state, 101, quiet=True, near_incident=lambda _s: False)
    assert store.manifest(100).health is HealthMark.QUARANTINED
    assert 100 not in state.checkpoints_verified and 100 not in state.checkpoints_seen
    save_plain(store, 100)  # the new timeline saves step 100 again (the quarantined save is kept beside it)
    state.checkpoints_seen.append(100)
    tending.tend(state, 125, quiet=True, near_incident=lambda _s: False)
    assert store.manifest(100).health is HealthMark.HEALTHY and state.checkpoints_healthy == [100]
    assert [m.health for m in store.saves(100)] == [HealthMark.QUARANTINED, HealthMark.HEALTHY]

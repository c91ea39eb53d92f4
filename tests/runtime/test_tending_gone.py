"""A checkpoint that is not ``verified`` when its healthy window has passed (quarantined since, or
removed by retention) never counts as healthy: the end of a run moved `latest` to it and stopped
the job with "no checkpoint at step 100" (the scale smoke under load: the re-run after a rollback
to 25 left the abandoned timeline's quarantined saves of 50-100, and retention removed them)."""

from __future__ import annotations

from pathlib import Path

from supervisor.checkpoint import CheckpointStore, verify
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

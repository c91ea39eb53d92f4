"""The rank emulator saves as a real rank does: a step whose checkpoint belongs to an abandoned
timeline (quarantined after a rollback) or is a diagnostic snapshot is saved again, the old save
kept as history; a step this timeline has saved already is not saved twice. The scale smoke under
load froze at its last step (100), rolled back to 25 and re-ran: the emulator skipped the saves at
50, 75 and 100 because their quarantined manifests were still there, and the end of the run had
no checkpoint of the new timeline to move `latest` to. Pure: no Ray is started."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from supervisor.checkpoint.lifecycle import open_checkpoint_store
from supervisor.core.model import HealthMark
from supervisor.drills.emulator import EmulatorConfig, EmulatorHost
from supervisor.runtime.state import RuntimeState
from supervisor.runtime.tending import CheckpointTending
from tests.runtime.conftest import make_job


def _host(tmp_path: Path) -> EmulatorHost:
    job = make_job(tmp_path, "emu", resources={"num_workers": 2})
    return EmulatorHost(job.model_dump(mode="json"), asdict(EmulatorConfig(ranks=2, checkpoint_every=25)), 0)


def test_a_quarantined_save_of_an_abandoned_timeline_is_saved_again(tmp_path: Path) -> None:
    host = _host(tmp_path)
    store = open_checkpoint_store(host.job)
    host._checkpoint(50, diagnostic=False)
    first = store.manifest(50)
    store.quarantine(50, "abandoned timeline: training went back to step 25")
    host._checkpoint(50, diagnostic=False)  # the re-run reaches step 50 again
    again = store.manifest(50)
    assert again.health is HealthMark.UNVERIFIED and again.files != first.files
    assert [m.health for m in store.history(50)] == [HealthMark.QUARANTINED]


def test_a_checkpoint_over_a_diagnostic_snapshot_is_saved(tmp_path: Path) -> None:
    host = _host(tmp_path)
    store = open_checkpoint_store(host.job)
    host._checkpoint(100, diagnostic=True)
    host._checkpoint(100, diagnostic=False)
    assert store.manifest(100).health is HealthMark.UNVERIFIED
    assert [m.health for m in store.history(100)] == [HealthMark.DIAGNOSTIC]


def test_a_step_this_timeline_saved_is_not_saved_twice(tmp_path: Path) -> None:
    host = _host(tmp_path)
    store = open_checkpoint_store(host.job)
    host._checkpoint(75, diagnostic=False)
    saved = store.manifest(75)
    host._checkpoint(75, diagnostic=True)  # a snapshot at a step that has its checkpoint
    host._checkpoint(75, diagnostic=False)
    assert store.manifest(75) == saved and store.history(75) == []


def test_a_run_that_rolled_back_from_its_last_step_ends_with_latest_on_the_new_timelines_last_save(
    tmp_path: Path,
) -> None:
    host = _host(tmp_path)
    store = open_checkpoint_store(host.job)
    state = RuntimeState(job="emu")
    tending = CheckpointTending(store, world_size=2, healthy_after_steps=5, keep=0)

    def run(steps: range) -> None:
        for step in steps:
            host._checkpoint(step, diagnostic=False)
            state.checkpoints_seen.append(step)
            tending.tend(state, step + 10, quiet=step == 25, near_incident=lambda s: s > 25)

    run(range(25, 101, 25))  # the freeze lands at step 100: only 25 turned healthy
    host._checkpoint(100, diagnostic=True)
    tending.abandon_after(state, 25)  # rollback 100 -> 25
    run(range(50, 101, 25))  # the re-run; the incident is closed at its end
    tending.tend(state, 100, quiet=True, near_incident=lambda _s: False, final=True)
    assert tending.catch_up_latest(state) == 100 and store.latest() == 100
    assert [m.health for m in store.history(100)] == [HealthMark.QUARANTINED]

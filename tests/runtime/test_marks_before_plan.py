"""A supervisor that falls behind a fast run takes many steps' records in one ingest batch: the
healthy window of a checkpoint and the fault after it can come together. The checkpoint marks
those records justify (verified, its healthy window passed before the fault) are settled before
the incident's plan chooses its rollback target, as they are when the supervisor keeps up: the
decision does not depend on how the records were batched."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, saver, spikes_once

REWARM = str(Path(__file__).parent / "policies" / "rewarm.yaml")
ONSET = 80  # rewarm.yaml rolls back 30 steps before the onset: the target is checkpoint 50
EVERY = 25


def fall_behind(ctl: Controller, ranks: FakeRanks, steps: int) -> None:
    """``steps`` steps trained while the supervisor's loop did not run: their records wait in its
    inbox and are all taken by the next ``iterate``."""
    for _ in range(steps):
        ranks.step += 1
        saved = ranks.step % EVERY == 0
        if saved and ranks.on_checkpoint is not None:
            ranks.on_checkpoint(ranks.step)
        for rank in range(ranks.world_size):
            ranks.send(ctl, rank, [ranks.record(ranks.step, rank, ["checkpoint_saved"] if saved else [])])


def first_plan(tmp_path: Path, name: str, *, behind: bool) -> tuple[Controller, int]:
    job = make_job(tmp_path / name, name, max_steps=200, policy=REWARM, resources={"num_workers": 1})
    ranks = FakeRanks(1, 200, spikes_once(ONSET), grads_follow_loss=True)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    ranks.train(ctl, 20, checkpoint_every=EVERY)  # kept up: no checkpoint yet
    if behind:
        fall_behind(ctl, ranks, 110)  # checkpoints 25..125, the fault at 80 and its diagnosis
        assert not ctl.state.checkpoints_seen and ctl.state.active is None
        ctl.iterate()
        assert ctl.state.active is not None, (
            "the incident was not planned in the iteration that took the batch"
        )
    else:
        ranks.run(ctl, lambda: ctl.state.active is not None, checkpoint_every=EVERY)
    [inc] = ctl.incidents.list_incidents(job=name)
    return ctl, inc.id


def rolled_back_to(ctl: Controller, incident_id: int, limit: int = 400) -> int | None:
    for _ in range(limit):
        done = [e for e in ctl.incidents.timeline(incident_id)
                if e.kind is EventKind.ROLLED_BACK and e.status is EventStatus.DONE]  # fmt: skip
        if done:
            return int(done[0].result["to_step"])
        if ctl.incidents.get(incident_id).state is IncidentState.ESCALATED or ctl.phase.is_terminal:
            return None
        ranks = ctl.workers.ranks  # type: ignore[attr-defined]
        ranks.train(ctl, 1, checkpoint_every=EVERY)
        ctl.iterate()
    raise AssertionError(f"no rollback; status {ctl.status()}")


def test_checkpoint_marks_the_batch_justifies_are_settled_before_the_plan_chooses_a_target(
    tmp_path: Path,
) -> None:
    kept_up, kept_id = first_plan(tmp_path, "kept_up", behind=False)
    behind, behind_id = first_plan(tmp_path, "behind", behind=True)
    for ctl in (kept_up, behind):
        # 25 and 50 had their healthy window (5 steps) before the fault; 75 and later did not.
        assert ctl.checkpoints.manifest(25).health is HealthMark.HEALTHY
        assert ctl.checkpoints.manifest(50).health is HealthMark.HEALTHY
        assert ctl.checkpoints.manifest(75).health is not HealthMark.HEALTHY
    [plan_kept] = [e.payload for e in kept_up.incidents.timeline(kept_id) if "plan" in e.payload]
    [plan_behind] = [e.payload for e in behind.incidents.timeline(behind_id) if "plan" in e.payload]
    assert plan_behind["plan"] == plan_kept["plan"] and not plan_behind["escalate"], plan_behind
    assert rolled_back_to(kept_up, kept_id) == rolled_back_to(behind, behind_id) == 50

"""A fault before the run's first checkpoint is rolled back to the run's start (docs/policies.md):
the worker group restarts with no resume checkpoint, the analysed timeline and the detector start
over from nothing, the re-warm runs from step 0 to the onset, and the timeline says so. Before,
the plan escalated for "no healthy checkpoint before the onset" and the job stopped."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, calm, saver

REWARM = str(Path(__file__).parent / "policies" / "rewarm.yaml")


def test_a_fault_before_the_first_checkpoint_restarts_the_group_from_the_run_start(tmp_path: Path) -> None:
    job = make_job(tmp_path, "start_over", max_steps=160, policy=REWARM, resources={"num_workers": 1},
                   checkpoint={"every_steps": 100})  # fmt: skip
    ranks = FakeRanks(1, 160, grads_follow_loss=True)
    # A fault that lasts until training is rolled back (an LR bug a rollback cures): up from step
    # 70 in the first generation only.
    ranks.loss = lambda step, rank: calm(step, rank) * (1.0 + 0.5 * (step - 69)) if step >= 70 and ranks.generation == 0 else calm(step, rank)  # fmt: skip
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ctl.boot()
    assert workers.launches == [(0, None, 0)]

    def rolled_back() -> bool:
        return any(e.kind is EventKind.ROLLED_BACK and e.status is EventStatus.DONE
                   for i in ctl.incidents.list_incidents(job="start_over") for e in ctl.incidents.timeline(i.id))  # fmt: skip

    ranks.run(ctl, rolled_back)
    # A new generation, launched with no resume checkpoint: the job's own initial state.
    assert len(workers.launches) == 2 and workers.launches[1][:2] == (1, None), workers.launches
    # The detector starts over with the run: nothing of the abandoned timeline is left in it.
    analyzer = ctl.flow.analyzer
    assert analyzer.own_restore == -1 and analyzer.last_step is not None and analyzer.last_step < 5
    assert all(r.step < 5 for r in analyzer.recent)
    assert all(h.step < 5 for h in ctl.history)
    ranks.run(ctl, lambda: ctl.phase.is_terminal)

    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    [inc] = ctl.incidents.list_incidents(job="start_over")
    assert inc.state is IncidentState.RESOLVED and inc.onset_step == 70
    timeline = ctl.incidents.timeline(inc.id)
    [rollback] = [e for e in timeline if e.kind is EventKind.ROLLED_BACK]
    result = rollback.result or {}
    assert result["to_start"] is True and result["mode"] == "restart" and result["to_step"] == 0
    [fix] = [e for e in timeline if e.kind is EventKind.FIX_APPLIED]
    assert fix.payload["params"]["warmup_steps"] == 70  # re-warmed as from step 0 to the onset
    from supervisor.incidents.postmortem import build_postmortem

    texts = [t for _, t in build_postmortem(ctl.incidents, inc.id).timeline]
    [said] = [t for t in texts if t.startswith("Rolled back")]
    assert "to the run's start (no checkpoint before onset 70) by restarting the worker group" in said, said


@pytest.mark.slow
def test_a_checkpoint_saved_after_the_onset_is_never_the_resume_point(tmp_path: Path) -> None:
    """Detected after the run saved a checkpoint past the onset: that checkpoint holds the fault's
    steps; the start-over quarantines it as the abandoned timeline and `latest` does not name it."""
    job = make_job(tmp_path, "after_onset", max_steps=160, policy=REWARM, resources={"num_workers": 1},
                   checkpoint={"every_steps": 100})  # fmt: skip
    ranks = FakeRanks(1, 160, grads_follow_loss=True)
    ranks.loss = lambda step, rank: calm(step, rank) * (1.0 + 0.5 * (step - 69)) if step >= 70 and ranks.generation == 0 else calm(step, rank)  # fmt: skip
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    ranks.train(ctl, 70, checkpoint_every=70)  # saved at the onset: it holds the onset's update
    assert ctl.checkpoints.manifest(70) is not None
    ranks.run(ctl, lambda: len(workers.launches) == 2)
    assert workers.launches[1][:2] == (1, None), workers.launches
    assert ctl.checkpoints.manifest(70).health is HealthMark.QUARANTINED
    assert ctl.checkpoints.latest() is None

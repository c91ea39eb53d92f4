"""Issue 29 point 5: a rollback target that the ranks' restore check refuses (a forged checkpoint:
files and checksums rewritten to match, so it passed verification) is quarantined and never
loaded again; the rollback falls back to the next verified target, the re-warm is recomputed for
the target actually used, and `latest` never names the forged checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, saver, spikes_once

REWARM = str(Path(__file__).parent / "policies" / "rewarm.yaml")


@pytest.mark.slow
def test_a_target_refused_by_the_restore_check_is_quarantined_and_the_rollback_falls_back(
    tmp_path: Path,
) -> None:
    job = make_job(tmp_path, "forged", max_steps=260, policy=REWARM, resources={"num_workers": 1})
    ranks = FakeRanks(1, 260, spikes_once(130), grads_follow_loss=True, forged={100})
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()

    def rolled_back() -> bool:
        return any(e.kind is EventKind.ROLLED_BACK and e.status is not EventStatus.PENDING
                   for i in ctl.incidents.list_incidents(job="forged") for e in ctl.incidents.timeline(i.id))  # fmt: skip

    ranks.run(ctl, rolled_back, checkpoint_every=25)
    assert ctl.checkpoints.manifest(100).health is HealthMark.QUARANTINED
    assert ranks.step == 75 and ctl.checkpoints.latest() != 100
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)

    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    [inc] = ctl.incidents.list_incidents(job="forged")
    assert inc.state is IncidentState.RESOLVED and inc.onset_step == 130
    timeline = ctl.incidents.timeline(inc.id)
    [rollback] = [e for e in timeline if e.kind is EventKind.ROLLED_BACK]
    assert rollback.status is EventStatus.DONE
    result = rollback.result or {}
    assert result["to_step"] == 75 and result["passed_over"][0]["step"] == 100
    assert "restore check" in result["passed_over"][0]["reason"]
    # The re-warm runs from the target actually used to the onset.
    [fix] = [e for e in timeline if e.kind is EventKind.FIX_APPLIED]
    assert fix.payload["params"]["warmup_steps"] == 130 - 75
    # Never loaded again: the only rollback directives are the planned one and the fallback.
    rollbacks = [d for d in ctl.directives.after(0) if d["kind"] == "rollback"]
    assert [d["step"] for d in rollbacks] == [100, 75]
    assert ctl.checkpoints.latest() is not None
    # The report says which checkpoint was passed over, and why.
    from supervisor.incidents.postmortem import build_postmortem

    texts = [t for _, t in build_postmortem(ctl.incidents, inc.id).timeline]
    [said] = [t for t in texts if t.startswith("Rolled back")]
    assert (
        "to healthy checkpoint 75" in said and "checkpoint 100 quarantined: restore check failed" in said
    ), said


@pytest.mark.slow
def test_a_restart_whose_checkpoint_the_restore_check_refused_goes_on_from_the_one_before(
    tmp_path: Path,
) -> None:
    """A new generation that fails at its start because the ranks' restore check refused (and
    quarantined) the checkpoint it resumed from did not repeat a start-up error: it is restarted
    from the next checkpoint, not failed by restarts.max_without_progress."""
    from supervisor.runtime.restarts import GroupEvent
    from tests.runtime.test_crash_consistency import HOLD

    job = make_job(tmp_path, "forged_restart", max_steps=200, policy=HOLD, resources={"num_workers": 1})
    ranks = FakeRanks(1, 200)
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    ranks.run(ctl, lambda: ranks.step >= 90, checkpoint_every=25)
    workers.events.append(GroupEvent("lost", (0,), "node lost"))
    ctl.iterate()
    ctl.iterate()
    assert ctl.phase is JobPhase.RUNNING and workers.launches[-1][1] == 75
    # The new generation loads 75; the restore check refuses it, the rank quarantines it and fails.
    ctl.checkpoints.quarantine(75, "restore check failed on rank 0: restored model state differs")
    workers.events.append(GroupEvent("failed", (0,), "CheckpointError: restore check failed"))
    ctl.iterate()
    assert ctl.phase is JobPhase.RESTARTING, ctl.status()
    ctl.iterate()
    assert ctl.phase is JobPhase.RUNNING and workers.launches[-1][1] == 50
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)
    assert ctl.phase is JobPhase.FINISHED, ctl.status()


@pytest.mark.slow
def test_a_fallback_rollback_in_flight_is_redelivered_with_the_target_it_fell_back_to(tmp_path: Path) -> None:
    """The group restarts while the rollback that fell back from a refused target is in flight: the
    new generation gets the fallback (never the quarantined planned target again), the rollback ends
    on it, and the re-warm after it is computed for it."""
    from supervisor.runtime.restarts import GroupEvent

    job = make_job(tmp_path, "fallback_restart", max_steps=260, policy=REWARM, resources={"num_workers": 1})
    ranks = FakeRanks(1, 260, spikes_once(130), grads_follow_loss=True, forged={100})
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    ranks.run(ctl, lambda: any("~" in d["id"] for d in ctl.directives.entries), checkpoint_every=25)
    [fallback] = [d for d in ctl.directives.entries if "~" in d["id"]]
    assert fallback["step"] == 75 and not ctl.directives.acked_by(fallback["id"])  # not yet applied
    workers.events.append(GroupEvent("lost", (0,), "node lost"))
    ctl.iterate()
    ctl.iterate()
    generation, resume, after_seq = workers.launches[-1]
    assert generation == 1 and resume == 75
    resent = [d for d in ctl.directives.after(after_seq) if d["kind"] == "rollback"]
    assert [(d["id"], d["step"]) for d in resent] == [(f"{fallback['id']}@g1", 75)]
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)

    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    spike = next(i for i in ctl.incidents.list_incidents(job="fallback_restart") if i.onset_step == 130)
    timeline = ctl.incidents.timeline(spike.id)
    [rollback] = [e for e in timeline if e.kind is EventKind.ROLLED_BACK]
    assert rollback.status is EventStatus.DONE and (rollback.result or {})["to_step"] == 75
    [fix] = [e for e in timeline if e.kind is EventKind.FIX_APPLIED]
    assert fix.payload["params"]["warmup_steps"] == 130 - 75

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

"""The policy sees the job as the runtime knows it (``JobState``): the clip in force, whether the
job can replay, and every earlier rank-local occurrence -- so a live run flags a repeat offender
(issue 13 point 3) on the real controller with fake workers (tests/runtime/harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.incidents import EventKind, IncidentState
from supervisor.ranks.replay import has_replay_hooks
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, spikes_once


def test_replay_hooks_are_read_from_the_entrypoint_source_without_running_it(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "raise SystemExit('never run')\nfrom x.hooks import replay_hooks\ndef main(c, ctx): ...\n"
    )
    assert has_replay_hooks(str(script)) is True
    assert has_replay_hooks("examples.tinylm.train:main") is True  # imported from its replay module
    assert has_replay_hooks("tests.runtime.harness:calm") is False
    assert has_replay_hooks("python -m examples.torchrun.train") is None  # a command: cannot tell
    assert has_replay_hooks("no_such_package.train:main") is None


def job_states(ctl: Controller, incident_id: int) -> list[dict]:
    return [a.meta["job_state"] for a in ctl.incidents.artifacts(incident_id) if a.kind == "plan"]


@pytest.mark.slow
def test_one_bad_batch_on_a_rank_is_excluded_and_the_third_on_that_rank_escalates(tmp_path: Path) -> None:
    # The default policy; a job without replay_hooks that names its clip in config.
    job = make_job(tmp_path, "rank", max_steps=320, policy="default", entrypoint="tests.runtime.harness:calm",
                   config={"grad_clip": 1.0})  # fmt: skip
    ranks = FakeRanks(2, 320, spikes_once(130, 170, 230))  # a garbage batch on rank 0, three times
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    store = ctl.incidents

    # 1. Once: excluded without replay (no hooks), and training goes on.
    ranks.run(ctl, lambda: ranks.step >= 160)
    [inc] = store.list_incidents(job="rank")
    assert inc.state is IncidentState.RESOLVED and not ranks.frozen and ctl.phase is JobPhase.RUNNING
    [state] = job_states(ctl, inc.id)
    assert (state["can_replay"], state["grad_clip"], state["rank_incidents"]) == (False, 1.0, [])
    [plan] = [a.meta["plan"] for a in store.artifacts(inc.id) if a.kind == "plan"]
    assert [a["name"] for a in plan["actions"]] == ["alert", "freeze", "apply", "resume"]
    assert any("replay dropped: the job has no replay_hooks" in n for n in plan["notes"])
    applied = next(e for e in store.timeline(inc.id) if e.kind is EventKind.FIX_APPLIED)
    assert applied.payload["params"]["exclude"]["batch_range"] == [130, 131]

    # 2. Twice: the same fault on the same rank reopens the incident, still excluded.
    # 3. Three times within rank_offenders.window_steps: a hardware suspect, escalated.
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.ESCALATED and ranks.step < 240
    final = store.get(inc.id)
    assert final.state is IncidentState.ESCALATED
    assert [s["rank_incidents"] for s in job_states(ctl, inc.id)] == [[], [[130, 0]], [[130, 0], [170, 0]]]
    # Each reopened occurrence knows the incident's earlier ones (a rollback must not re-run them).
    assert [s["earlier_onsets"] for s in job_states(ctl, inc.id)] == [[], [130], [130, 170]]
    escalated = next(e for e in store.timeline(inc.id) if e.kind is EventKind.ESCALATED)
    reason = escalated.payload["memo"]["reason"]
    assert "rank 0 deviated first in 3 incidents within 2000 steps" in reason
    assert "rank_offenders.count=3: hardware suspect" in reason

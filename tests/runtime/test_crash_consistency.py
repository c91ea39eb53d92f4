"""Issue 14's table, row by row, on the real controller with fake workers (tests/runtime/harness.py).

Each test first drives the run to the moment the issue names, "kills" the supervisor there
(drops the controller object; a new one attaches to the same state file and stores), and
checks what a person reviewing the run must find: the fault handled once, the incident
closed, `latest` and the analysed timeline where training really is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.restarts import GroupEvent
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, calm, spike_at

HOLD = str(Path(__file__).parent / "policies" / "hold.yaml")


def setup(tmp_path: Path, loss: Any = calm, max_steps: int = 200, name: str = "row") -> tuple[Any, FakeRanks, FakeWorkers, Controller]:  # fmt: skip
    job = make_job(tmp_path, name, max_steps=max_steps, policy=HOLD)
    ranks = FakeRanks(2, max_steps, loss)
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ctl.boot()
    return job, ranks, workers, ctl


def attach(job: Any, workers: FakeWorkers) -> Controller:
    ctl = Controller(job, FAST, attach=True, workers=workers)
    ctl.boot()
    return ctl


def incidents(ctl: Controller) -> list[Any]:
    return [
        i
        for i in ctl.incidents.list_incidents(job=ctl.job.name)
        if i.phenotype != "transient" or i.onset_step
    ]


def plan_count(ctl: Controller, incident_id: int) -> int:
    return sum(1 for a in ctl.incidents.artifacts(incident_id) if a.kind == "plan")


@pytest.mark.slow
def test_killed_before_the_incident_the_successor_detects_it_as_if_it_never_died(tmp_path: Path) -> None:
    """Row 1 (kill at step 168): records the dead supervisor had taken in but not made durable
    are sent again by the workers, so detection happens at the same step."""
    _, ranks, _, clean = setup(tmp_path / "clean", spike_at(150), name="clean")
    ranks.run(clean, lambda: ranks.step >= 160)
    [expected] = clean.incidents.list_incidents(job="clean")

    job, ranks, workers, ctl = setup(tmp_path / "kill", spike_at(150))
    ranks.train(ctl, 140)
    ctl.persist(force=True)
    ctl.persist = lambda force=False: None  # type: ignore[method-assign]  # dies before its next write
    ranks.train(ctl, 12)  # steps 141-152: accepted by the doomed supervisor, never made durable
    assert ranks.unacked(0) >= 12, "the workers must still hold what was not durably accepted"
    again = attach(job, workers)
    ranks.run(again, lambda: ranks.step >= 160)
    [found] = again.incidents.list_incidents(job=job.name)
    assert (found.onset_step, found.diagnosis.detected_step) == (
        expected.onset_step,
        expected.diagnosis.detected_step,
    )
    assert again.assembler.missing == 0 and again.receipts.lost == 0


@pytest.mark.slow
def test_a_spike_in_the_last_steps_is_handled_while_the_workers_hold(tmp_path: Path) -> None:
    """Row 2 and "a spike at step 395 of 400": the ranks wait at their last step; the plan runs
    against live workers, and only then are they released."""
    _, ranks, _, ctl = setup(tmp_path, spike_at(196))
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.FINISHED and ranks.step == 200
    [inc] = ctl.incidents.list_incidents(job="row")
    assert inc.state is IncidentState.RESOLVED
    kinds = [e["kind"] for e in ctl.directives.entries]
    assert kinds[-1] == "finish" and {"freeze", "apply"} <= set(kinds)
    assert ranks.applied, "the fix reached the held workers"
    [downtime] = [
        e.payload["downtime_s"] for e in ctl.incidents.timeline(inc.id) if "downtime_s" in e.payload
    ]
    # the timeline rounds to 10 ms: allow half of that over the unrounded total
    assert 0 < downtime <= ctl.state.downtime_s + 0.005  # frozen and held while handled, never the whole run
    acted = {e.kind: e for e in ctl.incidents.timeline(inc.id) if e.action_id}
    assert acted[EventKind.FIX_APPLIED].status is EventStatus.DONE
    observation = acted[EventKind.OBSERVATION]
    assert observation.status is EventStatus.FAILED and observation.result["skipped"]  # never "done"
    assert "unverified" in ctl.incidents.timeline(inc.id)[-2].payload.get("reason", "") or any(
        "unverified" in str(e.payload) for e in ctl.incidents.timeline(inc.id)
    )


def test_workers_that_end_without_holding_leave_the_run_unfinished(tmp_path: Path) -> None:
    """Without a hold, an action that needed the workers is recorded as skipped, the incident
    says why, and the job does not end "finished" with exit code 0."""
    _, ranks, workers, ctl = setup(tmp_path, spike_at(196))
    ranks.run(ctl, lambda: ranks.step >= 199)
    ranks.step, ranks.ended = 200, True  # the last step ran and the ranks returned at once
    ranks.send(ctl, 0, [ranks.record(200, 0)])
    ranks.send(ctl, 1, [ranks.record(200, 1)])
    for _ in range(50):
        ctl.iterate()
        if ctl.phase.is_terminal:
            break
    assert ctl.phase is JobPhase.UNFINISHED and ctl.phase.exit_code == 1, ctl.status()
    [inc] = ctl.incidents.list_incidents(job="row")
    assert inc.state is IncidentState.ESCALATED
    acted = [e for e in ctl.incidents.timeline(inc.id) if e.action_id]
    skipped = [e for e in acted if (e.result or {}).get("skipped")]
    assert skipped and all(e.status is EventStatus.FAILED for e in skipped)
    assert not any(e.kind is EventKind.FIX_APPLIED and e.status is EventStatus.DONE for e in acted)
    assert "training ended" in ctl.state.reason


def test_the_position_after_a_rollback_is_on_disk_and_applied_once(tmp_path: Path) -> None:
    """Row 3: the persisted step after a rollback is the rollback's target, and a supervisor
    restarted after it does not rewind a second time."""
    job, ranks, workers, ctl = setup(tmp_path)
    ranks.train(ctl, 120)
    ctl.rewind(60, "rewind:i1-p1-a4-rollback", "rollback of incident 1")
    again = attach(job, workers)
    assert again.assembler.watermark == 60 and again.current_step == 60
    ranks.step = 60
    ranks.train(again, 30)
    again.rewind(60, "rewind:i1-p1-a4-rollback", "rollback of incident 1")  # replayed: no effect
    assert again.current_step == 90 and [h.step for h in again.history][-1] == 90


@pytest.mark.slow
def test_observation_survives_a_supervisor_restart_and_is_not_replanned(tmp_path: Path) -> None:
    """Rows 4 and 5: killed inside the observation window, then again after "resolved": one
    plan, one observation, no second fix."""
    job, ranks, workers, ctl = setup(tmp_path, spike_at(80), max_steps=300)
    ranks.run(ctl, lambda: ctl.state.active is not None and ctl.state.active.index >= 3 and ranks.step > 100)
    inc = ctl.state.active.incident_id
    before = [h.step for h in ctl.window_after(90)]
    again = attach(job, workers)
    ranks.resend(again)  # the links' next call brings back what the dead supervisor had not made durable
    again.iterate()
    assert [h.step for h in again.window_after(90)][: len(before)] == before  # the window's steps survived
    ranks.run(again, lambda: again.incidents.get(inc).state.is_terminal)
    assert again.incidents.get(inc).state is IncidentState.RESOLVED
    third = attach(job, workers)
    third.state.waiting.append(inc)  # as if a stale "ready" came back with the replayed records
    ranks.run(third, lambda: third.phase.is_terminal)
    assert plan_count(third, inc) == 1
    observations = [e for e in third.incidents.timeline(inc) if e.kind is EventKind.OBSERVATION]
    assert [e.status for e in observations] == [EventStatus.DONE]
    checks = observations[0].result["checks"]
    assert checks["throughput"]["detail"].startswith("not judged") and "value" in checks["loss"]
    assert third.phase is JobPhase.FINISHED


@pytest.mark.slow
def test_a_worker_killed_while_frozen_restarts_before_the_onset_and_the_plan_continues(
    tmp_path: Path,
) -> None:
    """Row 6: the new generation starts before the onset, receives the freeze and the pending fix
    again, and the plan finishes once; the job finishes."""
    state: dict[str, int] = {"gen": 0}

    def loss(step: int, rank: int) -> float:  # the fault struck the first generation only
        return spike_at(150)(step, rank) if state["gen"] == 0 else calm(step, rank)

    job, ranks, workers, ctl = setup(tmp_path, loss)
    ranks.run(ctl, lambda: any(e["kind"] == "apply" for e in ctl.directives.entries))
    assert ranks.frozen
    workers.events.append(GroupEvent("lost", (1,), "worker actor died"))
    ctl.iterate()  # the restart decision
    ctl.iterate()  # the relaunch (no backoff in this policy)
    state["gen"] = 1
    gen, resume, after_seq = workers.launches[-1]
    assert gen == 1 and (resume is None or resume <= 140)
    copies = [e for e in ctl.directives.entries if e["seq"] > after_seq]
    assert [e["kind"] for e in copies] == ["apply", "freeze"] and all(e["id"].endswith("@g1") for e in copies)
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    spike = next(i for i in ctl.incidents.list_incidents(job=job.name) if i.onset_step == 150)
    assert spike.state is IncidentState.RESOLVED
    applied = [e for e in ctl.incidents.timeline(spike.id) if e.kind is EventKind.FIX_APPLIED]
    assert len(applied) == 1 and applied[0].status is EventStatus.DONE
    # The fix lives in the workers' memory: the new generation applied it too.
    assert "i1-p1-a2-apply@g1" in [d["id"] for d in ranks.applied]


@pytest.mark.parametrize("fail_relaunch", [False, True])
def test_restart_restart_escalate_and_a_failed_relaunch(tmp_path: Path, fail_relaunch: bool) -> None:
    """Queued decisions, one iteration at a time: restart, restart, then the policy's
    restarts.max_restarts=2 escalates; or the first relaunch fails and the job fails."""
    _, ranks, workers, ctl = setup(tmp_path)
    ranks.train(ctl, 30)
    if fail_relaunch:
        workers.fail_launch.append("cannot place 2 workers")
    for n in (1, 2, 3):
        workers.events.append(GroupEvent("lost", (0,), "node lost"))
        ctl.iterate()
        if n == 3 or fail_relaunch:
            break
        assert ctl.phase is JobPhase.RESTARTING and ctl.state.generation == n
        ctl.iterate()
        assert ctl.phase is JobPhase.RUNNING and len(workers.launches) == n + 1
        ranks.train(ctl, 5)
    if fail_relaunch:
        ctl.iterate()
        assert ctl.phase is JobPhase.FAILED and "cannot restart the worker group" in ctl.state.reason
    else:
        assert ctl.phase is JobPhase.FAILED and "restarts.max_restarts=2" in ctl.state.reason
    machinery = [i for i in ctl.incidents.list_incidents(job="row") if i.state is IncidentState.ESCALATED]
    assert len(machinery) == 1


def test_incidents_of_an_abandoned_timeline_get_no_plan_of_their_own(tmp_path: Path) -> None:
    """Kill at "open": training ran on with the fault and the detector opened more incidents;
    the rollback to before their onset dismisses them (with the reason), never a second rollback."""
    from supervisor.runtime.controller import _machinery_diagnosis

    _, ranks, _, ctl = setup(tmp_path)
    ranks.train(ctl, 120)
    later = ctl.incidents.open_incident("row", _machinery_diagnosis(100, None, "same fault, later"))
    earlier = ctl.incidents.open_incident("row", _machinery_diagnosis(40, None, "before the target"))
    ctl.state.waiting += [later.id, earlier.id]
    ctl.rewind(60, "rewind:test", "rollback of incident 1")
    assert ctl.state.waiting == [earlier.id]
    gone = ctl.incidents.get(later.id)
    assert gone.state is IncidentState.DISMISSED
    assert "abandoned timeline" in ctl.incidents.timeline(later.id)[-1].payload["reason"]


def test_a_group_that_fails_again_before_its_first_step_fails_the_job(tmp_path: Path) -> None:
    """A script that dies at start-up (a bad argument, a `faults:` entry it cannot inject): the
    first failure restarts the group; when the restarted group dies again before training a step,
    restarting cannot help, so the job fails at once naming restarts.max_without_progress, not
    after restarts.max_restarts attempts. Its incidents are dated at step 0, never -1."""
    _, _, workers, ctl = setup(tmp_path)
    crash = GroupEvent("failed", (1,), "training process exited with code 1: ConfigError: faults: bad")
    workers.events.append(crash)
    ctl.iterate()  # restart decision
    ctl.iterate()  # relaunch
    assert ctl.phase is JobPhase.RUNNING and ctl.state.generation == 1
    workers.events.append(crash)
    ctl.iterate()
    assert ctl.phase is JobPhase.FAILED, ctl.status()
    assert "restarts.max_without_progress=1" in ctl.state.reason and "ConfigError" in ctl.state.reason
    assert len(workers.launches) == 2  # the first launch and one restart, not max_restarts=2 of them
    assert all(i.onset_step >= 0 for i in ctl.incidents.list_incidents(job="row"))

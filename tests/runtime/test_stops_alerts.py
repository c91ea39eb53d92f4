"""Issue 29 point 6: stops and alerts record what happened, and only that.

On the real controller with fake workers (tests/runtime/harness.py): a stop while frozen or
inside the observation window leaves the incident "stopped" with what was and was not done
(never "resolved", never "observation passed" on a window cut short); a supervisor killed
during the plan's alert sends it once; a foreground launch whose supervisor was removed after
`supervisor stop` ended the job reports the job's outcome (exit 1), not a broken supervisor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from supervisor.client import api
from supervisor.errors import RuntimeBackendError
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, spike_at

HOLD = str(Path(__file__).parent / "policies" / "hold.yaml")


def setup(tmp_path: Path) -> tuple[Any, FakeRanks, FakeWorkers, Controller]:
    job = make_job(tmp_path, "st", max_steps=300, policy=HOLD)
    ranks = FakeRanks(2, 300, spike_at(80))
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ctl.boot()
    return job, ranks, workers, ctl


def events(ctl: Controller, kind: EventKind) -> list[Any]:
    return [
        e
        for i in ctl.incidents.list_incidents(job="st")
        for e in ctl.incidents.timeline(i.id)
        if e.kind is kind
    ]


def the_incident(ctl: Controller) -> Any:
    return next(i for i in ctl.incidents.list_incidents(job="st") if i.onset_step == 80)


def stopped_note(ctl: Controller, incident_id: int) -> dict[str, Any]:
    [note] = [e.payload["stopped"] for e in ctl.incidents.timeline(incident_id) if "stopped" in e.payload]
    return note


def test_a_stop_while_frozen_records_the_incident_stopped_with_what_was_done(tmp_path: Path) -> None:
    _, ranks, _, ctl = setup(tmp_path)
    ranks.run(ctl, lambda: ranks.frozen and any(e["kind"] == "apply" for e in ctl.directives.entries))
    ctl.request_stop("`supervisor stop`")
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.STOPPED and ctl.phase.exit_code == 1
    inc = ctl.incidents.get(the_incident(ctl).id)
    assert inc.state is IncidentState.STOPPED  # never "resolved" with the fix unverified
    assert inc.closed_at is not None and inc.state.is_terminal and inc.state.is_final
    note = stopped_note(ctl, inc.id)
    assert note["done"] == ["alert", "freeze", "apply"] and note["not_done"] == ["observe", "resume"]
    assert not [e for e in events(ctl, EventKind.RESUMED) if e.status is EventStatus.DONE]


def test_a_stop_inside_the_observation_window_is_not_a_passed_observation(tmp_path: Path) -> None:
    _, ranks, _, ctl = setup(tmp_path)

    def in_window(n: int) -> bool:
        obs = events(ctl, EventKind.OBSERVATION)
        return bool(obs) and len(ctl.window_after(obs[0].payload["memo"]["from_step"])) >= n

    ranks.run(ctl, lambda: in_window(45))  # 45 of the 50-step window
    ctl.request_stop("`supervisor stop`")
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.STOPPED
    [obs] = events(ctl, EventKind.OBSERVATION)
    assert (
        obs.status is EventStatus.FAILED
        and obs.result["skipped"]
        and "stopped on request" in obs.result["reason"]
    )
    assert not events(ctl, EventKind.RESUMED)
    inc = the_incident(ctl)
    assert inc.state is IncidentState.STOPPED and stopped_note(ctl, inc.id)["not_done"] == [
        "observe",
        "resume",
    ]


def test_a_supervisor_killed_during_the_alert_sends_it_once(tmp_path: Path) -> None:
    """The plan is on disk before its first action (the alert) begins: the successor finds that
    alert, and makes no second plan with a second alert (the first left pending forever)."""
    job, ranks, workers, ctl = setup(tmp_path)
    ranks.run(ctl, lambda: bool(events(ctl, EventKind.ALERT_SENT)))
    again = Controller(job, FAST, attach=True, workers=workers)  # the kill: nothing else written
    again.boot()
    ranks.resend(again)
    inc = the_incident(again).id
    ranks.run(again, lambda: again.incidents.get(inc).state.is_terminal)
    alerts = [e for e in again.incidents.timeline(inc) if e.kind is EventKind.ALERT_SENT]
    assert [e.status for e in alerts] == [EventStatus.DONE]
    assert sum(1 for a in again.incidents.artifacts(inc) if a.kind == "plan") == 1
    assert not again.incidents.pending_events(inc)


def test_a_foreground_launch_reads_the_outcome_of_a_job_stopped_from_another_shell(tmp_path: Path) -> None:
    _, ranks, _, ctl = setup(tmp_path)
    ranks.train(ctl, 10)
    job = ctl.job

    def removed(poll: Any) -> dict[str, Any]:  # `supervisor stop` killed the actor once the job ended
        raise RuntimeBackendError("the supervisor does not answer: RayActorError")

    with pytest.raises(RuntimeBackendError):  # still running when it died: a failure (exit 3)
        api.follow(None, job, removed)
    ctl.request_stop("`supervisor stop`")
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    ctl.persist(force=True)  # as Controller.run does once the job ended
    final = api.follow(None, job, removed)
    assert (final["phase"], final["exit_code"], final["terminal"]) == ("stopped", 1, True)


def test_a_job_that_fails_inside_the_observation_window_leaves_no_action_pending(tmp_path: Path) -> None:
    """Two real Ray nodes, the second's raylet killed while an LR incident observed its fix: the group
    could not be placed again and the job failed at once, as it should; the incident was escalated,
    but its observation stayed `pending` in the timeline for good (only open incidents' pending
    events were closed, after the end had closed the incident)."""
    from supervisor.runtime.restarts import GroupEvent

    _, ranks, workers, ctl = setup(tmp_path)

    def in_window(n: int) -> bool:
        obs = events(ctl, EventKind.OBSERVATION)
        return bool(obs) and len(ctl.window_after(obs[0].payload["memo"]["from_step"])) >= n

    ranks.run(ctl, lambda: in_window(10))
    workers.events.append(GroupEvent("lost", (1,), "node 127.0.0.2 lost"))
    workers.fail_launch.append("cannot place 2 workers x {'CPU': 1.0}: the 1 live node(s) hold 1 of them")
    for _ in range(50):
        if ctl.phase.is_terminal:
            break
        ctl.iterate()
    assert ctl.phase is JobPhase.FAILED and "cannot restart the worker group" in ctl.state.reason
    [obs] = events(ctl, EventKind.OBSERVATION)
    assert obs.status is EventStatus.FAILED and obs.result["skipped"], obs
    assert "job ended (failed" in obs.result["reason"], obs.result
    assert not ctl.incidents.pending_events(the_incident(ctl).id)
    assert the_incident(ctl).state is IncidentState.ESCALATED
    # With no checkpoint to restart from, the timeline stood before step 0 when the relaunch failed:
    # no event says "step -1" (the moves to escalated did).
    steps = [e.step for i in ctl.incidents.list_incidents(job="st") for e in ctl.incidents.timeline(i.id)]
    assert all(s is None or s >= 0 for s in steps), steps

"""The controller stepped one loop iteration at a time with queued inputs (records, acknowledgements,
worker-group events), asserting after each the job's phase, what is frozen, the directives issued
and the effects the controller carried out (``Controller.effects_applied``) -- the executors return
effects, the controller alone applies them (docs/architecture.md). As Ray Train v2's
``tests/test_controller.py`` does; the workers are ``tests/runtime/harness.py``'s ``FakeWorkers``
(no Ray), one rank, synthetic records."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from supervisor.runtime.controller import Controller
from supervisor.runtime.effects import (
    BeginAction,
    EndJob,
    EndPlan,
    FinishAction,
    MoveIncident,
    NextAction,
    NoteOverrides,
    Persist,
    RecordEvent,
    ReleaseLatest,
    SetFrozen,
    SetPhase,
)
from supervisor.runtime.restarts import GroupEvent
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeWorkers
from tests.runtime.test_controller import record

STEPS = str(Path(__file__).parent / "policies" / "steps.yaml")


def planned(rule: str) -> list[Any]:
    """The flow's effects when incident 1's first plan is made: its note, the phase, then the plan
    on disk before its first action begins."""
    return [("note", "plan"), SetPhase(JobPhase.INCIDENT, f"incident 1: plan 1 ({rule})"), Persist()]


def begins(action: str, state: str | None = None) -> list[Any]:
    """The runner's effects when an action begins: the incident's move, then its pending event."""
    return ([("move", state)] if state else []) + [("begin", action)]


def done(action: str) -> list[Any]:
    """The runner's effects when an action is done: its event marked done, then the plan moves past it."""
    return [("done", action), ("next", int(action.split("-")[2][1:]))]


def closed(state: str, *then: Any) -> list[Any]:
    """The flow's effects when incident 1's plan ends: its move, what comes with it, the downtime
    note, the plan ended, and the job runs on (were it still in the incident)."""
    phase = SetPhase(JobPhase.RUNNING, "no incident is being acted on", only_from=JobPhase.INCIDENT)
    return [("move", state), *then, ("note", "downtime_s"), EndPlan(), phase]


class Loop:
    """One controller, its fake workers and the inputs a test queues before each iteration."""

    def __init__(self, tmp_path: Path) -> None:
        job = make_job(tmp_path, "steps", max_steps=1000, policy=STEPS, resources={"num_workers": 1})
        self.workers = FakeWorkers()
        self.ctl = Controller(job, FAST, workers=self.workers)
        self.ctl.boot()
        self.rng = random.Random(0)
        self.issued: list[str] = []

    def records(self, first: int, last: int, **kw: Any) -> None:
        self.ctl.ingest_batch(0, [record(s, self.rng, **kw) for s in range(first, last + 1)])

    def ack(self, directive_id: str, step: int) -> None:
        kind = next(d["kind"] for d in self.ctl.directives.entries if d["id"] == directive_id)
        event = f"directive_applied:{directive_id}:{kind}"
        self.ctl.ingest_batch(0, [{"step": step, "rank": 0, "control": True, "events": [event]}])

    def step(self) -> tuple[JobPhase, bool, list[str], list[Any]]:
        """One iteration: the phase, frozen, the directives it issued and the effects it applied."""
        self.ctl.iterate()
        ids = [d["id"] for d in self.ctl.directives.entries]
        new, self.issued = ids[len(self.issued) :], ids
        return self.ctl.phase, self.ctl.state.frozen, new, [self.shown(e) for e in self.ctl.effects_applied]

    def shown(self, effect: Any) -> Any:
        """The incident store's effects in short: an action's event begun, or marked done or failed,
        by its action id; the plan moving past an action by its index; an incident's move by its
        target; a note by its payload's first key."""
        match effect:
            case FinishAction(event_id, _, failed):
                return ("failed" if failed else "done", self.ctl.incidents.event(event_id).action_id)
            case NextAction(index=index):
                return ("next", index)
            case BeginAction(action_id=aid):
                return ("begin", aid)
            case MoveIncident(to=to):
                return ("move", to.value)
            case RecordEvent(payload=payload):
                return ("note", next(iter(payload)))
        return effect


def test_a_nonfinite_step_is_frozen_fixed_observed_and_resumed_one_iteration_at_a_time(
    tmp_path: Path,
) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 80)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    loop.records(81, 81, loss=math.nan)
    # The incident is ready at once: its plan starts and its first action issues the freeze.
    first = planned("nonfinite") + begins("i1-p1-a0-freeze", "frozen")
    assert loop.step() == (JobPhase.INCIDENT, False, ["i1-p1-a0-freeze"], first)
    assert loop.step() == (JobPhase.INCIDENT, False, [], [])  # waiting for the rank
    loop.ack("i1-p1-a0-freeze", 81)
    assert loop.step() == (JobPhase.INCIDENT, True, [], [SetFrozen(True), *done("i1-p1-a0-freeze")])
    # block_latest begins (a store call, no directive)
    assert loop.step()[2:] == ([], begins("i1-p1-a1-block_latest", "frozen"))
    assert loop.ctl.checkpoints.block_state() is not None
    assert loop.step()[2:] == ([], done("i1-p1-a1-block_latest"))  # ... and is done
    assert loop.step() == (JobPhase.INCIDENT, True, ["i1-p1-a2-apply"], begins("i1-p1-a2-apply", "acting"))
    loop.ack("i1-p1-a2-apply", 81)
    fix = NoteOverrides(81, {"grad_clip": 0.5}, "fix of incident 1")
    assert loop.step() == (JobPhase.INCIDENT, True, [], [fix, *done("i1-p1-a2-apply")])
    # The observation releases the freeze as it starts, then waits for its 50 steps.
    observe = [*begins("i1-p1-a3-observe", "observing"), SetFrozen(False)]
    assert loop.step() == (JobPhase.INCIDENT, False, ["i1-p1-a3-observe-release"], observe)
    assert loop.step() == (JobPhase.INCIDENT, False, [], [])
    loop.records(82, 131)
    # The window passed: observe done.
    assert loop.step() == (JobPhase.INCIDENT, False, [], done("i1-p1-a3-observe"))
    assert loop.step() == (JobPhase.INCIDENT, False, ["i1-p1-a4-resume"], begins("i1-p1-a4-resume"))
    loop.ack("i1-p1-a4-resume", 131)
    resumed = [SetFrozen(False), ReleaseLatest(1), *done("i1-p1-a4-resume")]
    resumed += closed("resolved", ReleaseLatest(1))
    assert loop.step() == (JobPhase.RUNNING, False, [], resumed)
    assert loop.ctl.checkpoints.block_state() is None
    loop.workers.events.append(GroupEvent("finished"))
    assert loop.step() == (JobPhase.FINISHED, False, [], [])


def test_an_escalation_ends_the_job_once_its_stop_took_the_workers_down(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 80)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    # A spike of the loss, the grad norm and the update (an optimizer fault, not a metric artifact)
    # and no non-finite value: the fallback escalates.
    spike = record(81, loop.rng, loss=3.0 * 8) | {"grad_norm": 8.0, "update_norm": 0.8}
    loop.ctl.ingest_batch(0, [spike])
    loop.records(82, 90)  # the steps that confirm it
    phase, _, issued, effects = loop.step()
    assert phase is JobPhase.INCIDENT
    assert effects == planned("fallback") + begins("i1-p1-a0-escalate")
    snapshot, stop = issued
    assert snapshot.endswith("-escalate-snapshot") and stop.endswith("-escalate-stop")
    loop.ack(snapshot, 81)
    assert loop.step() == (JobPhase.INCIDENT, False, [], [])  # the stop is not acknowledged yet
    loop.ack(stop, 81)
    ended = [EndJob("escalated", "not a non-finite step"), *done("i1-p1-a0-escalate")]
    ended += closed("escalated")
    assert loop.step()[3] == ended
    assert not loop.ctl.phase.is_terminal  # it ends once the workers are down
    loop.workers.events.append(GroupEvent("finished"))
    assert loop.step()[0] is JobPhase.ESCALATED


def test_a_lost_worker_restarts_the_group_in_two_iterations(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 40)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    loop.workers.events.append(GroupEvent("lost", (0,), "node lost"))
    assert loop.step()[0] is JobPhase.RESTARTING and loop.ctl.state.generation == 1
    assert loop.step()[0] is JobPhase.RUNNING and loop.workers.launches[-1][0] == 1

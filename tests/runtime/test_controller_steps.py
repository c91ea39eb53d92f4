"""The controller stepped one loop iteration at a time with queued inputs (records, acknowledgements,
worker-group events, a stop asked for), asserting after each the job's phase, what is frozen, the
directives issued, the effects the controller carried out (``Controller.effects_applied``) -- the
executors return effects, the controller alone applies them (docs/architecture.md) -- and the
workers' lifecycle (``Controller.lifecycle``, ``runtime/lifecycle.py``). As Ray Train v2's
``tests/test_controller.py`` does; the workers are ``tests/runtime/harness.py``'s ``FakeWorkers``
(no Ray), one rank, synthetic records."""

from __future__ import annotations

import gc
import math
import random
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import ANY

from supervisor.config.runtime import RuntimeSettings
from supervisor.incidents import IncidentState
from supervisor.runtime.actions import REGISTRY
from supervisor.runtime.controller import Controller
from supervisor.runtime.effects import (
    BeginAction,
    BlockLatest,
    EndJob,
    EndPlan,
    FinishAction,
    Issue,
    MoveIncident,
    NextAction,
    NoteOverrides,
    OpenIncident,
    Persist,
    RecordEvent,
    ReleaseLatest,
    SetFrozen,
    SetPhase,
    StartPlan,
)
from supervisor.runtime.lifecycle import Ended, Ending, Relaunching, Running, Stopping
from supervisor.runtime.restarts import GroupEvent, Restarting
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeWorkers, send
from tests.runtime.test_controller import record

STEPS = str(Path(__file__).parent / "policies" / "steps.yaml")


def planned(rule: str, onset: int) -> list[Any]:
    """The flow's effects when incident 1 opens at ``onset`` and its first plan is made in the same
    iteration: the incident opened, the plan's note, the plan in force, the phase, then the plan on
    disk before its first action begins."""
    phase = SetPhase(JobPhase.INCIDENT, f"incident 1: plan 1 ({rule})")
    return [("open", onset), ("note", "plan"), ("plan", 1, 1), phase, Persist()]


def begins(action: str, state: str | None = None, *started: Any) -> list[Any]:
    """The runner's effects when an action begins: the incident's move, its pending event, then
    what its start does (``started``: the directives it issues, in short, and its other effects)."""
    return ([("move", state)] if state else []) + [("begin", action), *started]


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

    def __init__(self, tmp_path: Path, settings: RuntimeSettings = FAST) -> None:
        job = make_job(tmp_path, "steps", max_steps=1000, policy=STEPS, resources={"num_workers": 1})
        self.workers = FakeWorkers()
        self.ctl = Controller(job, settings, workers=self.workers)
        self.ctl.boot()
        self.rng = random.Random(0)
        self.issued: list[str] = []

    def records(self, first: int, last: int, **kw: Any) -> None:
        send(self.ctl, 0, [record(s, self.rng, **kw) for s in range(first, last + 1)])

    def ack(self, directive_id: str, step: int) -> None:
        kind = next(d["kind"] for d in self.ctl.directives.entries if d["id"] == directive_id)
        event = f"directive_applied:{directive_id}:{kind}"
        send(self.ctl, 0, [{"step": step, "rank": 0, "control": True, "events": [event]}])

    def step(self) -> tuple[JobPhase, bool, list[str], list[Any]]:
        """One iteration: the phase, frozen, the directives it issued and the effects it applied."""
        self.ctl.iterate()
        ids = [d["id"] for d in self.ctl.directives.entries]
        new, self.issued = ids[len(self.issued) :], ids
        return self.ctl.phase, self.ctl.state.frozen, new, [self.shown(e) for e in self.ctl.effects_applied]

    def shown(self, effect: Any) -> Any:
        """The incident store's effects in short: an action's event begun, or marked done or failed,
        by its action id; the plan moving past an action by its index; an incident's move by its
        target; a note by its payload's first key; a directive by its id; a plan made by its
        incident and number."""
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
            case Issue(directive):
                return ("issue", directive.id)
            case StartPlan(active):
                return ("plan", active.incident_id, active.plan_no)
            case OpenIncident(diagnosis):
                return ("open", diagnosis.onset_step)
        return effect


def test_a_nonfinite_step_is_frozen_fixed_observed_and_resumed_one_iteration_at_a_time(
    tmp_path: Path,
) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 80)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    loop.records(81, 81, loss=math.nan)
    # The incident is ready at once: its plan starts and its first action issues the freeze.
    first = planned("nonfinite", 81) + begins("i1-p1-a0-freeze", "frozen", ("issue", "i1-p1-a0-freeze"))
    assert loop.step() == (JobPhase.INCIDENT, False, ["i1-p1-a0-freeze"], first)
    assert loop.step() == (JobPhase.INCIDENT, False, [], [])  # waiting for the rank
    loop.ack("i1-p1-a0-freeze", 81)
    assert loop.step() == (JobPhase.INCIDENT, True, [], [SetFrozen(True), *done("i1-p1-a0-freeze")])
    # block_latest begins (a store call, no directive)
    block = BlockLatest(1, "incident 1 open")
    assert loop.step()[2:] == ([], begins("i1-p1-a1-block_latest", "frozen", block))
    assert loop.ctl.checkpoints.block_state() is not None
    assert loop.step()[2:] == ([], done("i1-p1-a1-block_latest"))  # ... and is done
    apply = begins("i1-p1-a2-apply", "acting", ("issue", "i1-p1-a2-apply"))
    assert loop.step() == (JobPhase.INCIDENT, True, ["i1-p1-a2-apply"], apply)
    loop.ack("i1-p1-a2-apply", 81)
    fix = NoteOverrides(81, {"grad_clip": 0.5}, "fix of incident 1")
    assert loop.step() == (JobPhase.INCIDENT, True, [], [fix, *done("i1-p1-a2-apply")])
    # The observation releases the freeze as it starts, then waits for its 50 steps.
    observe = begins("i1-p1-a3-observe", "observing", ("issue", "i1-p1-a3-observe-release"), SetFrozen(False))
    assert loop.step() == (JobPhase.INCIDENT, False, ["i1-p1-a3-observe-release"], observe)
    assert loop.step() == (JobPhase.INCIDENT, False, [], [])
    loop.records(82, 131)
    # The window passed: observe done.
    assert loop.step() == (JobPhase.INCIDENT, False, [], done("i1-p1-a3-observe"))
    resume = begins("i1-p1-a4-resume", None, ("issue", "i1-p1-a4-resume"))
    assert loop.step() == (JobPhase.INCIDENT, False, ["i1-p1-a4-resume"], resume)
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
    send(loop.ctl, 0, [spike])
    loop.records(82, 90)  # the steps that confirm it
    phase, _, issued, effects = loop.step()
    assert phase is JobPhase.INCIDENT
    snapshot, stop = issued
    assert snapshot.endswith("-escalate-snapshot") and stop.endswith("-escalate-stop")
    assert effects == planned("fallback", 81) + begins(
        "i1-p1-a0-escalate", None, ("issue", snapshot), ("issue", stop)
    )
    loop.ack(snapshot, 81)
    assert loop.step() == (JobPhase.INCIDENT, False, [], [])  # the stop is not acknowledged yet
    loop.ack(stop, 81)
    ended = [EndJob("escalated", "not a non-finite step"), *done("i1-p1-a0-escalate")]
    ended += closed("escalated")
    assert loop.step()[3] == ended
    assert not loop.ctl.phase.is_terminal  # it ends once the workers are down
    assert loop.ctl.lifecycle == Ending(phase=JobPhase.ESCALATED, reason="not a non-finite step")
    loop.workers.events.append(GroupEvent("finished"))
    assert loop.step()[0] is JobPhase.ESCALATED
    assert loop.ctl.lifecycle == Ended(Ending(phase=JobPhase.ESCALATED, reason="not a non-finite step"))


def test_a_lost_worker_restarts_the_group_in_two_iterations(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 40)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    assert loop.ctl.lifecycle == Running()
    loop.workers.events.append(GroupEvent("lost", (0,), "node lost"))
    # The group is down and its successor due at once (backoff_s: 0), from scratch (no checkpoint);
    # the launch finishes the fault's worker_restarted event (2) of its machinery incident (1).
    assert loop.step() == (JobPhase.RESTARTING, False, [], [])
    restart = Restarting(due=ANY, resume_step=None, after_seq=0, machinery=(2, 1))
    assert loop.ctl.lifecycle == Relaunching(restart, then=Running())
    assert loop.ctl.state.generation == 1 and not loop.workers.running
    assert loop.workers.launches == [(0, None, 0)]  # the first generation's only
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    assert loop.ctl.lifecycle == Running() and loop.workers.launches[-1] == (1, None, 0)
    assert loop.ctl.incidents.get(1).state is IncidentState.RESOLVED


def test_a_stop_request_goes_out_once_and_the_job_ends_stopped_when_the_workers_return(
    tmp_path: Path,
) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 40)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    loop.ctl.request_stop("operator")
    phase, frozen, (stop,), fx = loop.step()
    assert (phase, frozen, fx) == (JobPhase.RUNNING, False, []) and stop.startswith("stop-")
    stopping = Stopping(phase=JobPhase.STOPPED, reason="stopped on request: operator", sent_at=ANY)
    assert loop.ctl.lifecycle == stopping and loop.ctl.directives.entries[-1]["kind"] == "stop"
    sent = loop.ctl.lifecycle
    assert loop.step() == (JobPhase.RUNNING, False, [], [])  # once: no second stop, the same clock
    assert loop.ctl.lifecycle is sent and loop.workers.running
    loop.workers.events.append(GroupEvent("finished"))
    assert loop.step() == (JobPhase.STOPPED, False, [], [])
    assert loop.ctl.lifecycle == Ended(sent)
    assert loop.ctl.state.reason == "stopped on request: operator" and loop.ctl.status()["exit_code"] == 1


def test_workers_that_do_not_stop_in_time_are_killed_and_the_job_ends_stopped(tmp_path: Path) -> None:
    loop = Loop(tmp_path, FAST.model_copy(update={"directive_timeout_s": 0.0}))
    loop.records(1, 40)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    loop.ctl.request_stop("operator")
    assert loop.step()[0] is JobPhase.RUNNING and isinstance(sent := loop.ctl.lifecycle, Stopping)
    assert loop.step() == (JobPhase.STOPPED, False, [], [])  # no group event: the stop went unanswered
    assert loop.ctl.lifecycle == Ended(sent) and not loop.workers.running
    assert loop.ctl.state.reason == "stop requested (operator); workers killed after directive_timeout_s=0s"


def test_a_stop_asked_for_during_a_restart_goes_to_the_new_generation(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 40)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    loop.workers.events.append(GroupEvent("lost", (0,), "node lost"))
    assert loop.step()[0] is JobPhase.RESTARTING and isinstance(loop.ctl.lifecycle, Relaunching)
    loop.ctl.request_stop("operator")
    # The stop goes out while no workers exist (after the log position the new generation reads
    # from) and survives the relaunch, its clock running since it went out.
    phase, _, (stop,), _ = loop.step()
    assert phase is JobPhase.RUNNING and loop.workers.launches[-1] == (1, None, 0)
    assert loop.ctl.lifecycle == Stopping(
        phase=JobPhase.STOPPED, reason="stopped on request: operator", sent_at=ANY
    )
    issued = loop.ctl.directives.entries[-1]
    assert (issued["id"], issued["kind"], issued["seq"]) == (stop, "stop", 1)  # read after seq 0
    loop.workers.events.append(GroupEvent("finished"))
    assert loop.step()[0] is JobPhase.STOPPED and isinstance(loop.ctl.lifecycle, Ended)


def test_ranks_held_at_the_end_are_released_once_and_the_job_finishes(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.records(1, 40)
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    send(loop.ctl, 0, [{"step": 40, "rank": 0, "control": True, "events": ["end_reached:40"]}])
    # Nothing is left to handle: the held rank is released at once, by one Finish.
    assert loop.step() == (JobPhase.RUNNING, False, ["finish-g0-s40"], [])
    assert loop.ctl.lifecycle == Running(released="finish-g0-s40")
    assert loop.step() == (JobPhase.RUNNING, False, [], [])
    assert loop.ctl.lifecycle == Running(released="finish-g0-s40")
    loop.workers.events.append(GroupEvent("finished"))
    assert loop.step() == (JobPhase.FINISHED, False, [], [])
    assert loop.ctl.lifecycle == Ended() and loop.ctl.state.reason == "all 1 ranks finished"
    assert loop.ctl.status()["exit_code"] == 0


def reaches(roots: list[Any], target: object, limit: int = 500_000) -> bool:
    """Whether ``target`` is reachable from ``roots`` through object references, classes, modules
    and module globals left out (a function's globals are its module's, not state it keeps)."""
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        obj = todo.pop()
        if obj is target:
            return True
        if id(obj) in seen or isinstance(obj, type | types.ModuleType):
            continue
        if isinstance(obj, dict) and "__builtins__" in obj:
            continue
        seen.add(id(obj))
        assert len(seen) < limit, "the walk did not end: too many objects"
        todo += gc.get_referents(obj)
    return False


def test_no_stage_holds_a_reference_to_the_controller(tmp_path: Path) -> None:
    """The incident flow, the plan runner and the executors get what they read with each call and
    keep none of it: mid-incident (a plan made, its freeze acknowledged, its next action begun), the
    controller is reachable from none of them."""
    loop = Loop(tmp_path)
    loop.records(1, 80)
    loop.step()
    loop.records(81, 81, loss=math.nan)
    loop.step()
    loop.ack("i1-p1-a0-freeze", 81)
    loop.step()
    loop.step()
    assert loop.ctl.state.active is not None and loop.ctl.state.active.index == 1
    assert reaches([SimpleNamespace(kept=[loop.ctl.issue])], loop.ctl)  # a bound method is found
    stages = [loop.ctl.flow, loop.ctl.flow.runner, *(e.executor for e in REGISTRY.values())]
    assert not reaches(stages, loop.ctl)

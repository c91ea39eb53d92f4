"""Issue 29 point 3: a rank that hangs while frozen is hung, whatever the phase.

On the real controller with fake workers (tests/runtime/harness.py). The ranks freeze; rank 1
is then stopped (SIGSTOP after the freeze): it neither acknowledges the snapshot nor repeats
that it is there. Within ``telemetry.hang_timeout_s`` the group is replaced, the snapshot that
waited on it is recorded as not done, and the plan goes on from there to the end. An
escalation whose stop never reached a rank is carried out (the workers killed) and recorded so.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.actions.control import EscalateAction
from supervisor.runtime.controller import Controller
from supervisor.runtime.directives import DirectiveLog
from supervisor.runtime.effects import EndJob, KillWorkers
from supervisor.runtime.restarts import GroupEvent
from supervisor.runtime.state import JobPhase
from supervisor.sdk.directives import Snapshot, Stop
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, calm, spike_at

SNAP = str(Path(__file__).parent / "policies" / "snap.yaml")


class StoppedRank(FakeRanks):
    """Rank 1 stops (SIGSTOP) right after it froze: it acknowledges nothing while stopped."""

    stopped: bool = False

    def control(self, ctl: Controller, events: list[str]) -> None:
        if self.stopped:
            events_for_0 = [{"step": self.step, "rank": 0, "world_size": self.world_size, "control": True,
                             "events": events}]  # fmt: skip
            self.send(ctl, 0, events_for_0)
            return
        super().control(ctl, events)


class Watching(FakeWorkers):
    """Worker supervision that reports the silent ranks the controller names as hung."""

    def watch(self, silent_ranks: list[int]) -> GroupEvent | None:
        if silent_ranks and self.running:
            return GroupEvent("hung", tuple(silent_ranks), "no record (telemetry.hang_timeout_s)")
        return super().watch(silent_ranks)


def test_a_rank_stopped_while_frozen_is_hung_and_the_plan_goes_on(tmp_path: Path) -> None:
    gen = {"n": 0}

    def loss(step: int, rank: int) -> float:
        return spike_at(80)(step, rank) if gen["n"] == 0 else calm(step, rank)

    job = make_job(tmp_path, "hung", max_steps=160, policy=SNAP, telemetry={"min_history": 50, "window": 200,
                                                                              "hang_timeout_s": 5})  # fmt: skip
    ranks = StoppedRank(2, 160, loss)
    workers = Watching(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ctl.boot()
    ranks.run(ctl, lambda: ctl.state.frozen)
    ranks.stopped = True
    ranks.train(ctl, 1)  # the snapshot reaches the ranks: rank 1 never acknowledges it
    ctl.assembler.last_seen[1] = time.monotonic() - 6  # ... and has said nothing for longer than 5 s
    ctl.iterate()
    assert ctl.phase is JobPhase.RESTARTING, ctl.status()
    ranks.stopped, gen["n"] = False, 1
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    spike = next(i for i in ctl.incidents.list_incidents(job="hung") if i.onset_step == 80)
    assert spike.state is IncidentState.RESOLVED
    acted = {e.kind: e for e in ctl.incidents.timeline(spike.id) if e.action_id}
    snapshot = acted[EventKind.SNAPSHOT]
    assert snapshot.status is EventStatus.FAILED and snapshot.result["moot"]  # never "done"
    assert acted[EventKind.FIX_APPLIED].status is EventStatus.DONE
    hung = [i for i in ctl.incidents.list_incidents(job="hung") if i.id != spike.id]
    assert hung and "hung" in str(hung[0].diagnosis.causes[0].evidence)


def test_an_escalation_whose_stop_never_arrived_kills_the_workers_and_says_so() -> None:
    log = DirectiveLog([], {}, {})
    snap = Snapshot(reason="x", id="a-snapshot")
    stop = Stop(reason="x", id="a-stop")
    for d in (snap, stop):
        log.append(d)
    log.note_events(0, 10, ["directive_applied:a-snapshot:snapshot", "directive_applied:a-stop:stop"])
    log.note_events(1, 10, ["directive_applied:a-snapshot:snapshot"])  # rank 1 stopped before the stop
    rt = SimpleNamespace(directives=log, world_size=2, generation_started_at=0.0, settings=FAST,
                         workers_gone=lambda: False)  # fmt: skip
    memo = {
        "snapshot": snap.to_dict(),
        "stop": stop.to_dict(),
        "reason": "x",
        "started_at": time.time() - 1000,
    }
    out = EscalateAction().poll(rt, {}, memo)  # type: ignore[arg-type]
    assert out is not None and out.result["stopped"] is False
    assert "did not acknowledge" in out.result["workers_killed"]
    assert out.effects == (EndJob("escalated", "x"), KillWorkers(out.result["workers_killed"]))

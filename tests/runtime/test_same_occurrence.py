"""Another signal that crosses its band a few steps after an incident's onset, dated at that same
onset, is more evidence of the occurrence being handled, never an incident of its own: no second
plan for a step already handled, on the real controller with fake workers (tests/runtime/harness.py),
and the same after the supervisor is killed around the moment it is noted."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from supervisor.incidents import EventKind, IncidentState
from supervisor.incidents.timeline import describe
from supervisor.runtime import controller as controller_module
from supervisor.runtime import state as state_module
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, calm

HOLD = str(Path(__file__).parent / "policies" / "hold.yaml")  # a fix with no rollback
ONSET = 130


@dataclass
class BadBatchThenBiggerUpdates(FakeRanks):
    """Rank 1's loss jumps at ``ONSET`` for one step; from that step every rank's update is
    larger for a while (the weights kept that step), which the update ratio shows later."""

    def record(self, step: int, rank: int, events: list[str] | None = None) -> dict[str, Any]:
        r = super().record(step, rank, events)
        if step == ONSET and rank == 1:
            r["loss"] = calm(step, rank) * 3
        if ONSET <= step < ONSET + 12:
            r["update_norm"] = 0.25
        return r


def same_occurrence_notes(ctl: Controller, incident_id: int) -> list[Any]:
    return [e for e in ctl.incidents.timeline(incident_id)
            if e.kind is EventKind.NOTE and "same_occurrence" in e.payload]  # fmt: skip


class Killed(Exception):
    """The supervisor dies here."""


@pytest.mark.parametrize("kill", [None, "after_the_note", "before_its_state"])
def test_a_later_signal_at_the_handled_onset_is_noted_on_that_incident(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kill: str | None
) -> None:
    job = make_job(tmp_path, "fold", max_steps=260, policy=HOLD)
    ranks = BadBatchThenBiggerUpdates(2, 260)
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ctl.boot()

    def noted(c: Controller) -> bool:
        incidents = c.incidents.list_incidents(job="fold")
        return bool(incidents) and bool(same_occurrence_notes(c, incidents[-1].id))

    if kill == "before_its_state":  # the note reached the store, no state written after it did
        for module in (controller_module, state_module):
            real = module.write_state

            def write_state(path: Path, data: str, _real: Any = real) -> None:
                if noted(ctl):
                    raise Killed
                _real(path, data)

            monkeypatch.setattr(module, "write_state", write_state)
        with pytest.raises(Killed):
            ranks.run(ctl, lambda: False)
        monkeypatch.undo()
        assert b'"folded_keys":[]' in ctl.state_path.read_bytes()
    else:
        ranks.run(ctl, lambda: noted(ctl))
    if kill is not None:
        ctl = Controller(job, FAST, attach=True, workers=workers)
        ctl.boot()
        ranks.resend(ctl)  # what the dead supervisor had not made durable comes back
    ranks.run(ctl, lambda: ctl.phase.is_terminal)

    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    [inc] = ctl.incidents.list_incidents(job="fold")  # one incident: no second plan for step 130
    assert inc.state is IncidentState.RESOLVED and inc.onset_step == ONSET
    assert inc.diagnosis is not None and inc.diagnosis.rank_local and inc.diagnosis.first_rank == 1
    [note] = same_occurrence_notes(ctl, inc.id)  # noted once, whenever the supervisor died
    seen = note.payload["same_occurrence"]["diagnosis"]
    assert seen["onset_step"] == ONSET and note.step is not None and note.step > ONSET
    assert seen["first_anomaly"]["metric"] != "loss"  # another signal than the one that opened it
    text = describe(note)
    assert f"left its band at step {ONSET}" in text and "not an incident of its own" in text
    plans = [e for e in ctl.incidents.timeline(inc.id) if e.kind is EventKind.NOTE and "plan" in e.payload]
    assert len(plans) == 1

"""Action executors keep nothing of one run for the next (an executor is one object for the whole
process, whose controllers' action ids repeat from job to job) and return what the job must do
as effect values (``start``'s, ``Waiting.effects``, ``Outcome.effects``) instead of calling back into the controller."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from supervisor.core.model import HealthMark
from supervisor.runtime.actions import entry
from supervisor.runtime.actions.base import Outcome, Waiting
from supervisor.runtime.actions.checkpoints import RollbackAction
from supervisor.runtime.actions.fix import ApplyAction
from supervisor.runtime.effects import Issue, NoteOverrides, Rewind
from supervisor.sdk.directives import RollbackInPlace


class _Ranks(SimpleNamespace):
    def failed_on(self, directive_id: str) -> list[int]:
        return [0] if directive_id in self.refused else []

    def acked_by(self, directive_id: str) -> dict[int, int]:
        return {}

    def has(self, directive_id: str) -> bool:
        return directive_id == "i1-p1-a3-rollback"  # the planned directive: issued by ``start``


def _rt(refused: set[str], quarantined: set[int]) -> Any:
    def find(step: int) -> Any:
        mark = HealthMark.QUARANTINED if step in quarantined else HealthMark.HEALTHY
        return SimpleNamespace(health=mark, history=[SimpleNamespace(reason="restore check failed")])

    return SimpleNamespace(
        directives=_Ranks(refused=refused),
        checkpoints=SimpleNamespace(find=find),
        rollback_target=lambda bound, mark: (40, {"ok": True}),
        incident_id=1,
        world_size=1,
        workers_gone=lambda: False,
        generation_started_at=0.0,
        settings=SimpleNamespace(directive_timeout_s=1e9),
    )


def _memo(started_at: float) -> dict[str, Any]:
    directive = RollbackInPlace(step=80, id="i1-p1-a3-rollback").to_dict()
    return {
        "from_step": 100,
        "started_at": started_at,
        "to_step": 80,
        "verification": {},
        "directive": directive,
    }


def test_a_target_passed_over_in_one_run_is_not_the_next_runs_target() -> None:
    ex = entry("rollback").executor
    first = _rt(refused={"i1-p1-a3-rollback"}, quarantined={80})
    # Checkpoint 80 refused on the ranks: the rollback goes to 40, by a directive it asks to issue.
    fallback = ex.poll(first, {}, _memo(time.time()))
    assert fallback == Waiting((Issue(RollbackInPlace(step=40, id="i1-p1-a3-rollback~40")),))
    # A later job in the same process whose incident 1 plans the same action id, to checkpoint 80.
    later = _rt(refused=set(), quarantined=set())
    calls: list[str] = []
    later.directives.acked_by = lambda did: calls.append(did) or {}
    assert ex.poll(later, {}, _memo(time.time() + 1)) is None  # waiting for the ranks
    assert calls == ["i1-p1-a3-rollback"], calls  # its own target, not the first run's 40


def test_an_in_place_rollback_asks_for_its_rewind_and_does_not_do_it() -> None:
    # The executor returns the effect; the plan runner carries it out before the action is done.
    rt = _rt(refused=set(), quarantined=set())  # no ``rewind``: calling back would raise
    rt.diagnosis = SimpleNamespace(onset_step=90)
    out = RollbackAction().finished(rt, {"margin_steps": 10}, _memo(time.time()), Outcome.done())
    assert out.ok and out.result["to_step"] == 80 and out.result["onset_step"] == 90
    assert out.effects == (Rewind(80, "rewind:i1-p1-a3-rollback", "rollback of incident 1"),)


def test_an_applied_fix_asks_for_the_detector_to_know_it() -> None:
    rt = SimpleNamespace(current_step=120, incident_id=1)  # no ``note_overrides``: calling back would raise
    memo = {"directive": {"id": "i1-p1-a4-apply"}}
    out = ApplyAction().finished(rt, {"grad_clip": 0.5}, memo, Outcome.done(acked_at_step=118))
    assert out.effects == (NoteOverrides(118, {"grad_clip": 0.5}, "fix of incident 1"),)

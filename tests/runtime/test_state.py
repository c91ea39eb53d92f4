"""RuntimeState persists atomically and JobPhase says what is terminal and the exit code."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.policy import Plan, PlannedAction
from supervisor.runtime.state import ActivePlan, JobPhase, RuntimeState


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "runtime" / "job.json"
    st = RuntimeState(
        job="j", phase=JobPhase.INCIDENT, generation=2, directives=[{"id": "a", "seq": 1, "kind": "freeze"}]
    )
    plan = Plan(policy="p", rule="r", matched_because="m", actions=(PlannedAction("freeze", {}, "why"),))
    st.active = ActivePlan(incident_id=3, plan_no=1, plan=plan, index=1)
    st.receipts = {"link": 7}
    st.acks = {"d1": {0: 12, 1: 12}}
    st.save(path)
    back = RuntimeState.load(path)
    assert back == st
    assert not path.with_suffix(".tmp").exists()


def test_missing_file_is_none(tmp_path: Path) -> None:
    assert RuntimeState.load(tmp_path / "nope.json") is None


def test_phases() -> None:
    assert JobPhase.FINISHED.is_terminal and JobPhase.FINISHED.exit_code == 0
    assert JobPhase.UNFINISHED.is_terminal and JobPhase.UNFINISHED.exit_code == 1
    assert JobPhase.ESCALATED.exit_code == 1 and JobPhase.FAILED.exit_code == 1
    assert not JobPhase.INCIDENT.is_terminal and not JobPhase.RESTARTING.is_terminal

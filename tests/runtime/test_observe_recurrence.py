"""A fault that comes back inside its own observation window fails it, whatever its severity,
and the verdict lists every criterion with its number and threshold (issue 13, "an observation
that proves the fix"); real controller, fake workers (tests/runtime/harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, spikes_once

HOLD = str(Path(__file__).parent / "policies" / "hold.yaml")


@pytest.mark.slow
def test_a_recurrence_inside_the_window_fails_it_and_is_no_incident_of_its_own(tmp_path: Path) -> None:
    job = make_job(tmp_path, "win", max_steps=260, policy=HOLD)
    ranks = FakeRanks(2, 260, spikes_once(130, 150))  # rank 0 again at 150: inside the window
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    [inc] = ctl.incidents.list_incidents(job="win")  # the recurrence is this incident's, not a new one
    assert inc.state is IncidentState.RESOLVED
    timeline = ctl.incidents.timeline(inc.id)
    [again] = [e for e in timeline if e.kind is EventKind.DETECTED and e.payload.get("in_window")]
    # rank 0 alone again: a rank-local fault, which the policy acts on, so medium (issue 19, core.diagnose.severity)
    assert (
        again.payload["diagnosis"]["onset_step"] == 150 and again.payload["diagnosis"]["severity"] == "medium"
    )

    first, second = [e for e in timeline if e.kind is EventKind.OBSERVATION]
    assert first.status is EventStatus.FAILED and first.result["passed"] is False
    checks = first.result["checks"]
    assert checks["recurrence"] == {"ok": False, "value": 1.0, "limit": 0.0,
                                    "detail": "the fault came back inside the window: onset 150 (medium)"}  # fmt: skip
    assert first.result["ended_early_at_step"] < 160  # failed when it came back, not at the window's end
    for name in ("finite", "loss", "grad_norm", "no_new_anomaly"):  # every criterion, with number and limit
        assert {"ok", "value", "limit", "detail"} <= set(checks[name]) and checks[name]["limit"] is not None
    assert second.status is EventStatus.DONE and second.result["checks"]["recurrence"]["ok"]
    states = [e.payload["to"] for e in timeline if e.kind is EventKind.STATE_CHANGED]
    assert states[-3:] == ["acting", "observing", "resolved"]  # re-planned after the failed window


def test_what_counts_as_the_same_fault_coming_back() -> None:
    from supervisor.core.model import Diagnosis
    from supervisor.runtime.incidents import same_fault
    from tests.incidents.builders import diagnosis

    def d(**over: object) -> Diagnosis:
        base = {"rank_local": False, "first_rank": None, "source_local": None, "severity": "medium"}
        return Diagnosis.from_json(diagnosis(**{**base, **over}))

    lr = [{"cause": "optimizer", "score": 0.9, "evidence": ["learning rate 1e-3 -> 3e-2 (30x)"]}]
    assert same_fault(d(causes=lr), d(causes=lr, severity="low"))  # the LR jump again, even as a blip
    assert same_fault(d(rank_local=True, first_rank=1), d(rank_local=True, first_rank=1, severity="low"))
    assert not same_fault(d(rank_local=True, first_rank=1), d(rank_local=True, first_rank=0))
    assert same_fault(d(), d())  # same top cause (data) at medium severity
    assert not same_fault(d(), d(severity="low"))  # a low blip sharing only the cause category
    machinery = [{"cause": "distributed", "score": 1.0, "evidence": ["worker rank(s) [1] lost"]}]
    assert not same_fault(d(causes=machinery), d(causes=machinery))

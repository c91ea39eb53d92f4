"""The dry run over hand-made diagnoses: checkpoint marks, attempt counting, JSON shape."""

from __future__ import annotations

from supervisor.cli.dryrun import checkpoints_from_records, dry_run
from supervisor.core.model import HealthMark
from supervisor.core.policy import Policy
from supervisor.core.records import Record

from .conftest import diag


def _records(n: int, saved_every: int) -> list[Record]:
    return [
        Record(step=s, loss=3.0, events=["checkpoint_saved"] if s and s % saved_every == 0 else [])
        for s in range(n)
    ]


def test_checkpoints_inside_an_incident_are_not_healthy() -> None:
    refs = checkpoints_from_records(_records(500, 100), [diag(onset=290, peak=310, end=330)])
    assert [(c.step, c.mark) for c in refs] == [
        (100, HealthMark.HEALTHY),
        (200, HealthMark.HEALTHY),
        (300, HealthMark.VERIFIED),
        (400, HealthMark.HEALTHY),
    ]


def test_assumed_interval_overrides_events() -> None:
    refs = checkpoints_from_records(_records(260, 100), [], every=50)
    assert [c.step for c in refs] == [0, 50, 100, 150, 200, 250]


def test_repeated_divergences_count_attempts_then_escalate(default_policy: Policy) -> None:
    refs = checkpoints_from_records(_records(2000, 100), [])
    incidents = [diag(onset=s, end=s + 20) for s in (1500, 400, 700)]  # out of order on purpose
    out = dry_run(default_policy, incidents, refs)
    assert [e.diagnosis.onset_step for e in out] == [400, 700, 1500]
    assert [e.plan.attempt for e in out] == [1, 2, 1]  # 1500 is > cooldown_steps after 720
    assert not any(e.plan.escalates for e in out)
    assert out[1].state.attempts == {"divergence": 1} and out[1].state.steps_since_last_incident == 280
    third = dry_run(default_policy, [diag(onset=s, end=s + 20) for s in (400, 600, 800)], refs)
    assert [e.plan.escalates for e in third] == [False, False, True]
    assert all(c.step <= 805 for c in third[2].state.checkpoint_refs or ())
    assert third[2].to_json()["plan"]["escalate_reason"].startswith("Deciding to escalate: attempts 2")

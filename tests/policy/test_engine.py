"""The engine: limits, escalation, fallback, determinism, and the JSON of a plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.core.policy import JobState, Plan, Policy, load_policy, plan

from .conftest import diag, one_rule, state, write_policy


def test_escalates_when_attempts_are_exhausted(default_policy: Policy) -> None:
    p = plan(diag(), state(attempts={"divergence": 2}, steps_since_last_incident=40), default_policy)
    assert p.escalates and p.attempt == 3
    assert p.escalate_reason == (
        "Deciding to escalate: attempts 2 reached rule 'divergence' defaults.max_attempts=2"
    )
    assert p.action_names == ["freeze", "alert", "escalate"]


def test_rule_limit_is_named_in_the_reason(default_policy: Policy) -> None:
    d = diag("periodic", ("data",))
    p = plan(d, state(attempts={"periodic": 2}, steps_since_last_incident=10), default_policy)
    assert (
        p.escalate_reason
        == "Deciding to escalate: attempts 2 reached rule 'periodic' defaults.max_attempts=2"
    )
    d = diag("transient", ("distributed",), rank_local=True, first_rank=1)
    p = plan(d, state(attempts={"rank_local": 20}, steps_since_last_incident=10), default_policy)
    assert p.escalate_reason == "Deciding to escalate: attempts 20 reached rule 'rank_local' max_attempts=20"


def test_attempts_of_another_rule_do_not_count(default_policy: Policy) -> None:
    p = plan(diag(), state(attempts={"transient": 5}, steps_since_last_incident=10), default_policy)
    assert not p.escalates and p.attempt == 1


def test_cooldown_resets_the_attempt_count(default_policy: Policy) -> None:
    p = plan(diag(), state(attempts={"divergence": 2}, steps_since_last_incident=500), default_policy)
    assert not p.escalates and p.attempt == 1
    assert any("cooldown_steps=500" in n for n in p.notes)


def test_second_attempt_inside_cooldown_is_planned(default_policy: Policy) -> None:
    p = plan(diag(), state(attempts={"divergence": 1}, steps_since_last_incident=499), default_policy)
    assert not p.escalates and p.attempt == 2 and "rollback" in p.action_names


def test_observation_window_failing_twice_escalates(default_policy: Policy) -> None:
    once = plan(diag(), state(observation_failures=1), default_policy)
    twice = plan(diag(), state(observation_failures=2), default_policy)
    assert not once.escalates and "rollback" in once.action_names
    assert twice.escalates and "observation window failed 2 time(s)" in (twice.escalate_reason or "")


def test_no_matching_rule_uses_the_fallback(tmp_path: Path) -> None:
    pol = load_policy(write_policy(tmp_path, one_rule(["alert"], match={"phenotype": ["periodic"]})))
    p = plan(diag("transient", ("data",)), state(), pol)
    assert p.rule is None and p.action_names == ["alert", "escalate"]
    assert p.escalates and p.passed_over == (("r", "phenotype transient not in [periodic]"),)


def test_rule_with_escalate_states_why(tmp_path: Path) -> None:
    pol = load_policy(write_policy(tmp_path, one_rule(["alert", {"escalate": {"message": "needs a human"}}])))
    p = plan(diag(), state(), pol)
    assert p.escalate_reason == "Deciding to escalate: rule 'r' says so: needs a human"


def test_first_matching_rule_wins_and_others_are_explained(tmp_path: Path) -> None:
    body = {
        "version": 1,
        "name": "t",
        "rules": [
            {
                "name": "big",
                "match": {"metrics": [{"metric": "rise_steps", "op": ">", "value": 50}]},
                "actions": ["stop"],
            },
            {"name": "sev", "match": {"severity_at_least": "critical"}, "actions": ["escalate"]},
            {"name": "any", "match": {}, "actions": ["alert"]},
        ],
    }
    pol = load_policy(write_policy(tmp_path, body))
    p = plan(diag(peak=350, severity="high"), state(), pol)
    assert p.rule == "any"
    assert dict(p.passed_over) == {"big": "rise_steps=10 is not > 50", "sev": "severity high below critical"}
    assert plan(diag(peak=400), state(), pol).rule == "big"


def test_on_failure_defaults_to_policy_setting(tmp_path: Path) -> None:
    body = one_rule(["alert", {"observe": {"steps": 60}, "on_failure": "continue"}])
    body["defaults"] = {"on_failure": "stop"}
    p = plan(diag("transient", ("data",)), state(), load_policy(write_policy(tmp_path, body)))
    assert [a.on_failure for a in p.actions] == ["stop", "continue"]


def test_plan_is_deterministic_and_leaves_inputs_alone(default_policy: Policy) -> None:
    d, s = diag(nonfinite=True), state(attempts={"nonfinite": 1})
    before = (json.dumps(d.to_json()), json.dumps(s.to_json()), default_policy.model_dump_json())
    first, second = plan(d, s, default_policy), plan(d, s, default_policy)
    assert first == second and first.to_json() == second.to_json()
    assert before == (json.dumps(d.to_json()), json.dumps(s.to_json()), default_policy.model_dump_json())


def test_plan_json_is_strict_json(default_policy: Policy) -> None:
    p = plan(diag(suspect_samples=["a"]), state(), default_policy)
    data = json.loads(json.dumps(p.to_json(), allow_nan=False))
    assert data["rule"] == "divergence" and data["actions"][4]["params"]["target_step"] == 200
    assert isinstance(p, Plan)


def test_job_state_is_frozen_and_sorted() -> None:
    s = JobState(step=5, attempts={"a": 1}, checkpoints=((300, "healthy"), (100, "verified")))
    assert [c.step for c in s.checkpoint_refs or ()] == [100, 300]
    with pytest.raises(TypeError):
        s.attempts["a"] = 2  # type: ignore[index]


def test_plan_json_round_trips(default_policy: Policy) -> None:
    for d in (
        diag(suspect_samples=["a"]),
        diag("transient", ("data",), suspect_samples=["x"]),
        diag(nonfinite=True),
    ):
        p = plan(d, state(attempts={"divergence": 1}), default_policy)
        again = Plan.from_json(json.loads(json.dumps(p.to_json())))
        assert again.to_json() == p.to_json()

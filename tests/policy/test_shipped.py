"""The other shipped policies do what their comments say."""

from __future__ import annotations

import pytest

from supervisor.core.policy import load_policy, plan

from .conftest import diag, state


@pytest.mark.parametrize("phenotype", ["divergence", "slow_recovery", "periodic"])
def test_conservative_holds_and_hands_over(phenotype: str) -> None:
    p = plan(diag(phenotype, ("optimizer",)), state(), load_policy("conservative"))
    assert p.action_names == ["alert", "freeze", "snapshot", "block_latest", "escalate"]
    assert p.escalates and "a person decides" in (p.escalate_reason or "")


def test_conservative_only_alerts_on_plain_transients() -> None:
    p = plan(diag("transient", ("data",)), state(), load_policy("conservative"))
    assert p.action_names == ["alert"] and not p.escalates


def test_skip_and_restart_rolls_back_100_steps_and_skips_batches() -> None:
    p = plan(diag("divergence", ("optimizer",), onset=410), state(), load_policy("skip-and-restart"))
    assert p.action_names == [
        "alert", "freeze", "snapshot", "block_latest", "rollback", "apply", "observe", "resume",
    ]  # fmt: skip
    rollback, apply = p.action("rollback"), p.action("apply")
    assert rollback is not None and rollback.params["target_step"] == 300
    assert apply is not None and 200 <= apply.params["skip_batches"] <= 500 and "lr_scale" not in apply.params


def test_skip_and_restart_leaves_low_severity_alone() -> None:
    p = plan(diag("transient", ("data",), severity="low"), state(), load_policy("skip-and-restart"))
    assert p.rule is None and p.action_names == ["alert"] and not p.escalates


def test_skip_and_restart_second_recurrence_escalates() -> None:
    s = state(attempts={"skip-and-restart": 2}, steps_since_last_incident=120)
    assert plan(diag(), s, load_policy("skip-and-restart")).escalates

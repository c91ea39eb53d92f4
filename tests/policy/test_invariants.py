"""The invariants hold whatever a policy says: each test feeds a policy that tries to break one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from supervisor.core.model import HealthMark
from supervisor.core.policy import load_policy, plan
from supervisor.errors import PolicyError

from .conftest import diag, one_rule, state, write_policy

RECKLESS = ["freeze", {"rollback": {"margin_steps": 50}}, {"apply": {"lr_scale": 0.5}}, "resume"]
LOWER_LR_AND_GO = ["alert", {"apply": {"lr_scale": 0.3, "warmup_steps": 100}}, {"observe": {"steps": 50}}]


def load(tmp_path: Path, actions: list[Any], **rule: Any) -> Any:
    return load_policy(write_policy(tmp_path, one_rule(actions, **rule)))


@pytest.mark.parametrize("phenotype", ["transient", "divergence"])
def test_metric_artifact_never_rolls_back_or_applies(tmp_path: Path, phenotype: str) -> None:
    pol = load(tmp_path, RECKLESS)
    p = plan(diag(phenotype, ("metric_artifact", "numeric"), nonfinite=True), state(), pol)
    assert p.action_names == ["alert"]
    assert any("metric_artifact" in n for n in p.notes)


def test_metric_artifact_keeps_the_policys_alert(tmp_path: Path) -> None:
    pol = load(tmp_path, [{"alert": {"message": "check the reduction"}}, *RECKLESS])
    p = plan(diag("transient", ("metric_artifact",)), state(attempts={"r": 99}, observation_failures=5), pol)
    assert [(a.name, a.params["message"]) for a in p.actions] == [("alert", "check the reduction")]


@pytest.mark.parametrize(
    "nonfinite_kw",
    [
        {"diagnosis": {"nonfinite": True}},
        {"state": {"state_maybe_nonfinite": True}},
        {"diagnosis": {}, "causes": ("numeric",)},
    ],
)
def test_possibly_nonfinite_state_is_rolled_back_before_continuing(tmp_path: Path, nonfinite_kw: Any) -> None:
    pol = load(tmp_path, LOWER_LR_AND_GO)
    causes = nonfinite_kw.get("causes", ("optimizer",))
    d = diag("divergence", causes, **nonfinite_kw.get("diagnosis", {}))
    p = plan(d, state(**nonfinite_kw.get("state", {})), pol)
    names = p.action_names
    assert names.index("rollback") < names.index("apply")
    assert names.index("freeze") < names.index("block_latest") < names.index("rollback")
    assert any("lowering the LR and continuing is never a fix" in n for n in p.notes)


def test_finite_divergence_may_lower_lr_and_continue(tmp_path: Path) -> None:
    """The invariant is about a possibly broken state, not every divergence."""
    pol = load(tmp_path, LOWER_LR_AND_GO)
    p = plan(diag("divergence", ("optimizer",)), state(), pol)
    assert p.action_names == ["alert", "apply", "observe"]


def test_late_rollback_is_moved_before_continuing(tmp_path: Path) -> None:
    pol = load(tmp_path, ["freeze", {"apply": {"lr_scale": 0.5}}, "resume", "block_latest", "rollback"])
    p = plan(diag("divergence", ("numeric",), nonfinite=True), state(), pol)
    assert p.action_names == ["freeze", "block_latest", "rollback", "apply", "resume"]


def test_nonfinite_without_any_checkpoint_escalates(tmp_path: Path) -> None:
    pol = load(tmp_path, LOWER_LR_AND_GO)
    p = plan(diag("divergence", ("numeric",), nonfinite=True), state(checkpoints=()), pol)
    assert p.escalates and p.action_names == ["freeze", "alert", "escalate"]
    assert "apply" not in p.action_names
    assert "no healthy checkpoint" in (p.escalate_reason or "")


def test_block_latest_is_inserted_before_rollback(tmp_path: Path) -> None:
    pol = load(tmp_path, RECKLESS)
    p = plan(diag("divergence", ("optimizer",)), state(), pol)
    assert p.action_names == ["freeze", "block_latest", "rollback", "apply", "resume"]
    assert "block_latest inserted before rollback" in p.notes


def test_block_latest_listed_after_rollback_is_moved(tmp_path: Path) -> None:
    pol = load(tmp_path, ["freeze", "rollback", "block_latest", "resume"])
    p = plan(diag("divergence", ("optimizer",)), state(), pol)
    assert p.action_names == ["freeze", "block_latest", "rollback", "resume"]


def test_diagnostic_snapshot_is_never_a_rollback_target(tmp_path: Path) -> None:
    pol = load(tmp_path, RECKLESS)
    ckpts = ((100, HealthMark.HEALTHY), (250, HealthMark.DIAGNOSTIC), (280, HealthMark.QUARANTINED))
    p = plan(diag("divergence", ("optimizer",), onset=340), state(checkpoints=ckpts), pol)
    rollback = p.action("rollback")
    assert rollback is not None and rollback.params["target_step"] == 100
    assert "passing over 250 diagnostic, 280 quarantined" in rollback.reason


def test_only_diagnostic_checkpoints_means_escalate(tmp_path: Path) -> None:
    pol = load(tmp_path, RECKLESS)
    p = plan(diag("divergence", ("optimizer",)), state(checkpoints=((200, "diagnostic"),)), pol)
    assert p.escalates and "rollback" not in p.action_names


@pytest.mark.parametrize(("min_mark", "target"), [("healthy", 100), ("verified", 200)])
def test_rollback_target_must_be_verified(tmp_path: Path, min_mark: str, target: int) -> None:
    pol = load(tmp_path, ["block_latest", {"rollback": {"margin_steps": 100, "min_mark": min_mark}}])
    ckpts = ((100, "healthy"), (200, "verified"), (230, "unverified"))
    p = plan(diag("divergence", ("optimizer",), onset=340), state(checkpoints=ckpts), pol)
    rollback = p.action("rollback")
    assert rollback is not None
    assert rollback.params["target_step"] == target and rollback.params["require_verified"] is True


def test_require_verified_false_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="require_verified: cannot be false"):
        load(tmp_path, [{"rollback": {"require_verified": False}}])


def test_unknown_checkpoints_leave_the_target_to_the_runtime(tmp_path: Path) -> None:
    pol = load(tmp_path, RECKLESS)
    p = plan(diag("divergence", ("optimizer",), onset=340), state(checkpoints=None), pol)
    rollback = p.action("rollback")
    assert rollback is not None and rollback.params["target_step"] is None
    assert rollback.params["max_target_step"] == 290  # onset 340 - margin_steps 50

"""``margin_steps`` is a preference, not a reason to escalate: the rollback target is the newest
healthy checkpoint at least the margin before the onset when one exists, otherwise the newest
healthy one before the onset (docs/policies.md); only no healthy checkpoint before the onset at
all escalates. Sampler cell ``848960:847823``: an LR bug at 61 escalated with "no healthy
checkpoint at or before step 11 (onset 61 - margin_steps=50)" though 20 and 40 were healthy."""

from __future__ import annotations

from dataclasses import replace

from supervisor.core.model import CauseScore, Diagnosis
from supervisor.core.policy import Policy, plan
from tests.policy.conftest import diag, state


def lr_bug(onset: int) -> Diagnosis:
    """An update jump at the onset: the default policy's ``optimizer_state`` rule (margin 50). The
    update is an effect, so the margin applies; an onset the LR itself dates needs none
    (tests/policy/test_lr_dated_margin.py)."""
    d = diag("slow_recovery", ("optimizer",), onset=onset)
    top = CauseScore(d.causes[0].cause, 0.9, [f"update ratio 30x its level at step {onset}"])
    return replace(d, causes=[top])


def test_a_margin_no_checkpoint_meets_falls_back_to_the_newest_healthy_before_the_onset(
    default_policy: Policy,
) -> None:
    ckpts = ((20, "healthy"), (40, "healthy"), (60, "healthy"))
    p = plan(lr_bug(61), state(step=70, checkpoints=ckpts), default_policy)
    assert not p.escalates, p.escalate_reason
    rollback = p.action("rollback")
    assert rollback is not None
    assert rollback.params["target_step"] == 60 and rollback.params["max_target_step"] == 60
    assert "margin" in rollback.reason and "not met" in rollback.reason, rollback.reason


def test_the_margin_is_kept_when_a_checkpoint_meets_it(default_policy: Policy) -> None:
    ckpts = ((20, "healthy"), (40, "healthy"), (60, "healthy"), (80, "healthy"))
    p = plan(lr_bug(95), state(step=100, checkpoints=ckpts), default_policy)
    rollback = p.action("rollback")
    assert rollback is not None and rollback.params["target_step"] == 40  # 95 - margin 50 = 45


def test_no_healthy_checkpoint_before_the_onset_still_escalates(default_policy: Policy) -> None:
    ckpts = ((20, "diagnostic"), (60, "healthy"))
    p = plan(lr_bug(50), state(step=70, checkpoints=ckpts), default_policy)
    assert p.escalates and "no healthy checkpoint" in (p.escalate_reason or "")

"""An onset the LR dates needs no margin: the rollback goes to the newest healthy checkpoint before
the step the LR left its level (``rollback.lr_dated_margin_steps``, docs/policies.md).

``margin_steps`` buys room for an onset dated late: a fault that began before the first abnormal
quantity the detector saw, so that a checkpoint just before the dated onset may already hold it.
When the first abnormal quantity is the LR itself -- an input every record carries -- no step before
it ran at the faulty LR, and a ``healthy`` target already had anomaly-free steps after it. Sampler
cells ``693813:321542`` (an LR bug at 102 rolled back to 40, past healthy 80, then re-warmed over
62 steps: 1.0502x clean) and ``925762:346706`` (one step at 88x the LR at 147 of 150 rolled back to
80, past healthy 100 and 120, re-warmed over 67 steps: 1.050x) paid for a margin the evidence had
already covered. An onset dated by its effects (an update jump, a NaN, a loss rise) keeps it.
"""

from __future__ import annotations

from dataclasses import replace

from supervisor.core.model import CauseScore, Diagnosis
from supervisor.core.policy import Policy, load_policy, plan
from supervisor.core.policy.resolve import lr_dated_onset
from tests.policy.conftest import diag, state

EVERY_20 = tuple((s, "healthy") for s in range(20, 101, 20))


def with_evidence(onset: int, *sentences: str, phenotype: str = "transient") -> Diagnosis:
    """An optimizer incident whose top cause states ``sentences``, as the detector writes them."""
    d = diag(phenotype, ("optimizer", "data"), onset=onset, peak=onset)
    return replace(d, causes=[CauseScore(d.causes[0].cause, 0.6, list(sentences)), d.causes[1]])


def lr_bug(onset: int) -> Diagnosis:
    """Cell 693813:321542's first plan: an update jump and an LR jump at the onset."""
    return with_evidence(
        onset,
        f"update ratio 18.6x its level at step {onset}",
        f"learning rate changed 19.5x from the previous step at step {onset}",
    )


def test_an_lr_jump_rolls_back_to_the_newest_healthy_checkpoint_before_it(default_policy: Policy) -> None:
    # Planned at 108: 100 is verified, not yet healthy (healthy_after_steps had not passed).
    ckpts = (*EVERY_20[:4], (100, "verified"))
    p = plan(lr_bug(102), state(step=108, checkpoints=ckpts), default_policy)
    rollback, apply = p.action("rollback"), p.action("apply")
    assert rollback is not None and apply is not None
    assert rollback.params["target_step"] == 80, rollback.reason  # was 40 (102 - margin 50)
    assert rollback.params["max_target_step"] == 101 and rollback.params["margin_steps"] == 0
    assert "where the LR left its level" in rollback.reason and "passing over 100 verified" in rollback.reason
    assert apply.params["warmup_steps"] == 22  # to the onset, from 80 (was 62, from 40)


def test_a_one_step_lr_fault_in_the_last_steps_rolls_back_to_the_newest_healthy_checkpoint(
    default_policy: Policy,
) -> None:
    # Cell 925762:346706, planned at the onset 147 of 150: 140 verified, 20..120 healthy.
    d = with_evidence(
        147,
        "update ratio 44.1x its level at step 147",
        "learning rate changed 88x from the previous step at step 147",
    )
    ckpts = (*((s, "healthy") for s in range(20, 121, 20)), (140, "verified"))
    p = plan(d, state(step=147, checkpoints=ckpts), default_policy)
    rollback = p.action("rollback")
    assert rollback is not None and rollback.params["target_step"] == 120, rollback.reason  # was 80


def test_an_lr_rise_from_a_level_is_dated_after_the_level_s_last_step(default_policy: Policy) -> None:
    d = with_evidence(95, "learning rate 0.003 at step 83 -> 0.09 at step 95 (30x)", phenotype="divergence")
    assert lr_dated_onset(d) == 84
    p = plan(d, state(step=100, checkpoints=EVERY_20[:4]), default_policy)
    rollback = p.action("rollback")
    assert (
        rollback is not None
        and rollback.params["target_step"] == 80
        and rollback.params["max_target_step"] == 83
    )


def test_an_onset_dated_by_its_effects_keeps_the_margin(default_policy: Policy) -> None:
    update_only = with_evidence(102, "update ratio 18.6x its level at step 102")
    nan = replace(update_only, nonfinite=True)
    for d in (update_only, nan):
        assert lr_dated_onset(d) is None
        p = plan(d, state(step=108, checkpoints=EVERY_20[:4]), default_policy)
        rollback = p.action("rollback")
        assert rollback is not None and rollback.params["target_step"] == 40, rollback.reason  # 102 - 50


def test_an_lr_fall_or_a_jump_after_the_first_anomaly_dates_nothing() -> None:
    fell = with_evidence(147, "learning rate changed 0.00864x from the previous step at step 148")
    later = with_evidence(102, "learning rate changed 20x from the previous step at step 110")
    assert lr_dated_onset(fell) is None and lr_dated_onset(later) is None


def test_a_policy_that_does_not_set_it_keeps_its_margin(default_policy: Policy) -> None:
    ckpts = tuple((s, "healthy") for s in range(20, 141, 20))
    p = plan(lr_bug(142), state(step=148, checkpoints=ckpts), load_policy("skip-and-restart"))
    rollback = p.action("rollback")
    assert rollback is not None and rollback.params["target_step"] == 40, rollback.reason  # 142 - 100


def test_a_checkpoint_at_the_onset_is_never_the_target_even_with_margin_zero(default_policy: Policy) -> None:
    d = diag("divergence", ("resume_state",), onset=100, after_resume=True)
    p = plan(d, state(step=104, checkpoints=EVERY_20), default_policy)
    rollback = p.action("rollback")
    assert rollback is not None and rollback.params["target_step"] == 80, rollback.reason


# -- the re-warm is insurance for the steps after the onset: bounded by what is left of the run ----
def test_a_rewarm_longer_than_the_run_left_after_the_onset_is_dropped(default_policy: Policy) -> None:
    """Cell 925762:346706: one step at 88x the LR at 147 of 150. The rollback to 120 removes the only
    bad update (the restored moments are the checkpoint's own); a re-warm over 27 steps to the onset
    would protect 3 steps after it and cost the run's last 30 steps most of their LR."""
    d = with_evidence(
        147,
        "update ratio 44.1x its level at step 147",
        "learning rate changed 88x from the previous step at step 147",
    )
    ckpts = (*((s, "healthy") for s in range(20, 121, 20)), (140, "verified"))
    p = plan(d, state(step=147, checkpoints=ckpts, max_steps=150), default_policy)
    assert p.action("rollback") is not None and "apply" not in p.action_names
    assert any(
        "re-warm dropped" in n and "3 steps" in n for n in [*p.notes, *(a.reason for a in p.actions)]
    ), p.notes
    assert p.action_names.index("rollback") < p.action_names.index("observe")


def test_a_rewarm_the_run_has_room_for_is_kept(default_policy: Policy) -> None:
    ckpts = (*EVERY_20[:4], (100, "verified"))
    p = plan(lr_bug(102), state(step=108, checkpoints=ckpts, max_steps=150), default_policy)
    apply = p.action("apply")
    assert apply is not None and apply.params["warmup_steps"] == 22  # 48 steps left after the onset


def test_a_later_attempt_keeps_its_lr_scale_when_the_rewarm_is_dropped(default_policy: Policy) -> None:
    ckpts = (*((s, "healthy") for s in range(20, 121, 20)), (140, "verified"))
    p = plan(
        lr_bug(147), state(step=147, checkpoints=ckpts, max_steps=150, incident_attempt=1), default_policy
    )
    apply = p.action("apply")
    assert apply is not None and apply.params == {"lr_scale": 0.5}, apply.params


# -- no healthy checkpoint before an LR-dated onset: a verified one stands in --------------------
def test_with_no_healthy_checkpoint_before_an_lr_dated_onset_a_verified_one_stands_in(
    default_policy: Policy,
) -> None:
    """Sampler cell ``653355:199713``: a checkpoint every 50, the LR x200 from step 63. The checkpoint
    at 50 was verified, not yet healthy (20 anomaly-free steps needed), so the plan started over from
    step 0 and re-warmed over 63 steps: 1.147x the clean loss. Every step from 50 to 62 ran at the
    scheduled LR, which is all the healthy mark would have vouched for."""
    d = with_evidence(
        63,
        "update ratio 31x its level at step 63",
        "learning rate changed 200x from the previous step at step 63",
    )
    at = state(step=66, checkpoints=((50, "verified"),), checkpoint_every=50, healthy_after=20)
    p = plan(d, at, default_policy)
    rollback, apply = p.action("rollback"), p.action("apply")
    assert rollback is not None and apply is not None, p.escalate_reason
    assert rollback.params["target_step"] == 50 and rollback.params["to_start"] is False, rollback.reason
    assert rollback.params["min_mark"] == "verified" and rollback.params["max_target_step"] == 62
    assert "a verified one stands in" in rollback.reason
    assert apply.params["warmup_steps"] == 13  # from 50 to the onset, not from 0
    assert p.recovery == "in_place"


def test_a_verified_checkpoint_does_not_stand_in_for_an_onset_dated_by_its_effects(
    default_policy: Policy,
) -> None:
    """The same checkpoints with only an update jump: the fault may have begun before the first abnormal
    step, which is what the healthy mark guards against, so the run's start is the target as before."""
    d = with_evidence(63, "update ratio 31x its level at step 63")
    at = state(step=66, checkpoints=((50, "verified"),), checkpoint_every=50, healthy_after=20)
    rollback = plan(d, at, default_policy).action("rollback")
    assert rollback is not None and rollback.params["to_start"] is True, rollback.reason
    assert rollback.params["min_mark"] == "healthy"


def test_a_healthy_checkpoint_before_an_lr_dated_onset_is_still_preferred(default_policy: Policy) -> None:
    d = with_evidence(63, "learning rate changed 200x from the previous step at step 63")
    at = state(
        step=66, checkpoints=((20, "healthy"), (50, "verified")), checkpoint_every=10, healthy_after=20
    )
    rollback = plan(d, at, default_policy).action("rollback")
    assert rollback is not None and rollback.params["target_step"] == 20, rollback.reason
    assert rollback.params["min_mark"] == "healthy"

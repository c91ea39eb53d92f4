"""A fault before the run's first checkpoint rolls back to the run's start (docs/policies.md).

Sampler cells ``910069:257815`` and ``581022:509645``: an LR bug x25 at step 6-13 of the warm-up
has no checkpoint before its onset; the engine escalated ("no healthy checkpoint before the
onset"), although a few steps of training are all that starting over loses. Within the first
checkpoint interval (``checkpoint.every_steps``) the run's start is the target; later, with no
checkpoint before the onset, the plan still escalates.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from supervisor.core.model import Phenotype
from supervisor.core.policy import Policy, load_policy, plan
from tests.policy.conftest import state, write_policy
from tests.policy.test_rollback_margin import lr_bug


def test_an_lr_bug_before_the_first_checkpoint_rolls_back_to_the_run_start(default_policy: Policy) -> None:
    p = plan(lr_bug(7), state(step=12, checkpoints=(), checkpoint_every=20), default_policy)
    assert not p.escalates, p.escalate_reason
    rb = p.action("rollback")
    assert rb is not None and rb.params["to_start"] is True and rb.params["target_step"] == 0
    assert "the run's start (no checkpoint before onset 7)" in rb.reason
    assert p.recovery == "restart"  # no checkpoint to load in place: the group restarts from scratch
    apply = p.action("apply")
    assert apply is not None and apply.params["warmup_steps"] == 7  # re-warm as from step 0
    observe = p.action("observe")
    assert observe is not None and observe.params["cover_until_step"] == 7 + 20
    names = p.action_names
    assert names.index("block_latest") < names.index("rollback") < names.index("apply")


def test_an_unhealthy_checkpoint_after_the_onset_is_passed_over_for_the_start(default_policy: Policy) -> None:
    """Detected late: the checkpoint at 20 was saved after the onset 13 (held back from healthy)."""
    p = plan(lr_bug(13), state(step=22, checkpoints=((20, "verified"),), checkpoint_every=20), default_policy)
    rb = p.action("rollback")
    assert rb is not None and rb.params["to_start"] is True, p.escalate_reason


def test_an_onset_beyond_the_first_interval_with_no_checkpoint_still_escalates(
    default_policy: Policy,
) -> None:
    p = plan(lr_bug(25), state(step=30, checkpoints=((20, "verified"),), checkpoint_every=20), default_policy)
    assert p.escalates
    assert "no healthy checkpoint before the onset 25" in (p.escalate_reason or "")
    assert "beyond the run's first checkpoint interval (checkpoint.every_steps=20)" in (
        p.escalate_reason or ""
    )


def test_an_onset_while_the_first_checkpoint_cannot_yet_be_healthy_rolls_back_to_the_start(
    default_policy: Policy,
) -> None:
    """Sampler cells on a checkpoint every 50 steps: a fault at 55 finds the checkpoint at 50 only
    verified, and it never turns healthy (the onset lies within its healthy window). No checkpoint
    could have earned the mark before the onset, so the run is as young as in the first interval:
    starting over loses at most the interval and the window."""
    at = state(step=60, checkpoints=((50, "verified"),), checkpoint_every=50, healthy_after=20)
    p = plan(lr_bug(55), at, default_policy)
    rb = p.action("rollback")
    assert rb is not None and rb.params["to_start"] is True, p.escalate_reason
    later = plan(lr_bug(71), replace(at, step=75), default_policy)  # past 50 + 20: 50 could be healthy
    assert later.escalates
    assert "and the 20 steps it needs to be marked healthy" in (later.escalate_reason or "")


def test_a_checkpoint_before_the_onset_is_preferred_to_the_start(default_policy: Policy) -> None:
    p = plan(lr_bug(18), state(step=22, checkpoints=((10, "healthy"),), checkpoint_every=10), default_policy)
    rb = p.action("rollback")
    assert rb is not None and rb.params["target_step"] == 10 and rb.params["to_start"] is False
    assert p.recovery == "in_place"


def test_from_start_false_escalates_as_before(tmp_path: Path) -> None:
    body = {
        "version": 1,
        "name": "no-start",
        "rules": [
            {"name": "r", "match": {}, "actions": ["freeze", {"rollback": {"from_start": False}}, "resume"]}
        ],
    }
    pol = load_policy(write_policy(tmp_path, body))
    p = plan(lr_bug(7), state(step=12, checkpoints=(), checkpoint_every=20), pol)
    assert p.escalates and "rollback from_start=false" in (p.escalate_reason or "")


def test_a_transient_still_goes_on_without_the_rollback(default_policy: Policy) -> None:
    """A transient left nothing to undo (5894f12): no start-over for it."""
    from tests.policy.test_sampler_cells import young_run_nan

    p = plan(young_run_nan(), state(step=10, checkpoints=(), checkpoint_every=20), default_policy)
    assert not p.escalates and "rollback" not in p.action_names


def test_an_oversized_update_back_in_band_is_still_started_over(default_policy: Policy) -> None:
    """Sampler cell ``330388:826895``: one oversized update at step 9 of the warm-up (update ratio
    164x its level), the loss back in band at once. The weights kept that step, so "nothing after
    the onset to undo" does not hold: the run ended 6% above its clean loss. With no checkpoint yet
    the run's start is the target, as for any fault the state carries."""
    jump = replace(lr_bug(9), phenotype=Phenotype.TRANSIENT)
    p = plan(jump, state(step=10, checkpoints=(), checkpoint_every=20), default_policy)
    assert not p.escalates, p.escalate_reason
    rb = p.action("rollback")
    assert rb is not None and rb.params["to_start"] is True, p.notes
    assert p.recovery == "restart"


def test_an_oversized_update_past_the_first_interval_still_goes_on(default_policy: Policy) -> None:
    """No start-over allowed (onset beyond the first interval, no checkpoint before it): a transient
    goes on under an observation window, as before, rather than stopping the job."""
    jump = replace(lr_bug(45), phenotype=Phenotype.TRANSIENT)
    p = plan(jump, state(step=46, checkpoints=((40, "verified"),), checkpoint_every=20), default_policy)
    assert not p.escalates, p.escalate_reason
    assert "rollback" not in p.action_names and "observe" in p.action_names

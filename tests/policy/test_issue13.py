"""Issue 13, policy half: each numbered failure reproduced on the old behaviour, then shown fixed.

The "old" policies below are the rules the default policy shipped before (phenotype-led, an
absolute clip, a replay whose failure escalated): planning with them shows the failure; the
shipped default shows the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from supervisor.core.model import Cause, CauseScore, Diagnosis, Phenotype
from supervisor.core.policy import Plan, Policy, load_policy, plan
from supervisor.core.policy.args import ApplyArgs, ObserveArgs, RollbackArgs
from supervisor.core.policy.evidence import findings
from supervisor.core.policy.recurrence import Resolved, reopens, replan_reason
from supervisor.errors import PolicyError

from .conftest import diag, one_rule, state, write_policy

LR_JUMP = "learning rate changed 29.7x from the previous step at step 252"
UPDATE_JUMP = "update ratio 31x its level at step 252"


def lr_bug(phenotype: str, **kw: Any) -> Diagnosis:
    """The 30x LR bug of issue 13 point 1, as the detector states it, read as `phenotype`."""
    d = diag(phenotype, ("optimizer",), onset=252, **kw)
    d.causes = [
        CauseScore(Cause.OPTIMIZER, 0.9, ["loss 2.1 -> 3.4 at step 255; slow return", LR_JUMP, UPDATE_JUMP])
    ]
    return d


OLD_SLOW_RECOVERY = [{"alert": None}, {"apply": {"grad_clip": 1.0}}, {"observe": {"steps": 100}}]


# -- point 1: the 30x LR bug was answered with a no-op clip, and the plan depended on timing ------
def test_point1_old_rule_chose_a_clip_the_job_already_had(tmp_path: Path) -> None:
    old = load_policy(
        write_policy(tmp_path, one_rule(OLD_SLOW_RECOVERY, match={"phenotype": ["slow_recovery"]}))
    )
    p = plan(lr_bug("slow_recovery"), state(grad_clip=1.0, checkpoints=((150, "healthy"),)), old)
    # The engine now refuses the no-op fix and, with LR-jump evidence, rolls back first.
    assert "apply" not in p.action_names or p.action("apply").params.get("grad_clip") != 1.0  # type: ignore[union-attr]
    assert any("grad_clip 1 dropped: the job already clips at 1" in n for n in p.notes), p.notes
    assert p.action_names.index("rollback") < p.action_names.index("observe")


@pytest.mark.parametrize("phenotype", ["slow_recovery", "divergence", "transient"])
def test_point1_lr_jump_always_gets_rollback_before_onset_and_a_fix(
    default_policy: Policy, phenotype: str
) -> None:
    p = plan(
        lr_bug(phenotype),
        state(checkpoints=((100, "healthy"), (150, "healthy"), (250, "healthy"))),
        default_policy,
    )
    assert p.rule == "optimizer_state" and "lr_jump" in p.evidence
    rollback, apply = p.action("rollback"), p.action("apply")
    assert rollback is not None and apply is not None
    # The LR dates the onset (it jumped at 252): the newest healthy checkpoint before it, no margin
    # (rollback lr_dated_margin_steps=0; tests/policy/test_lr_dated_margin.py).
    assert isinstance(rollback.args, RollbackArgs) and rollback.args.target_step == 250
    assert isinstance(apply.args, ApplyArgs) and apply.args.warmup_steps == 252 - 250  # up to the onset
    assert p.action_names.index("rollback") < p.action_names.index("apply") < p.action_names.index("resume")
    assert "learning rate changed 29.7x" in p.matched_because


def test_point1_plan_does_not_depend_on_when_the_phenotype_was_read(default_policy: Policy) -> None:
    s = state()
    early, late = (
        plan(lr_bug("slow_recovery"), s, default_policy),
        plan(lr_bug("divergence"), s, default_policy),
    )
    assert early.action_names == late.action_names and early.rule == late.rule
    assert [a.params for a in early.actions] == [a.params for a in late.actions]


def test_point1_invariant_holds_even_for_a_policy_that_only_clips(tmp_path: Path) -> None:
    pol = load_policy(write_policy(tmp_path, one_rule(OLD_SLOW_RECOVERY)))
    p = plan(lr_bug("slow_recovery"), state(grad_clip=0.0, grad_norm=0.8), pol)
    assert p.action_names == ["alert", "freeze", "block_latest", "rollback", "apply", "observe"]
    assert p.action("apply").params == {"grad_clip": 1.0}  # type: ignore[union-attr]  # the job did not clip


def test_fixes_are_relative_to_what_the_job_runs(default_policy: Policy, tmp_path: Path) -> None:
    d = diag("slow_recovery", ("optimizer",))
    p = plan(d, state(grad_clip=2.0), default_policy)
    assert p.action("apply").params == {"grad_clip": 1.0}  # type: ignore[union-attr]
    assert "(0.5 x the clip in force, 2)" in p.action("apply").reason  # type: ignore[union-attr]
    unclipped = plan(d, state(grad_clip=0.0, grad_norm=0.42), default_policy)
    assert unclipped.action("apply").params == {"grad_clip": 0.42}  # type: ignore[union-attr]
    unknown = plan(d, state(grad_clip=None, grad_norm=None), default_policy)
    assert unknown.action_names == ["alert", "observe"]
    assert any("apply dropped: it would change nothing" in n for n in unknown.notes)
    pol = load_policy(write_policy(tmp_path, one_rule(["alert", {"apply": {"lr_scale": 0.5}}])))
    scaled = plan(diag("transient", ("data",)), state(lr_scale=0.5, lr=1e-3), pol)
    assert scaled.action("apply").params == {"lr_scale": 0.25}  # type: ignore[union-attr]
    assert "x0.5 override in force (x0.25 of the schedule): 0.001 -> 0.0005" in scaled.action("apply").reason  # type: ignore[union-attr]


def test_lr_scale_one_is_refused_as_a_no_op(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="lr_scale: must be < 1"):
        load_policy(write_policy(tmp_path, one_rule([{"apply": {"lr_scale": 1.0}}])))


# -- point 2 (policy side): observation window and throughput ------------------------------------
def test_point2_window_covers_the_onset_and_throughput_is_against_the_run_itself(
    default_policy: Policy,
) -> None:
    p = plan(lr_bug("divergence"), state(), default_policy)
    obs = p.action("observe")
    assert obs is not None and isinstance(obs.args, ObserveArgs)
    assert obs.args.cover_until_step == 252 + 20
    assert obs.args.window_steps(from_step=150) == 122  # past the onset, not just 100 steps
    assert obs.args.window_steps(from_step=250) == 100
    # An LR fix cannot change step speed: a busy neighbour must not fail this window (issue point 2).
    assert obs.args.pass_.throughput is False and "no fix here changes step speed" in obs.reason


def test_point2_throughput_is_judged_when_the_fix_changes_precision(tmp_path: Path) -> None:
    body = one_rule(["alert", {"apply": {"precision": "fp32"}}, {"observe": {"steps": 50}}])
    p = plan(diag("transient", ("numeric",)), state(), load_policy(write_policy(tmp_path, body)))
    obs = p.action("observe")
    assert obs is not None and obs.params["pass"] == {
        "loss_within_mads": 3.0, "grad_norm_ratio_max": 2.0, "update_ratio_max": 2.0,
        "throughput": True, "throughput_min_ratio": 0.5,
    }  # fmt: skip
    assert (
        "sustained throughput >= 0.5x this run's own (observation.throughput=auto: the fix changes precision)"
        in obs.reason
    )


def test_point2_a_policy_can_turn_throughput_off(tmp_path: Path) -> None:
    body = one_rule(["alert", {"observe": {"steps": 50}}])
    body["observation"] = {"throughput": False, "onset_margin_steps": 5}
    p = plan(diag("transient", ("data",), onset=100), state(), load_policy(write_policy(tmp_path, body)))
    obs = p.action("observe")
    assert (
        obs is not None
        and obs.params["pass"]["throughput"] is False
        and obs.params["cover_until_step"] == 105
    )
    assert "throughput not judged" in obs.reason


# -- point 3: one bad batch on one rank stopped the job -----------------------------------------
OLD_RANK_LOCAL = ["alert", "freeze", {"replay": {"other_rank": True}, "on_failure": "escalate"},
                  {"apply": {"exclude": {"samples": "suspects"}}}, "resume"]  # fmt: skip


def rank_blip(rank: int = 1, onset: int = 220) -> Diagnosis:
    return diag(
        "transient", ("data",), onset=onset, rank_local=True, first_rank=rank, suspect_samples=["s:7"]
    )


def test_point3_old_rule_escalated_when_the_replay_did_not_reproduce(tmp_path: Path) -> None:
    old = load_policy(write_policy(tmp_path, one_rule(OLD_RANK_LOCAL)))
    assert plan(rank_blip(), state(), old).action("replay").on_failure == "escalate"  # type: ignore[union-attr]


def test_point3_default_excludes_and_goes_on_whatever_the_replay_says(default_policy: Policy) -> None:
    p = plan(rank_blip(), state(), default_policy)
    assert p.rule == "rank_local" and not p.escalates
    assert p.action("replay").on_failure == "continue"  # type: ignore[union-attr]
    apply = p.action("apply")
    assert apply is not None and apply.params["exclude"] == {"samples": ["s:7"], "batch_range": [220, 230]}
    assert p.action_names[-1] == "resume" and "stop" not in p.action_names


def test_point3_without_replay_hooks_the_batch_is_excluded_without_replay(default_policy: Policy) -> None:
    p = plan(rank_blip(), state(can_replay=False), default_policy)
    assert "replay" not in p.action_names and "apply" in p.action_names and not p.escalates
    assert any("no replay_hooks" in n for n in p.notes)


def test_point3_a_bad_batch_that_moved_the_weights_is_rolled_back_and_kept_out(
    default_policy: Policy,
) -> None:
    d = rank_blip()
    d.causes = [CauseScore(Cause.DATA, 0.9, ["rank 1 loss 9.1 vs ranks' median 2.5 at step 220"]),
                CauseScore(Cause.OPTIMIZER, 0.3, ["update ratio 4x its level at step 220"])]  # fmt: skip
    p = plan(d, state(checkpoints=((150, "healthy"), (200, "healthy"))), default_policy)
    assert p.rule == "bad_batch_step" and not p.escalates
    assert p.action("rollback").params["target_step"] == 200  # type: ignore[union-attr]
    assert p.action("apply").params == {"exclude": {"samples": ["s:7"], "batch_range": [220, 230]}}  # type: ignore[union-attr]
    assert "lr_scale" not in p.action("apply").params and "warmup_steps" not in p.action("apply").params  # type: ignore[union-attr]


def test_point3_only_a_repeat_offender_escalates(default_policy: Policy) -> None:
    once = plan(rank_blip(onset=900), state(rank_incidents=[(400, 1)]), default_policy)
    assert not once.escalates
    other_rank = plan(rank_blip(onset=900), state(rank_incidents=[(400, 0), (600, 0)]), default_policy)
    assert not other_rank.escalates
    too_old = plan(rank_blip(onset=3000), state(rank_incidents=[(400, 1), (600, 1)]), default_policy)
    assert not too_old.escalates
    third = plan(rank_blip(onset=900), state(rank_incidents=[(400, 1), (600, 1)]), default_policy)
    assert third.escalates and "hardware suspect" in (third.escalate_reason or "")
    assert "rank_offenders.count=3" in (third.escalate_reason or "")


# -- point 4: recurrences reopen their incident; attempts are bounded ----------------------------
def test_point4_a_recurrence_reopens_the_nearest_resolved_incident(default_policy: Policy) -> None:
    rec = default_policy.recurrence
    resolved = [Resolved(1, onset_step=257, window_end_step=250), Resolved(2, onset_step=900)]
    hit = reopens(resolved, 251, rec)
    assert hit is not None and hit[0].incident_id == 1 and "attempt 2" in hit[1]
    assert reopens(resolved, 560, rec) is None  # 303 steps from the window end, 340 from 900
    assert reopens(resolved, 251, rec.model_copy(update={"reopen_within_steps": 0})) is None


def test_point4_later_attempts_halve_the_lr_and_the_last_one_escalates(default_policy: Policy) -> None:
    second = plan(lr_bug("divergence"), state(incident_attempt=1, lr=3e-3), default_policy)
    assert second.action("apply").params == {"warmup_steps": 52, "lr_scale": 0.5}  # type: ignore[union-attr]
    third = plan(lr_bug("divergence"), state(incident_attempt=2, lr_scale=0.5), default_policy)
    assert third.action("apply").params["lr_scale"] == 0.25  # type: ignore[union-attr]
    last = plan(lr_bug("divergence"), state(incident_attempt=3), default_policy)
    assert last.escalates and "recurrence.max_attempts=3" in (last.escalate_reason or "")


# -- a plan is re-made when the diagnosis changes class before it acts ---------------------------
def test_replan_before_the_first_irreversible_action(default_policy: Policy) -> None:
    blip = plan(diag("transient", ("data",), onset=252, suspect_samples=["x"]), state(), default_policy)
    bug = plan(lr_bug("slow_recovery"), state(), default_policy)
    why = replan_reason(blip, bug, done=1)
    assert why is not None and "transient -> optimizer_state" in why and "lr_jump" in why
    assert replan_reason(blip, bug, done=2) is None  # the apply ran: carry the plan through
    assert replan_reason(bug, bug, done=0) is None


# -- supervision level and the typed plan --------------------------------------------------------
def test_observe_level_job_recovers_by_restart(default_policy: Policy) -> None:
    p = plan(lr_bug("divergence"), state(supervision="observe"), default_policy)
    assert p.recovery == "restart" and p.supervision == "observe"
    assert (
        "freeze" not in p.action_names and "snapshot" not in p.action_names and "rollback" in p.action_names
    )
    assert plan(lr_bug("divergence"), state(), default_policy).recovery == "in_place"


class Holder(BaseModel):
    plan: Plan


def test_plan_is_a_pydantic_field_and_old_recorded_plans_load(default_policy: Policy) -> None:
    p = plan(lr_bug("divergence"), state(), default_policy)
    again = Holder.model_validate_json(Holder(plan=p).model_dump_json()).plan
    assert again == p and again.action("rollback").args.target_step == 200  # type: ignore[union-attr]
    old = {"policy": "default", "rule": "divergence", "actions": [
        {"name": "observe", "params": {"steps": 100, "pass": {"throughput_min_ratio": 0.8}, "baseline_until_step": 5},
         "reason": "r", "on_failure": "escalate"}]}  # fmt: skip
    loaded = Holder.model_validate({"plan": old}).plan
    obs = loaded.actions[0].args
    assert isinstance(obs, ObserveArgs) and obs.cover_until_step is None and obs.window_steps(10) == 100


def test_policy_sections_validate_with_one_line_errors(tmp_path: Path, default_policy: Policy) -> None:
    assert default_policy.restarts.backoff(1) == 2.0 and default_policy.restarts.backoff(10) == 60.0
    assert default_policy.rank_offenders.count == 3 and default_policy.recurrence.max_attempts == 3
    body = {**one_rule(["alert"]), "restarts": {"backoff_s": 10, "backoff_max_s": 1}}
    with pytest.raises(PolicyError, match="restarts: .*backoff_max_s"):
        load_policy(write_policy(tmp_path, body))
    body = {**one_rule(["alert"]), "recurrence": {"reopen_after": 3}}
    with pytest.raises(PolicyError, match="reopen_after: unknown key"):
        load_policy(write_policy(tmp_path, body))


def test_findings_read_the_detector_sentences() -> None:
    d = lr_bug("slow_recovery", nonfinite=True, rank_local=True, first_rank=0)
    assert list(findings(d)) == ["lr_jump", "update_jump", "nonfinite", "rank_local"]
    assert findings(diag("transient", ("data",))) == {}
    assert Phenotype.SLOW_RECOVERY.value == "slow_recovery"


def test_rewarm_runs_from_the_rollback_target_to_the_onset(default_policy: Policy, tmp_path: Path) -> None:
    unknown = plan(lr_bug("divergence"), state(checkpoints=None), default_policy)
    # onset - max_target_step (251: the LR dates the onset), computed again for the target used
    assert unknown.action("apply").params["warmup_steps"] == 1  # type: ignore[union-attr]
    pol = load_policy(write_policy(tmp_path, one_rule(["alert", {"observe": {"steps": 50}}])))
    inserted = plan(lr_bug("transient"), state(checkpoints=((100, "healthy"),)), pol)
    assert inserted.action("apply").params == {"warmup_steps": 152}  # type: ignore[union-attr]
    assert any("apply inserted after the rollback" in n for n in inserted.notes)
    with pytest.raises(PolicyError, match="warmup_steps: must be >= 1 or `to_onset`"):
        load_policy(write_policy(tmp_path, one_rule([{"apply": {"warmup_steps": 0}}])))

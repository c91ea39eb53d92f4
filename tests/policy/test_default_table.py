"""Table-driven: every phenotype x top cause (and each attribute) against policies/default.yaml.

The expected rule comes from the table; the expected actions come from the YAML file read
independently, so the test checks that the plan is what the policy file says.
"""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.core.model import Cause, Phenotype
from supervisor.core.policy import Policy, plan

from .conftest import diag, state

PHENOTYPES = [p.value for p in Phenotype]
CAUSES = [c.value for c in Cause]


def expected_rule(phenotype: str, cause: str) -> str:
    if cause == "metric_artifact":
        return "metric_artifact"
    if cause == "resume_state":
        return "after_resume"
    if phenotype == "divergence":
        return "divergence"  # no named evidence in these diagnoses: the phenotype decides
    if cause == "distributed":
        return "rank_local"
    return phenotype  # periodic, transient, slow_recovery rules are named after the phenotype


def yaml_actions(default_yaml: dict[str, Any], rule: str) -> list[str]:
    entry = next(r for r in default_yaml["rules"] if r["name"] == rule)
    return [a if isinstance(a, str) else next(k for k in a if k != "on_failure") for a in entry["actions"]]


@pytest.mark.parametrize("cause", CAUSES)
@pytest.mark.parametrize("phenotype", PHENOTYPES)
def test_phenotype_by_cause(
    phenotype: str, cause: str, default_policy: Policy, default_yaml: dict[str, Any]
) -> None:
    p = plan(diag(phenotype, (cause, "data"), suspect_samples=("s:1",)), state(), default_policy)
    rule = expected_rule(phenotype, cause)
    assert p.rule == rule, p.matched_because
    assert p.action_names == yaml_actions(default_yaml, rule)
    assert p.escalate_reason is None
    assert all(a.reason for a in p.actions)


@pytest.mark.parametrize(
    ("attrs", "rule"),
    [
        ({"nonfinite": True, "nonfinite_at": "blocks.3.attn"}, "bad_batch_step"),  # top cause data
        ({"after_resume": True}, "after_resume"),
        ({"rank_local": True, "first_rank": 3}, "rank_local"),
        ({"after_resume": True, "nonfinite": True}, "after_resume"),
    ],
)
def test_attributes_pick_their_rule(
    attrs: dict[str, Any], rule: str, default_policy: Policy, default_yaml: dict[str, Any]
) -> None:
    p = plan(diag("transient", ("data",), **attrs), state(), default_policy)
    assert p.rule == rule
    if rule == "bad_batch_step":  # the same NaN with a numeric top cause is an optimizer-state incident
        assert (
            plan(diag("transient", ("numeric",), **attrs), state(), default_policy).rule == "optimizer_state"
        )
    expected = yaml_actions(default_yaml, rule)
    if attrs.get("nonfinite") and "apply" not in expected:  # a NaN state always gets a fix after the rollback
        expected.insert(expected.index("rollback") + 1, "apply")
    assert p.action_names == expected


def test_divergence_plan_parameters(default_policy: Policy) -> None:
    p = plan(diag("divergence", ("optimizer", "numeric"), onset=340), state(), default_policy)
    rollback, apply, observe = p.action("rollback"), p.action("apply"), p.action("observe")
    assert rollback is not None and apply is not None and observe is not None
    assert rollback.params["margin_steps"] == 100 and rollback.params["max_target_step"] == 240
    assert rollback.params["target_step"] == 200 and rollback.params["require_verified"] is True
    assert "target step 200" in rollback.reason and "margin 100" in rollback.reason
    # Re-warm from the target (200) to the onset (340); lr_scale_on_retry waits for a second attempt.
    assert apply.params == {"warmup_steps": 140}
    assert "from the rollback target 200 to the onset 340" in apply.reason
    assert observe.params["steps"] == 100 and observe.params["baseline_until_step"] == 340
    assert observe.params["cover_until_step"] == 360  # onset + observation.onset_margin_steps
    assert observe.on_failure == "escalate" and p.action_names[-1] == "resume"


def test_transient_quarantines_the_suspect_samples_and_continues(default_policy: Policy) -> None:
    d = diag("transient", ("data",), suspect_samples=["doc:17", "doc:99"], source_local="tests")
    p = plan(d, state(), default_policy)
    apply = p.action("apply")
    assert apply is not None
    assert apply.params["exclude"] == {"samples": ["doc:17", "doc:99"], "sources": ["tests"]}
    assert "rollback" not in p.action_names and "freeze" not in p.action_names


def test_rank_local_replays_on_another_rank(default_policy: Policy) -> None:
    p = plan(diag("transient", ("distributed",), rank_local=True, first_rank=2), state(), default_policy)
    replay = p.action("replay")
    assert replay is not None and replay.params["other_rank"] is True and replay.params["suspect_rank"] == 2
    assert replay.on_failure == "continue"  # not reproduced / not replayable: exclude anyway, never stop


def test_after_resume_checks_completeness(default_policy: Policy) -> None:
    p = plan(diag("slow_recovery", ("resume_state",), onset=305), state(), default_policy)
    rollback = p.action("rollback")
    assert rollback is not None
    assert rollback.params["check_completeness"] is True and rollback.params["target_step"] == 300


def test_periodic_excludes_the_offending_source(default_policy: Policy) -> None:
    p = plan(diag("periodic", ("data",), source_local="code", period=50), state(), default_policy)
    apply = p.action("apply")
    assert apply is not None and apply.params["exclude"]["sources"] == ["code"]


@pytest.mark.parametrize("phenotype", ["divergence", "slow_recovery"])
def test_a_sustained_source_local_rise_rolls_back_and_keeps_the_source_out(
    phenotype: str, default_policy: Policy, default_yaml: dict[str, Any]
) -> None:
    """One source serving bad data: every step since the onset trained on it, so the run goes back
    to the newest healthy checkpoint before the onset (the source's own loss dates it: no margin)
    and re-runs from there without the source."""
    d = diag(phenotype, ("data",), onset=120, source_local="web", suspect_samples=("web:a:0",))
    p = plan(
        d, state(step=127, checkpoints=((80, "healthy"), (100, "healthy"), (120, "healthy"))), default_policy
    )
    assert p.rule == "source_local", p.matched_because
    assert p.action_names == yaml_actions(default_yaml, "source_local")
    rollback, apply = p.action("rollback"), p.action("apply")
    assert rollback is not None and rollback.params["target_step"] == 100  # 120 holds the onset's step
    assert apply is not None and apply.params["exclude"] == {"samples": ["web:a:0"], "sources": ["web"]}
    assert "lr_scale" not in apply.params and "warmup_steps" not in apply.params
    # Rank-local, or with evidence that the weights took a bad step: the other rules decide.
    assert plan(diag(phenotype, ("data",), source_local="web", rank_local=True, first_rank=1), state(),
                default_policy).rule != "source_local"  # fmt: skip
    jump = diag(phenotype, ("optimizer", "data"), source_local="web")
    jump.causes[0].evidence.append("update ratio 9x its level at step 345")
    assert plan(jump, state(), default_policy).rule == "bad_batch_step"  # rolls back, then keeps it out


def test_a_bad_batch_confined_to_one_source_excludes_the_source(default_policy: Policy) -> None:
    d = diag("transient", ("data",), source_local="web", nonfinite=True)
    p = plan(d, state(), default_policy)
    apply = p.action("apply")
    assert p.rule == "bad_batch_step" and apply is not None
    assert apply.params["exclude"]["sources"] == ["web"]


def test_an_exclusion_of_nothing_is_not_a_fix(default_policy: Policy) -> None:
    """Issue 13: a fix that changes nothing is never chosen. A transient with no suspect sample named
    and no source confined: the quarantine resolves to nothing, so no apply, and the plan says why."""
    p = plan(diag("transient", ("data",)), state(), default_policy)
    assert p.action_names == ["alert", "observe"]
    assert any(
        "apply dropped: it would change nothing" in n and "no samples (none named)" in n for n in p.notes
    )


def test_a_source_local_update_jump_rolls_back_and_keeps_the_source_out(default_policy: Policy) -> None:
    """Reproduces the matrix's bad_source cell (2026-11-30, gru/adamw): `web` served random bytes
    from step 120; the diagnosis read "slow recovery, confined to source web, top cause optimizer
    (update ratio jump)", rule optimizer_state rolled back and re-warmed, the bad source came back at
    120 on the new timeline and the incident escalated. The data did it: roll back and exclude it."""
    d = diag(
        "slow_recovery", ("optimizer", "data"), onset=120, source_local="web", suspect_samples=("web:p:0",)
    )
    d.causes[0].evidence.append("update ratio 2.5x its level at step 128")
    p = plan(d, state(step=131, checkpoints=((80, "healthy"), (100, "healthy"))), default_policy)
    assert p.rule == "bad_batch_step", p.matched_because
    rollback, apply = p.action("rollback"), p.action("apply")
    assert rollback is not None and rollback.params["target_step"] == 100
    assert apply is not None and apply.params["exclude"]["sources"] == ["web"]
    assert "lr_scale" not in apply.params and "warmup_steps" not in apply.params


def test_a_low_transient_is_a_note_the_policy_does_not_act_on(default_policy: Policy) -> None:
    """Issue 19: `medium` and above mean the policy acts; a low blip back in band at once is a
    note in the record (the alert's log line, no page) and training is not touched."""
    from supervisor.core.model import Severity

    low = plan(
        diag("transient", ("data",), severity=Severity.LOW, suspect_samples=("s:1",)), state(), default_policy
    )
    assert low.rule == "note" and low.action_names == ["alert"]
    alert = low.action("alert")
    assert alert is not None and alert.params.get("page", True) is False
    medium = plan(
        diag("transient", ("data",), severity=Severity.MEDIUM, suspect_samples=("s:1",)),
        state(),
        default_policy,
    )
    assert medium.rule == "transient" and "apply" in medium.action_names

"""Detector -> policy, end to end: each phenotype the detector produces from a trace gets the plan
docs/policies.md describes (the docs, policies/default.yaml and the behaviour agree)."""

from __future__ import annotations

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.policy import Policy, plan
from supervisor.traces.synthetic import set_loss, synthetic_records

from .conftest import state


def _one_rank_nan(skipped: bool):
    a = StreamingAnalyzer()
    for step, batch in group_steps(synthetic_records(360, 2, seed=3)):
        if step == 330:
            for r in batch:
                r.grad_norm = float("nan")  # all-reduced: NaN on every rank
                r.nonfinite = True
                if skipped:
                    r.events = ["step_skipped_nonfinite"]
            set_loss(batch[1], float("nan"))
        a.observe_step(step, batch)
    return a.finish().incidents[0]


def test_one_rank_nan_is_a_bad_batch_step_on_that_rank(default_policy: Policy) -> None:
    """docs/policies.md: a one-rank non-finite step -> roll back >= 20 steps before it, exclude
    that batch, LR untouched (issue 24 point 3: it was planned as an optimizer fault on rank 0)."""
    d = _one_rank_nan(skipped=False)
    assert (d.first_rank, d.rank_local) == (1, True)
    p = plan(d, state(step=340), default_policy)
    assert p.rule == "bad_batch_step", p.matched_because
    names = p.action_names
    assert "rollback" in names
    rb = next(a for a in p.actions if a.name == "rollback").params
    assert rb["margin_steps"] >= 20 and d.onset_step - rb["target_step"] >= 20
    applies = [a.params for a in p.actions if a.name == "apply"]
    assert applies and all("warmup_steps" not in x and "lr_scale" not in x for x in applies)
    excluded = [s for x in applies for s in x["exclude"].get("samples", [])]
    assert excluded and all("r1" in s for s in excluded)  # rank 1's batch, not rank 0's


def test_a_skipped_one_rank_nan_excludes_that_batch_and_goes_on(default_policy: Policy) -> None:
    """Issue 24 point 3: the SDK had skipped the non-finite step, so no weights changed: exclude
    rank 1's batch and go on; no rollback, no re-warm, the LR left alone."""
    d = _one_rank_nan(skipped=True)
    assert (d.first_rank, d.rank_local, d.phenotype.value) == (1, True, "transient")
    p = plan(
        d, state(step=340, state_maybe_nonfinite=d.nonfinite), default_policy
    )  # as the runtime builds it
    assert p.rule == "skipped_nonfinite", p.matched_because
    assert "rollback" not in p.action_names and "freeze" not in p.action_names
    (apply,) = [a.params for a in p.actions if a.name == "apply"]
    assert "warmup_steps" not in apply and "lr_scale" not in apply
    assert apply["exclude"]["samples"] and all("r1" in s for s in apply["exclude"]["samples"])


def test_a_nan_that_keeps_coming_is_rolled_back_even_when_each_step_was_skipped(
    default_policy: Policy,
) -> None:
    a = StreamingAnalyzer()
    for step, batch in group_steps(synthetic_records(360, 2, seed=3)):
        if step >= 330:
            for r in batch:
                r.grad_norm = float("nan")
                r.nonfinite = True
                r.events = ["step_skipped_nonfinite"]
                set_loss(r, float("nan"))
        a.observe_step(step, batch)
    d = a.finish().incidents[0]
    p = plan(d, state(step=359, state_maybe_nonfinite=True), default_policy)
    assert "rollback" in p.action_names, (p.rule, p.action_names)

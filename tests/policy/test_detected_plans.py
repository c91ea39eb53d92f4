"""Detector -> policy, end to end: each phenotype the detector produces from a trace gets the plan
docs/policies.md describes (the docs, policies/default.yaml and the behaviour agree)."""

from __future__ import annotations

import pytest

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


def _nan_in_one_ranks_forward(rank: int, ranks: int, onset: int, steps: int):
    """Rank ``rank``'s forward went non-finite at ``onset``; the all-reduce carried it into every
    rank's grad norm, and the SDK skipped the step everywhere (as in the sampler's `nan_rank`).
    Returns the diagnosis the runtime plans from (the first ``ready`` update) and the last one."""
    a = StreamingAnalyzer()
    ready = None
    for step, batch in group_steps(synthetic_records(steps, ranks, seed=5)):
        if step == onset:
            for r in batch:
                r.grad_norm = float("nan")
                r.nonfinite, r.nonfinite_at = True, "unknown"
                r.update_norm = 0.0
                r.events = ["step_skipped_nonfinite"]
            batch[rank].nonfinite_at = "forward:blocks.0.fc2"
            set_loss(batch[rank], float("nan"))
        for u in a.observe_step(step, batch):
            if u.kind == "ready" and ready is None:
                ready = u.diagnosis
    return ready, a.finish().incidents[0]


@pytest.mark.parametrize(("rank", "ranks"), [(0, 2), (1, 2), (2, 3)])
def test_the_rank_named_is_the_one_whose_forward_went_non_finite_first(
    default_policy: Policy, rank: int, ranks: int
) -> None:
    """Issue 24 point 3: every rank is non-finite after the all-reduce; the one named is the rank
    whose own loss went first, whatever its number, and the batch excluded is that rank's."""
    ready, last = _nan_in_one_ranks_forward(rank, ranks, onset=300, steps=330)
    for d in (ready, last):
        assert d is not None and (d.rank_local, d.first_rank) == (True, rank), d
        p = plan(d, state(step=d.detected_step or 300, state_maybe_nonfinite=True), default_policy)
        assert not p.escalates, p.escalate_reason
        apply = p.action("apply")
        assert apply is not None
        excluded = apply.params["exclude"]["samples"]
        assert excluded and all(s.endswith(tuple(f"r{rank}i{i}" for i in range(2))) for s in excluded)
    assert p.rule == "skipped_nonfinite" and "rollback" not in p.action_names, p.matched_because


def test_a_one_rank_nan_before_the_first_checkpoint_goes_on_without_escalating(
    default_policy: Policy,
) -> None:
    """Sampler cell 558570:470549: NaN on rank 0 at step 10, no checkpoint yet. Planned from what
    the detector says at once or later, the run is never stopped for the lack of a rollback target."""
    ready, last = _nan_in_one_ranks_forward(0, 2, onset=10, steps=40)
    for d in (ready, last):
        assert d is not None and d.first_rank == 0
        p = plan(
            d, state(step=d.detected_step or 10, checkpoints=(), state_maybe_nonfinite=True), default_policy
        )
        assert not p.escalates and "rollback" not in p.action_names, (p.rule, p.escalate_reason)
        assert p.action("apply") is not None and "observe" in p.action_names


@pytest.mark.parametrize(("rank", "ranks"), [(1, 2), (2, 3)])
def test_the_first_plan_of_a_skipped_one_rank_nan_is_skipped_nonfinite(
    default_policy: Policy, rank: int, ranks: int
) -> None:
    """The record of the non-finite step already says the SDK skipped it (no weights changed): the
    plan made from the first diagnosis, at the step itself, excludes the batch and goes on. It was
    `bad_batch_step` (a rollback) until a later finite step arrived and the incident was re-planned."""
    ready, _ = _nan_in_one_ranks_forward(rank, ranks, onset=300, steps=330)
    assert ready is not None and ready.detected_step == 300
    p = plan(ready, state(step=300, state_maybe_nonfinite=True), default_policy)
    assert p.rule == "skipped_nonfinite", p.matched_because
    assert "rollback" not in p.action_names and "freeze" not in p.action_names

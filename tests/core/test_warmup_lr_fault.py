"""An LR fault in a run's first steps whose loss has not left its band yet is no transient while
the LR stays where it jumped (sampler cell ``581022:509645``: Lion, LR x20 from step 6 of a 15-step
warm-up). Lion's update is ``lr * sign(.)``: under an LR that jumped the loss falls *faster* for a
while, so every step stayed in the loss band and the incident read "transient"; a transient goes
on without the rollback no checkpoint allows yet, and the LR stayed x20 for the rest of the run
(1.063x clean). The LR is the first abnormal quantity and it is still raised: the cause is in
place, so the run's start is the rollback target, as for any fault before the first checkpoint.
A one-step LR glitch that came back, and an update-only incident, stay transients."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.analysis import StreamingAnalyzer, group_steps, trace_order
from supervisor.core.model import Diagnosis, Phenotype
from supervisor.core.policy import load_policy, plan
from supervisor.core.records import Record
from supervisor.traces import read_trace
from tests.policy.conftest import state

DATA = Path(__file__).resolve().parent / "data"


def first_ready(records: list[Record]) -> Diagnosis:
    """The diagnosis the first plan is made from: the incident's at its first ``ready`` update."""
    a = StreamingAnalyzer()
    for step, rs in group_steps(trace_order(records)):
        for u in a.observe_step(step, rs):
            if u.kind == "ready":
                return u.diagnosis
    raise AssertionError("no incident became ready")


def lion_warmup(lrs: dict[int, float] | None = None, steps: int = 14) -> list[Record]:
    """Lion in a linear warm-up (its update ratio is 10x the LR), the loss falling steadily."""
    out = []
    for step in range(1, steps + 1):
        lr = (lrs or {}).get(step, 2e-4 * step)
        for rank in range(2):
            loss = 5.57 - 0.03 * step + 0.004 * ((step + rank) % 3)
            out.append(
                Record(
                    step=step,
                    rank=rank,
                    loss=loss,
                    lr=lr,
                    grad_norm=0.9,
                    param_norm=10.0,
                    update_norm=100.0 * lr,
                )
            )
    return out


def test_an_lr_that_jumped_and_stays_raised_in_the_warm_up_rolls_back_to_the_run_start() -> None:
    recs = read_trace(DATA / "sampler_lr_jump_warmup_lion.jsonl.gz").records
    d = first_ready(recs)
    assert d.onset_step == 6 and d.first_anomaly is not None and d.first_anomaly.metric == "lr"
    assert d.phenotype is not Phenotype.TRANSIENT, d.to_json()
    p = plan(d, state(step=9, checkpoints=(), checkpoint_every=20), load_policy("default"))
    rb = p.action("rollback")
    assert not p.escalates and rb is not None and rb.params["to_start"] is True, (p.action_names, p.notes)


def test_the_same_jump_held_by_synthetic_records_is_no_transient() -> None:
    raised = {s: 20 * 2e-4 * s for s in range(6, 15)}
    d = first_ready(lion_warmup(raised))
    assert d.first_anomaly is not None and d.first_anomaly.metric == "lr"
    assert d.phenotype is not Phenotype.TRANSIENT, d.to_json()


def test_an_lr_glitch_that_came_back_is_a_transient() -> None:
    """One step at x20, the schedule's LR again at the next: by then the incident is a transient."""
    a = StreamingAnalyzer()
    last: Diagnosis | None = None
    for step, rs in group_steps(trace_order(lion_warmup({6: 20 * 2e-4 * 6}))):
        for u in a.observe_step(step, rs):
            last = u.diagnosis
    assert last is not None and last.onset_step == 6
    assert last.phenotype is Phenotype.TRANSIENT, last.to_json()


def test_a_warm_up_alone_opens_nothing() -> None:
    a = StreamingAnalyzer()
    for step, rs in group_steps(trace_order(lion_warmup(steps=30))):
        assert not a.observe_step(step, rs), step


def test_a_persistent_lr_bug_says_the_rollback_did_not_cure_it() -> None:
    """Sampler cell ``364272:679444``: the script's own LR is x20 from step 6 in every timeline. After
    the rollback to the run's start and the re-warm over the 6 steps to the onset, the ranks report
    the LR x20 again, the supervisor's factor divided out: the incident it opens says so."""
    raised = {s: 20 * 2e-4 * s for s in range(6, 15)}
    a = StreamingAnalyzer()
    for step, rs in group_steps(trace_order(lion_warmup(raised, steps=9))):
        a.observe_step(step, rs)
    a.notify_rollback(-1, from_step=9, observe_steps=100)  # the run's start: no step completed
    a.note_overrides(-1, warmup_steps=7)
    ready: list[Diagnosis] = []
    for step, rs in group_steps(trace_order(lion_warmup(raised, steps=9))):
        for r in rs:  # the ranks apply the re-warm to the LR they report, and their update follows
            k = min(1.0, (step + 1) / 7)
            r.lr = (r.lr or 0.0) * k
            r.update_norm = (r.update_norm or 0.0) * k
        ready += [u.diagnosis for u in a.observe_step(step, rs) if u.kind == "ready"]
    assert [d.onset_step for d in ready] == [6], [d.to_json() for d in ready]
    top = ready[0].causes[0]
    assert top.cause.value == "optimizer"
    text = top.evidence[0]
    assert "again after the rollback to the run's start" in text and "24x" in text, top.evidence  # vs step 5
    assert "does not cure it" in text, text


def test_a_persistent_lr_bug_escalates_saying_why() -> None:
    """Once the windows have failed as often as the policy allows, the escalation itself names the
    cause the user has to fix, not only the count of failed windows."""
    raised = {s: 20 * 2e-4 * s for s in range(6, 15)}
    a = StreamingAnalyzer()
    for step, rs in group_steps(trace_order(lion_warmup(raised, steps=9))):
        a.observe_step(step, rs)
    a.notify_rollback(-1, from_step=9, observe_steps=100)
    a.note_overrides(-1, warmup_steps=7)
    ready: list[Diagnosis] = []
    for step, rs in group_steps(trace_order(lion_warmup(raised, steps=9))):
        for r in rs:
            k = min(1.0, (step + 1) / 7)
            r.lr = (r.lr or 0.0) * k
            r.update_norm = (r.update_norm or 0.0) * k
        ready += [u.diagnosis for u in a.observe_step(step, rs) if u.kind == "ready"]
    p = plan(ready[0], state(step=9, checkpoints=(), observation_failures=2), load_policy("default"))
    assert p.escalates, p
    why = p.escalate_reason or ""
    assert "max_observation_failures=2" in why and "top cause optimizer" in why, why
    assert "does not cure it" in why, why

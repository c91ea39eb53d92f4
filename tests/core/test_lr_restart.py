"""A schedule that sends the LR back up to where the run has trained before (SGDR's warm restarts,
a cyclic schedule) moves the update ratio with it: the optimizer did what the recipe asked, and
that alone is no incident. An LR far above every LR the run used stays a fault, and a restart that
breaks the loss is still an incident."""

from __future__ import annotations

import copy
import math

import pytest

from supervisor.core.analysis import StreamingAnalyzer, analyze_records, group_steps
from supervisor.core.model import Cause
from supervisor.traces.synthetic import at, set_loss, synthetic_records

STEPS, WARMUP = 400, 20


def _sgdr(step: int, cycle: int, floor: float = 0.1, peak: float = 1.0) -> float:
    """The synthetic trace's warm-up, then cosine cycles of ``cycle`` steps from ``peak`` to ``floor``."""
    if step <= WARMUP:
        return step / WARMUP
    progress = ((step - WARMUP - 1) % cycle) / cycle
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def _schedule(records, factor) -> None:  # type: ignore[no-untyped-def]
    """Replace the trace's LR by 1e-3 x ``factor(step)``; the update follows the LR, as every
    optimizer's does (its noise kept)."""
    for r in records:
        new = 1e-3 * factor(r.step)
        if r.lr and r.update_norm is not None:
            r.update_norm *= new / r.lr
        r.lr = new


@pytest.mark.parametrize(("cycle", "peak"), [(120, 1.0), (90, 1.0), (120, 0.6)])
@pytest.mark.parametrize("seed", [1, 2])
def test_warm_restarts_back_to_a_level_the_run_used_are_no_incident(
    cycle: int, peak: float, seed: int
) -> None:
    recs = synthetic_records(STEPS, 4, seed=seed)
    # After the first cycle every restart goes back to ``peak`` x the first one's (some recipes decay it).
    _schedule(recs, lambda s: _sgdr(s, cycle, peak=1.0 if s <= WARMUP + cycle else peak))
    found = analyze_records(recs).incidents
    assert found == [], [d.to_json() for d in found]


def test_an_lr_jump_above_every_lr_the_run_used_is_still_an_optimizer_fault() -> None:
    recs = synthetic_records(STEPS, 4, seed=3)
    _schedule(recs, lambda s: _sgdr(s, 120) * (20.0 if s >= 300 else 1.0))  # x20 of the cycle's LR at 300
    found = analyze_records(recs).incidents
    assert found and found[0].onset_step == 300, [d.to_json() for d in found]
    assert found[0].top_cause is Cause.OPTIMIZER


def test_a_restart_that_breaks_the_loss_is_an_incident() -> None:
    recs = synthetic_records(STEPS, 4, seed=4)
    _schedule(recs, lambda s: _sgdr(s, 120))
    restart = WARMUP + 2 * 120 + 1
    for step in range(restart + 1, restart + 12):  # the loss climbs far out and the gradients with it
        for r in at(recs, step):
            set_loss(r, r.loss * (1.0 + 0.25 * (step - restart)))
            r.grad_norm = (r.grad_norm or 1.0) * (1.0 + step - restart)
    found = analyze_records(recs).incidents
    assert [d.onset_step for d in found if d.onset_step >= restart], [d.to_json() for d in found]


def test_a_warm_restart_inside_the_window_of_an_lr_fix_is_not_the_fault_back() -> None:
    """An LR x20 caught and rolled back, the fix a re-warm; the schedule's own restart then falls
    inside the observation window. The restart goes back to the run's peak, not x20 above the LR
    before the fault: the fault is not back."""
    onset, target, warm = 250, 230, 20
    recs = synthetic_records(STEPS, 4, seed=5)
    _schedule(recs, lambda s: _sgdr(s, 120))
    steps = list(group_steps(recs))
    a = StreamingAnalyzer()
    for step, batch in steps:
        if step > onset + 6:
            break
        if step >= onset:
            batch = [copy.copy(r) for r in batch]  # the re-run below trains without the fault
            for r in batch:
                r.lr, r.update_norm = r.lr * 20, r.update_norm * 20
                set_loss(r, r.loss * 1.8)
        a.observe_step(step, batch)
    assert a.incidents and a.incidents[0].onset_step == onset, [i.onset_step for i in a.incidents]
    a.notify_rollback(target, reason="fix of incident 1")
    a.note_overrides(target, warmup_steps=warm, reason="fix of incident 1")
    opened = []
    for step, batch in steps:  # the re-run: the fault gone, the re-warm's factor in the logged LR
        if step <= target:
            continue
        mult = min(1.0, (step - target) / warm)
        for r in batch:
            r.lr, r.update_norm = r.lr * mult, r.update_norm * mult
        opened += [u.diagnosis.onset_step for u in a.observe_step(step, batch) if u.kind == "opened"]
    assert a.observing(WARMUP + 2 * 120 + 1)  # the premise: the restart falls inside the window
    assert opened == [], opened


def test_an_lr_stepped_down_by_its_schedule_is_no_cause_of_a_spike_on_one_rank() -> None:
    """A garbage batch on one rank at the step a step-decay schedule cuts the LR x0.1: the data."""
    milestone = 300
    recs = synthetic_records(STEPS, 4, seed=6)
    _schedule(recs, lambda s: min(1.0, s / WARMUP) * (0.1 if s >= milestone else 1.0))
    for r in at(recs, milestone, rank=2):
        set_loss(r, r.loss * 3.0)
    found = analyze_records(recs).incidents
    assert [d.onset_step for d in found] == [milestone], [d.to_json() for d in found]
    assert found[0].top_cause is Cause.DATA, found[0].to_json()
    assert not any(e.startswith("learning rate") for c in found[0].causes for e in c.evidence), found[
        0
    ].to_json()

"""A schedule that sends the LR back up to where the run has trained before (SGDR's warm restarts,
a cyclic schedule) moves the update ratio with it: the optimizer did what the recipe asked, and
that alone is no incident. An LR far above every LR the run used stays a fault, and a restart that
breaks the loss is still an incident."""

from __future__ import annotations

import math

import pytest

from supervisor.core.analysis import analyze_records
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

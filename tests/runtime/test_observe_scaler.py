"""An fp16 run's loss scaler skipping a step is the fp16 loop working, not a non-finite window.

Sampler cell ``963168:718765`` (mlp, Lion, fp16 with a GradScaler, 4 ranks, LR x30 at step 74):
rolled back 82 -> 40 and re-warmed, the window's loss fell (median 3.02 against a limit of 4.07),
the fault did not come back, and the window failed on "non-finite at steps [65, 75, 76]": steps
whose scaled gradients overflowed (grad norm inf, loss finite, the scale halved at each), as they
do in the clean run. Twice, then escalated. A step the scaler skipped changed no weight; a loss
that went non-finite, or a scaler that skips much of the window (no training), still fails.
"""

from __future__ import annotations

import math

from supervisor.core.records import Record
from supervisor.runtime.observe import StepStats, aggregate, baseline, evaluate


def rec(step: int, rank: int, loss: float = 3.0, *, overflow: bool = False) -> Record:
    return Record(
        step=step,
        rank=rank,
        loss=loss,
        grad_norm=math.inf if overflow else 2.0,
        update_norm=0.0 if overflow else 0.5,
        param_norm=50.0,
        lr=3e-3,
        loss_scale=16384.0,
        overflow=overflow,
        tokens_per_s=1e3,
    )


def window(skipped: set[int], bad_loss: frozenset[int] = frozenset()) -> list[StepStats]:
    out = []
    for step in range(41, 141):
        loss = math.nan if step in bad_loss else 3.0
        out.append(aggregate(step, [rec(step, r, loss, overflow=step in skipped) for r in range(4)]))
    return out


def finite_check(win: list[StepStats]) -> tuple[bool, str]:
    base = baseline(window(set())[:30])
    assert base is not None
    check = next(c for c in evaluate(base, win, {}) if c.name == "finite")
    return check.passed, check.detail


def test_steps_the_loss_scaler_skipped_do_not_fail_the_window() -> None:
    passed, detail = finite_check(window({65, 75, 76}))
    assert passed, detail
    assert "loss scaler" in detail and "3" in detail, detail


def test_a_non_finite_loss_still_fails_the_window() -> None:
    passed, detail = finite_check(window({65}, bad_loss=frozenset({80})))
    assert not passed and "80" in detail, detail


def test_a_scaler_that_skips_much_of_the_window_fails_it() -> None:
    passed, detail = finite_check(window(set(range(41, 141, 3))))
    assert not passed and "loss scaler" in detail, detail


def test_a_skipped_step_is_no_part_of_the_baseline() -> None:
    hist = window({45, 46, 47})[:30]
    base = baseline(hist)
    assert (
        base is not None
        and base.steps == 27
        and base.update_ratio is not None
        and abs(base.update_ratio - 0.01) < 1e-9
    ), base

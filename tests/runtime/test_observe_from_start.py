"""The observation window after a rollback to the run's start re-trains the model from its
initialization: its grad norm moves with training, not with the health of the optimizer, so it is
not bounded by a baseline taken late in the run. Sampler cell ``28:46`` (gpt2, Lion, constant LR, a
checkpoint every 50 steps, an LR x30 at step 60): started over with the LR re-warmed over 60 steps,
the fault gone and the loss in bounds, the window failed on its grad norm alone (2.16x, then 2.45x
with the LR halved) and the job escalated."""

from __future__ import annotations

from supervisor.runtime.observe import Baseline, Check, StepStats, evaluate

PER_LR = 0.01 / 3e-3
BASE = Baseline(steps=50, loss_median=3.2, loss_mad=0.05, grad_norm=1.0, update_ratio=0.01,
                tokens_per_s=1000.0, lr=3e-3, update_per_lr=PER_LR, ranks=3.0)  # fmt: skip


def _window(first: int) -> list[StepStats]:
    """100 steps from ``first``: the LR re-warmed up to the baseline's, the loss in bounds, the grad
    norm 2.2x the baseline's, the update per unit of LR the baseline's."""
    out = []
    for i, step in enumerate(range(first, first + 100)):
        lr = 3e-3 * min(1.0, (i + 1) / 60)
        out.append(StepStats(step=step, loss=3.1, grad_norm=2.2, update_ratio=lr * PER_LR, tokens_per_s=1000.0,
                             lr=lr, ranks=3))  # fmt: skip
    return out


def _grad(checks: list[Check]) -> Check:
    return next(c for c in checks if c.name == "grad_norm")


def test_a_window_from_the_run_start_does_not_bound_the_grad_norm() -> None:
    check = _grad(evaluate(BASE, _window(2), {}, from_start=True))
    assert check.passed and "not judged" in check.detail
    assert all(c.passed for c in evaluate(BASE, _window(2), {"throughput": False}, from_start=True))


def test_a_window_after_a_checkpoint_still_bounds_it() -> None:
    assert not _grad(evaluate(BASE, _window(51), {})).passed

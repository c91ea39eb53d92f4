"""The observation window's update-ratio check allows for the LR the schedule moved since the
baseline: every optimizer's update follows the LR (Lion's is ``lr * sign(.)``, SGD's ``lr * buf``,
Adam's about ``lr * m / sqrt(v)``), so a baseline taken in a warm-up, at a fraction of the LR the
window runs, is compared per unit of LR (sampler cell ``581022:509645``: Lion, LR x20 at step 6,
started over from the run's start; the windows after it failed at 2.07x and 3.54x a baseline of
steps 1-5, whose LR was 1/15-5/15 of the peak, and re-warmed the second time, and escalated). An
update larger per unit of LR (a lost or broken optimizer state) still fails, and under an LR the
supervisor lowered (where Adam's update per unit of LR grows) the update is judged as it is."""

from __future__ import annotations

from supervisor.runtime.observe import Baseline, StepStats, baseline, evaluate


def stats(step: int, lr: float, per_lr: float) -> StepStats:
    return StepStats(step=step, loss=3.0, grad_norm=1.0, update_ratio=per_lr * lr, tokens_per_s=1e3, lr=lr)


def warm_up_baseline() -> Baseline:
    base = baseline([stats(s, 2e-4 * s, 10.0) for s in range(1, 6)])  # steps 1-5 of a 15-step warm-up
    assert base is not None and base.lr is not None
    return base


def update_check(base: Baseline, window: list[StepStats]) -> tuple[bool, str]:
    check = next(c for c in evaluate(base, window, {"update_ratio_max": 2.0}) if c.name == "update_ratio")
    return check.passed, check.detail


def test_a_window_at_the_scheduled_peak_lr_passes_against_a_warm_up_baseline() -> None:
    window = [stats(s, 3e-3 * (15 / s) ** 0.5, 9.0) for s in range(15, 115)]  # inv_sqrt decay
    passed, detail = update_check(warm_up_baseline(), window)
    assert passed and "per unit of LR" in detail, detail


def test_an_update_larger_per_unit_of_lr_still_fails() -> None:
    window = [stats(s, 3e-3, 35.0) for s in range(15, 115)]
    passed, detail = update_check(warm_up_baseline(), window)
    assert not passed, detail


def test_under_a_lowered_lr_the_update_is_judged_as_it_is() -> None:
    """Half the LR, Adam's update per unit of LR up 2.5x: the weights move 1.25x the baseline's."""
    base = baseline([stats(s, 3e-3, 1.0) for s in range(40, 80)])
    assert base is not None
    passed, detail = update_check(base, [stats(s, 1.5e-3, 2.5) for s in range(80, 180)])
    assert passed and "per unit of LR" not in detail, detail


def test_a_baseline_stored_without_its_lr_is_judged_as_before() -> None:
    old = warm_up_baseline().to_json()
    for key in ("lr", "update_per_lr"):
        old.pop(key)
    passed, _ = update_check(Baseline.from_json(old), [stats(s, 3e-3, 9.0) for s in range(15, 115)])
    assert not passed  # 9 x 3e-3 against 10 x 6e-4: the raw ratio, 4.5x

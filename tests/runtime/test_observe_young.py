"""An observation window after a fault in a run's first steps (fewer than 5 finite steps before the
onset: no baseline) is judged on what needs none -- finite values, the loss not rising over the
window, the fault not back, no new anomaly -- instead of failing with "no baseline" every time (a
one-rank NaN at step 4, planned skipped_nonfinite, failed two such windows and escalated)."""

from __future__ import annotations

import math
from typing import Any

from supervisor.runtime.actions.fix import ObserveAction
from supervisor.runtime.observe import StepStats, evaluate_young


def stats(step: int, loss: float) -> StepStats:
    return StepStats(step=step, loss=loss, grad_norm=1.0, update_ratio=1e-3, tokens_per_s=1000.0)


def falling(first: int, n: int) -> list[StepStats]:
    return [stats(first + i, 5.5 * math.exp(-0.02 * i) + 0.01 * (i % 3)) for i in range(n)]


def test_a_young_window_whose_loss_falls_passes_and_says_what_was_not_judged() -> None:
    checks = {c.name: c for c in evaluate_young(falling(10, 50), history_steps=3)}
    assert all(c.passed for c in checks.values()), checks
    assert "no baseline" in checks["grad_norm"].detail and checks["loss"].value is not None


def test_a_young_window_whose_loss_rises_or_goes_non_finite_fails() -> None:
    rising = [stats(10 + i, 3.0 + 0.02 * i) for i in range(50)]
    assert not {c.name: c for c in evaluate_young(rising, 3)}["loss"].passed
    nan = falling(10, 50)
    nan[20] = stats(30, math.nan)
    assert not {c.name: c for c in evaluate_young(nan, 3)}["finite"].passed


class YoungRun:
    """The part of the executors' Runtime an observe action reads, for a run with no baseline."""

    def __init__(self, window: list[StepStats], recurrences: int = 0) -> None:
        self.window, self.recurrences = window, recurrences
        self.current_step = window[-1].step

    def window_after(self, step: int) -> list[StepStats]:
        return [w for w in self.window if w.step > step]

    def recurrences_since(self, step: int) -> list[dict[str, Any]]:
        return [{"onset_step": 40, "severity": "medium"}] * self.recurrences

    def incidents_opened_since(self, step: int) -> int:
        return 0

    def baseline(self) -> None:
        return None

    def training_ended(self) -> bool:
        return False

    stop_requested = None
    policy = None  # the observation section's built-in defaults


def test_the_observe_action_judges_a_young_window_instead_of_failing_it() -> None:
    memo = {"from_step": 9, "steps": 50, "onset_step": 4}
    done = ObserveAction().poll(YoungRun(falling(10, 50)), {}, memo)  # type: ignore[arg-type]
    assert done is not None and done.ok and not done.skipped, done
    back = ObserveAction().poll(YoungRun(falling(10, 50), recurrences=1), {}, memo)  # type: ignore[arg-type]
    assert back is not None and not back.ok and "recurrence" in back.reason, back

"""Step aggregates, baselines and the observation-window verdict."""

from __future__ import annotations

import math

from supervisor.core.records import Record
from supervisor.runtime.observe import StepStats, aggregate, baseline, evaluate


def stats(step: int, loss: float, grad: float = 1.0, ratio: float = 1e-3, tps: float = 1000.0) -> StepStats:
    return StepStats(step=step, loss=loss, grad_norm=grad, update_ratio=ratio, tokens_per_s=tps)


def test_aggregate_is_token_weighted_when_every_rank_reports_sums() -> None:
    recs = [
        Record(step=3, loss=2.0, rank=0, loss_sum=20.0, tokens=10),
        Record(step=3, loss=4.0, rank=1, loss_sum=120.0, tokens=30),
    ]
    s = aggregate(3, recs)
    assert s.loss == 140.0 / 40 and s.ranks == 2


def test_aggregate_flags_nonfinite() -> None:
    s = aggregate(1, [Record(step=1, loss=math.nan), Record(step=1, loss=1.0, rank=1)])
    assert s.nonfinite


def test_window_like_the_baseline_passes() -> None:
    base = baseline([stats(i, 3.0 + 0.01 * (i % 5)) for i in range(50)])
    assert base is not None
    checks = evaluate(base, [stats(100 + i, 3.0 + 0.01 * (i % 5)) for i in range(50)], {})
    assert all(c.passed for c in checks), checks


def test_loss_above_the_band_fails_and_lower_loss_passes() -> None:
    base = baseline([stats(i, 3.0 + 0.01 * (i % 5)) for i in range(50)])
    assert base is not None
    high = evaluate(base, [stats(i, 3.5) for i in range(50)], {"loss_within_mads": 3.0})
    low = evaluate(base, [stats(i, 2.5) for i in range(50)], {"loss_within_mads": 3.0})
    assert not next(c for c in high if c.name == "loss").passed
    assert next(c for c in low if c.name == "loss").passed


def test_grad_norm_and_throughput_ratios() -> None:
    base = baseline([stats(i, 3.0) for i in range(20)])
    assert base is not None
    checks = {c.name: c for c in evaluate(base, [stats(i, 3.0, grad=5.0, tps=100.0) for i in range(20)], {})}
    assert not checks["grad_norm"].passed and not checks["throughput"].passed
    assert checks["update_ratio"].passed


def test_a_window_on_fewer_ranks_allows_the_grad_norm_the_smaller_batch_explains() -> None:
    """A group restarted on 2 of its 4 ranks averages its gradient over half the batch: its noise, and
    so the grad norm, may rise by up to sqrt(4 / 2). The bound widens by that and no more; the same
    rise at the baseline's rank count still fails, as does a rise beyond what the batch explains."""

    def at(ranks: int, grad: float) -> list[StepStats]:
        return [StepStats(step=i, loss=3.0, grad_norm=grad, update_ratio=1e-3, tokens_per_s=1e3, ranks=ranks)
                for i in range(40)]  # fmt: skip

    base = baseline(at(4, 1.0))
    assert base is not None and base.ranks == 4

    def grad(window: list[StepStats]) -> object:
        return next(c for c in evaluate(base, window, {}) if c.name == "grad_norm")

    fewer = grad(at(2, 2.6))
    assert (
        fewer.passed and fewer.limit == math.sqrt(2) * 2.0 and "2 of the baseline's 4 ranks" in fewer.detail
    )
    assert not grad(at(4, 2.6)).passed  # the same rise on as many ranks: not the batch
    assert not grad(at(2, 3.0)).passed  # beyond what half the batch explains
    assert grad(at(8, 1.9)).limit == 2.0  # more ranks: a smaller noise, the bound unchanged


def test_throughput_is_judged_on_sustained_speed_not_on_steps_slowed_by_a_neighbour() -> None:
    base = baseline([stats(i, 3.0, tps=1000.0 + i) for i in range(40)])
    assert base is not None
    # Half the window shares the host with another job: those steps run at 60%.
    shared = [stats(i, 3.0, tps=600.0 if i % 2 else 1000.0 + i) for i in range(40)]
    assert next(c for c in evaluate(base, shared, {}) if c.name == "throughput").passed
    # A real regression slows every step.
    slower = [stats(i, 3.0, tps=0.6 * (1000.0 + i)) for i in range(40)]
    check = next(c for c in evaluate(base, slower, {}) if c.name == "throughput")
    assert not check.passed and check.value is not None and abs(check.value - 0.6) < 0.01


def test_nonfinite_step_in_window_fails() -> None:
    base = baseline([stats(i, 3.0) for i in range(20)])
    assert base is not None
    window = [stats(i, 3.0) for i in range(19)] + [StepStats(step=99, loss=math.inf, nonfinite=True)]
    assert not next(c for c in evaluate(base, window, {}) if c.name == "finite").passed


def test_unreported_metric_is_skipped() -> None:
    hist = [StepStats(step=i, loss=3.0) for i in range(20)]
    base = baseline(hist)
    assert base is not None
    checks = {c.name: c for c in evaluate(base, hist, {})}
    assert checks["grad_norm"].passed and checks["grad_norm"].detail == "not reported"


def test_no_baseline_from_too_few_steps() -> None:
    assert baseline([stats(i, 3.0) for i in range(3)]) is None

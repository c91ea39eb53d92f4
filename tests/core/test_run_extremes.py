"""An LR or an update far above every earlier one, judged against the run's own maxima: evidence
before the detector has the history a mean/noise band needs (``supervisor.core.extremes``).

The sampler's cells (traces cut to their first steps): an LR x25 right after a checkpoint under
SGD at step 41 of a 150-step run (before ``min_history``: no incident at all, final loss 1.5x
clean); an LR fault in the warm-up under Lion and under SGD (the latter read as a data source
fault); a one-step oversized update under AdamW in the warm-up (undetected, 1.27x clean)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.analysis import StreamingAnalyzer, analyze_records, group_steps, trace_order
from supervisor.core.extremes import RunExtremes
from supervisor.core.policy import load_policy
from supervisor.core.policy.engine import select_rule
from supervisor.core.policy.evidence import findings
from supervisor.traces import read_trace

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize(
    ("name", "onset"),
    [
        ("sampler_lr_persistent_after_checkpoint_sgd", 41),
        ("sampler_lr_jump_warmup_lion", 6),
        ("sampler_lr_persistent_warmup_sgd", 13),
        ("sampler_oversized_update_warmup_adamw", 8),
    ],
)
def test_an_lr_far_above_every_lr_the_run_used_is_an_optimizer_fault(name: str, onset: int) -> None:
    res = analyze_records(read_trace(DATA / f"{name}.jsonl.gz").records)
    assert res.incidents, name
    d = res.incidents[0]
    assert d.onset_step == onset and d.detected_step == onset, d.to_json()
    assert d.first_anomaly is not None and d.first_anomaly.metric == "lr", d.to_json()
    assert d.top_cause is not None and d.top_cause.value == "optimizer", d.to_json()
    assert "lr_jump" in findings(d), findings(d)
    # Not a data source fault: a young run's source has no baseline of its own to be out of.
    assert d.source_local is None, d.to_json()
    rule, why, _ = select_rule(load_policy("default"), d)
    assert rule is not None and rule.name == "optimizer_state", why


def test_a_clean_run_sets_no_extreme() -> None:
    """A warm-up, a cosine decay, accumulation 4 over 4 ranks: no step is judged extreme."""
    recs = read_trace(DATA / "sampler_clean_gpt2_acc4_r4.jsonl.gz").records
    a = StreamingAnalyzer()
    for step, rs in group_steps(trace_order(recs)):
        a.observe_step(step, rs)
        assert a._extreme is None, (step, a._extreme)


def _feed(ex: RunExtremes, lrs: list[float], upd: list[float] | None = None) -> list[str]:
    out = []
    for i, lr in enumerate(lrs, start=1):
        u = upd[i - 1] if upd is not None else None
        e = ex.judge(i, lr, u)
        out.append(e.metric if e is not None else "")
        ex.push(i, lr, u)
    return out


def test_schedules_move_the_lr_gradually() -> None:
    # A linear warm-up from a near-zero start (x10 at its first step), a geometric ramp of 3x a
    # step, a cyclic schedule that restarts at its peak: none is an LR fault.
    near_zero = [1e-6] + [0.01 * k for k in range(1, 20)]
    geometric = [1e-5 * 3**k for k in range(12)]
    cyclic = [0.3 * (1 - (k % 10) / 10) + 1e-4 for k in range(40)]
    for lrs in (near_zero, geometric, cyclic):
        assert not any(_feed(RunExtremes(), lrs)), lrs


def test_an_lr_jump_needs_a_reference_and_the_schedule_ratio_divided_out() -> None:
    assert _feed(RunExtremes(), [0.1, 2.0]) == ["", ""]  # one step seen: no reference yet
    assert _feed(RunExtremes(), [0.1, 0.1, 0.1, 2.0])[-1] == "lr"
    # Late in a decay the jumped LR may stay under 8x the warm-up's peak: still 20x its step.
    decay = [0.3, 0.3, 0.3] + [0.3 * 0.97**k for k in range(40)]
    assert _feed(RunExtremes(), [*decay, decay[-1] * 20])[-1] == "lr"
    # The same jump back to the run's own peak (a restart) is not.
    assert _feed(RunExtremes(), [*decay, 0.3])[-1] == ""


def test_an_oversized_update_is_judged_against_every_earlier_update() -> None:
    ups = [1e-4 * k for k in range(1, 8)]  # SGD's momentum buffer building up in a warm-up
    assert not any(_feed(RunExtremes(), [0.1] * 7, ups))
    assert _feed(RunExtremes(), [0.1] * 8, [*ups, 7e-4 * 10])[-1] == "update_ratio"


def test_a_rollback_forgets_the_abandoned_timeline_and_state_survives() -> None:
    ex = RunExtremes()
    _feed(ex, [0.1] * 10)
    ex.judge(11, 3.0, None)
    ex.push(11, 3.0, None)
    ex.forget_after(10)
    restored = RunExtremes()
    restored.load_state_dict(ex.state_dict())
    e = restored.judge(11, 3.0, None)
    assert e is not None and e.metric == "lr" and e.before == pytest.approx(0.1)


def test_an_lr_rise_made_only_by_dividing_out_the_supervisors_factor_is_no_jump() -> None:
    """Ranks that report the LR unchanged while the supervisor's re-warm factor is 1/200 (the
    first step after its rollback) show a 200x jump once the factor is divided out; the LR the
    ranks reported did not rise, so it is no evidence (tests/runtime/test_run_end.py found it)."""
    ex = RunExtremes()
    for step in range(1, 11):
        ex.push(step, 1e-3, 1e-3, 1e-3)
    assert ex.judge(11, 0.2, 1e-3, 1e-3) is None  # reported 1e-3, divided by the factor: 0.2
    hit = ex.judge(11, 0.2, 1e-3, 0.2)  # the reported LR itself jumped
    assert hit is not None and hit.metric == "lr"

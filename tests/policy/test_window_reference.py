"""The observation window after a rollback, judged against what the healthy run's grad norm did over
the window's steps, not the median of every step before the onset.

Sampler cell ``940126:196961`` (an MLP trained with Lion, warmup-stable-decay, fp16 with a loss
scaler, 4 ranks; one step at 50x the LR at step 61, just after a checkpoint at 60): rolled back
64 -> 40 and re-warmed, the fault did not come back, the loss stayed in its band (window median
3.27 against a limit of 4.63) and the update ratio at 0.82x its baseline, and the window failed on
its grad norm alone: median 9.5, 4.28x the baseline's 2.22, the median of steps 1-60. Over those
steps the healthy run's grad norm rose from 0.42 to ~14 as it trained (1.1 at the end of the
warm-up, ~14 over steps 50-60): the median sat in the middle of that rise. The clean run of the
same base has a median grad norm of 15.0 over the window's steps 41-140, higher than the re-run's:
the rollback cured the fault, the criterion was wrong.

The traces: the faulty timeline (steps 1-65, as recorded) and the rolled-back one (steps 41-144).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from supervisor.core.analysis import analyze_records, group_steps, trace_order
from supervisor.core.detect import DetectorSettings
from supervisor.core.model import Diagnosis
from supervisor.core.policy import Plan, Policy, plan
from supervisor.core.records import Record
from supervisor.incidents import Artifact
from supervisor.runtime.incidents import PreOnset, kept_pre_onset, plan_baseline
from supervisor.runtime.observe import Baseline, Check, StepStats, aggregate, evaluate
from supervisor.traces import read_trace
from tests.policy.conftest import state

DATA = Path(__file__).resolve().parents[1] / "core" / "data"
LEVEL_WINDOW = DetectorSettings().level_window


def steps(name: str) -> list[StepStats]:
    recs: list[Record] = read_trace(DATA / f"sampler_lion_wsd_oversized_{name}.jsonl.gz").records
    return [aggregate(step, rs) for step, rs in group_steps(trace_order(recs))]


def planned(default_policy: Policy) -> tuple[Diagnosis, Plan]:
    """The incident and the default policy's plan for it, at step 64 with checkpoints 20, 40 healthy
    and 60 saved one step before the onset (not yet healthy)."""
    faulty = read_trace(DATA / "sampler_lion_wsd_oversized_faulty.jsonl.gz").records
    d = analyze_records(faulty).incidents[0]
    js = state(step=64, checkpoints=((20, "healthy"), (40, "healthy"), (60, "verified")), checkpoint_every=20)
    p = plan(d, js, default_policy)
    rb = p.action("rollback")
    assert rb is not None and rb.params["target_step"] == 40, p.escalate_reason
    return d, p


def window_checks(default_policy: Policy, window: list[StepStats]) -> tuple[dict[str, Check], Baseline]:
    d, p = planned(default_policy)
    base, _ = plan_baseline(PreOnset.of(steps("faulty"), d.onset_step), p, 64, LEVEL_WINDOW)
    observe = p.action("observe")
    assert base is not None and observe is not None
    checks = evaluate(base, window, dict(observe.params["pass"]))
    return {c.name: c for c in checks}, base


def rolled_back_window() -> list[StepStats]:
    return [h for h in steps("rolled_back") if 41 <= h.step <= 140]


def test_a_rollback_that_trains_as_the_healthy_run_passes_its_window(default_policy: Policy) -> None:
    checks, base = window_checks(default_policy, rolled_back_window())
    failed = {n: c.detail for n, c in checks.items() if not c.passed}
    assert not failed, failed
    assert base.grad_norm is not None and base.grad_norm > 10.0  # the grad norm's level at the onset
    assert checks["grad_norm"].value is not None and checks["grad_norm"].value < 1.0


def test_the_reference_is_recorded_beside_the_median_it_replaces(default_policy: Policy) -> None:
    d, p = planned(default_policy)
    base, why = plan_baseline(PreOnset.of(steps("faulty"), d.onset_step), p, 64, LEVEL_WINDOW)
    assert base is not None and why is not None
    assert why["window"] == [41, 140] and why["onset"] == 61
    assert why["reference"] == base.grad_norm
    assert 2.0 < why["median_before_onset"] < 2.5  # the median of steps 1-60 the window failed against


def test_a_grad_norm_that_stays_up_after_the_rollback_still_fails(default_policy: Policy) -> None:
    """The same re-run with the grad norm 4x what it was: loss in band, nothing non-finite, and the
    grad norm over twice the healthy run's level at the onset."""
    window = [replace(h, grad_norm=4.0 * h.grad_norm) if h.grad_norm else h for h in rolled_back_window()]
    checks, _ = window_checks(default_policy, window)
    assert not checks["grad_norm"].passed, checks["grad_norm"].detail
    assert checks["loss"].passed


def test_the_faulty_timeline_still_fails_against_the_same_baseline(default_policy: Policy) -> None:
    window = [h for h in steps("faulty") if h.step > 61]
    checks, _ = window_checks(default_policy, window)
    assert not checks["loss"].passed, checks["loss"].detail


def test_a_second_plan_after_the_re_run_keeps_the_first_plan_s_baseline(default_policy: Policy) -> None:
    """Were the first window to fail at step 140, the default policy's second plan rolls back to 40
    again (window 41-140). Taken from the history then (steps 1-40, then 41-140 re-run under the
    re-warm), its baseline would be the re-warm's: a grad-norm reference of 4.6 instead of 11.8 and a
    loss median of 3.29 instead of 3.47 (a stricter window for a cured run). What the first plan
    kept (``pre_onset`` in its artifact) gives the second plan the first one's."""
    d, p = planned(default_policy)
    first, first_why = plan_baseline(PreOnset.of(steps("faulty"), d.onset_step), p, 64, LEVEL_WINDOW)
    rerun = [h for h in steps("faulty") if h.step <= 40] + [h for h in steps("rolled_back") if h.step <= 140]
    from_history, _ = plan_baseline(PreOnset.of(rerun, d.onset_step), p, 140, LEVEL_WINDOW)
    assert first is not None and from_history is not None
    assert (round(first.grad_norm or 0, 1), round(first.loss_median, 2)) == (11.8, 3.47)
    assert (round(from_history.grad_norm or 0, 1), round(from_history.loss_median, 2)) == (4.6, 3.29)

    stored = json.loads(json.dumps(PreOnset.of(steps("faulty"), d.onset_step).to_json()))
    found = kept_pre_onset([Artifact(1, 1, "plan", "plan-1", {"pre_onset": stored}, 0.0)], d.onset_step)
    assert found is not None and found[1] == "plan-1"
    second, second_why = plan_baseline(found[0], p, 140, LEVEL_WINDOW)
    assert (second, second_why) == (first, first_why)

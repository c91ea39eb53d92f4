"""The observation window after a start-over from the run's start, judged against a warm-up baseline.

Sampler cells ``345517:648370`` (an oversized update at step 11) and ``345517:215952`` (an LR bug
at step 13), both in the warm-up of an MLP trained with Lion (warmup-stable-decay, 15 warm-up steps,
accumulation 2, 3 ranks): the plan rolled back to the run's start and re-warmed, the fault did not
come back, the loss fell from 5.5 to 3.5, the update per unit of LR stayed at the baseline's, and the
window failed on its grad norm alone, 13.8x and 12.1x a baseline of the first 10-12 warm-up steps;
the second attempt (LR halved) failed the same way and the job escalated. The clean run of that
base does the same: its median grad norm over steps 2-101 is 18x its first 10 steps'. A model that
has just left its initialization has a grad norm that moves with training, not with its health
(under Lion, whose update is ``lr * sign(.)`` whatever the gradient's size, the weights' norm and the
grad norm grow at the peak LR), so a baseline taken at a fraction of the LR the window runs bounds
the loss and the update per unit of LR, not the grad norm.

The traces: the faulty timeline (steps 1-18, as recorded) and the started-over one (steps 1-101).
"""

from __future__ import annotations

from pathlib import Path

from supervisor.core.analysis import analyze_records, group_steps, trace_order
from supervisor.core.policy import Policy, plan
from supervisor.core.records import Record
from supervisor.runtime.observe import Baseline, StepStats, aggregate, baseline, evaluate
from supervisor.traces import read_trace
from tests.policy.conftest import state

DATA = Path(__file__).resolve().parents[1] / "core" / "data"


def steps(name: str) -> list[StepStats]:
    recs: list[Record] = read_trace(DATA / f"{name}.jsonl.gz").records
    return [aggregate(step, rs) for step, rs in group_steps(trace_order(recs))]


def planned_window(default_policy: Policy) -> tuple[int, dict[str, object]]:
    """The onset and the observe action's pass criteria, as the default policy plans them."""
    faulty = read_trace(DATA / "sampler_lion_warmup_oversized_faulty.jsonl.gz").records
    d = analyze_records(faulty).incidents[0]
    p = plan(d, state(step=18, checkpoints=(), checkpoint_every=20, lr=3e-3), default_policy)
    rb, observe = p.action("rollback"), p.action("observe")
    assert rb is not None and rb.params["to_start"] is True, p.escalate_reason
    assert observe is not None
    return d.onset_step, dict(observe.params["pass"])


def warm_up_baseline(onset: int) -> Baseline:
    base = baseline([h for h in steps("sampler_lion_warmup_oversized_faulty") if h.step < onset])
    assert base is not None and base.steps == onset - 1
    return base


def test_a_start_over_that_trains_as_the_clean_run_passes_its_window(default_policy: Policy) -> None:
    onset, criteria = planned_window(default_policy)
    assert onset == 11
    window = [h for h in steps("sampler_lion_warmup_oversized_started_over") if 2 <= h.step <= 101]
    checks = {c.name: c for c in evaluate(warm_up_baseline(onset), window, criteria)}
    failed = {n: c.detail for n, c in checks.items() if not c.passed}
    assert not failed, failed
    assert "not judged" in checks["grad_norm"].detail and "warm-up" in checks["grad_norm"].detail
    assert checks["loss"].value is not None and checks["loss"].value < 4.0  # judged, and it fell


def test_the_faulty_timeline_still_fails_against_the_same_baseline(default_policy: Policy) -> None:
    onset, criteria = planned_window(default_policy)
    window = [h for h in steps("sampler_lion_warmup_oversized_faulty") if h.step > onset]
    failed = {c.name for c in evaluate(warm_up_baseline(onset), window, criteria) if not c.passed}
    assert "loss" in failed, failed


def test_a_grad_norm_rise_at_the_baseline_lr_or_below_is_still_judged() -> None:
    """Mid-run: a baseline at the peak LR, a window under the supervisor's re-warm or at the same LR."""
    base = baseline([StepStats(s, 3.0, 1.0, 3e-3, 1e3, 3e-3) for s in range(40, 80)])
    assert base is not None
    for lr in (3e-3, 1.5e-3):
        window = [StepStats(s, 3.0, 3.0, lr, 1e3, lr) for s in range(80, 180)]
        check = next(c for c in evaluate(base, window, {}) if c.name == "grad_norm")
        assert not check.passed and check.value == 3.0, check.detail

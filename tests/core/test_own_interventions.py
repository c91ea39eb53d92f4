"""What the supervisor's own interventions do to each signal (docs/detection.md, "What each
intervention does to each signal"): each cell of that table is a test here. Records follow the
optimizers' real dynamics (``tests/core/optim_dynamics.py``)."""

from __future__ import annotations

import json

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.records import Record
from supervisor.traces.synthetic import set_loss, synthetic_records

ROLLBACK_TO = 150


def _steps(seed: int = 0, n: int = 400, ranks: int = 2) -> list[tuple[int, list[Record]]]:
    return list(group_steps(synthetic_records(n, ranks, seed=seed)))


def _lr_bug(batch: list[Record]) -> None:
    for r in batch:
        r.lr = (r.lr or 0.0) * 25
        r.update_norm = (r.update_norm or 0.0) * 25
        r.grad_norm = (r.grad_norm or 0.0) * 4
        set_loss(r, r.loss * 1.8)


def adam_rewarm_gain(k: int) -> float:
    """Adam's update size per unit of LR, k steps into a low-LR re-warm after a rollback (measured
    on a llama-style decoder: +25-55% within 3-5 steps, then back as the LR comes up): small steps
    leave consecutive gradients correlated, so |m| / sqrt(v) grows towards 1."""
    return 1.0 + 0.5 * min(1.0, k / 5.0) * max(0.0, 1.0 - max(0, k - 5) / 30.0)


def _rewarm_run(
    seed: int, *, resumed_event: bool = True, gain=adam_rewarm_gain, warm: int = 71
) -> StreamingAnalyzer:
    """LR x25 from step 220, caught and rolled back to 150 with a ``warm``-step re-warm."""
    a = StreamingAnalyzer()
    for step, batch in _steps(seed):
        if step > 228:
            break
        if step >= 220:
            _lr_bug(batch)
        a.observe_step(step, batch)
    assert len(a.incidents) == 1
    a.notify_rollback(ROLLBACK_TO, reason="rollback")
    a.note_overrides(ROLLBACK_TO, warmup_steps=warm, reason="re-warm")
    for step, batch in _steps(seed):
        if step <= ROLLBACK_TO:
            continue
        k = step - ROLLBACK_TO
        mult = min(1.0, k / warm)
        for r in batch:
            r.lr = (r.lr or 0.0) * mult
            r.update_norm = (r.update_norm or 0.0) * mult * gain(k)
            if resumed_event and k == 1:
                r.events = ["resumed", f"rolled_back:228:{ROLLBACK_TO}", f"shard_restored:{ROLLBACK_TO}:abc"]
        a.observe_step(step, batch)
    return a


def test_adam_rewarm_after_own_rollback_opens_nothing() -> None:
    """Issue 24 point 1: the re-warm's Adam update-ratio rise read as a lost optimizer state."""
    for seed in range(4):
        a = _rewarm_run(seed)
        extra = [d.to_json() for d in a.finish().incidents[1:]]
        assert not extra, extra


# -- real optimizer dynamics: each family under the supervisor's own rollback and re-warm -----------

FAMILIES = ("adamw", "sgd", "lion")


def _real_run(name: str, seed: int, *, fault_at: int | None = None, warm: int = 71):
    """A tiny real run to 230; the supervisor rolls back to 150 and re-warms over ``warm`` steps."""
    from tests.core.optim_dynamics import Run

    run = Run(name, seed=seed)
    a = StreamingAnalyzer()
    while run.step < 230:
        a.observe_step(run.step + 1, run.train())
        if run.step == 150:
            run.save()
    run.restore(150)
    a.notify_rollback(150, reason="rollback")
    a.note_overrides(150, warmup_steps=warm, reason="re-warm")
    first = True
    while run.step < 330:
        k = run.step + 1 - 150
        recs = run.train(min(1.0, k / warm), {1: 12.0} if run.step + 1 == fault_at else None)
        if first:
            for r in recs:
                r.events = ["resumed", "rolled_back:230:150"]
            first = False
        a.observe_step(run.step, recs)
    return a


def test_own_rollback_and_rewarm_open_nothing_under_each_optimizer_family() -> None:
    for name in FAMILIES:
        a = _real_run(name, seed=3)
        found = [d.to_json() for d in a.finish().incidents if d.onset_step > 150]
        assert not found, (name, found)


def _user_resume(name: str, seed: int, *, event: list[str]):
    """The script's own resume after a crash, at step 150, that forgets the optimizer state."""
    from tests.core.optim_dynamics import Run

    run = Run(name, seed=seed)
    a = StreamingAnalyzer()
    while run.step < 200:
        a.observe_step(run.step + 1, run.train())
        if run.step == 150:
            run.save()
    run.restore(150, optimizer_state=False)
    a.notify_rollback(150)  # the step numbers go back: the detector takes the timeline back
    a.own_restore = None  # ... but the supervisor did not restore this: the run's own resume
    first = True
    while run.step < 240:
        recs = run.train()
        if first:
            for r in recs:
                r.events = list(event)
            first = False
        a.observe_step(run.step, recs)
    return a


def test_a_resume_that_lost_the_optimizer_state_is_found_under_every_family() -> None:
    """Issue 24 point 4: with Lion (lr * sign(.)) the update never changes size, so only the
    fact seen where the state was loaded can tell; it opens at once, cause resume_state."""
    for name in FAMILIES:
        a = _user_resume(name, seed=2, event=["resumed", "resume_incomplete:optimizer"])
        found = [d for d in a.finish().incidents if d.onset_step > 150]
        assert found, name
        d = found[0]
        assert d.onset_step == 151 and d.top_cause is not None and d.top_cause.value == "resume_state", (
            d.to_json()
        )
        assert any("optimizer" in e for e in d.causes[0].evidence)
        assert d.severity.value in ("high", "critical")


def test_own_rollback_that_reports_a_missing_component_is_still_resume_state() -> None:
    a = _rewarm_run(0)
    assert len(a.incidents) == 1
    a2 = StreamingAnalyzer()
    steps = _steps(1)
    for step, batch in steps[:200]:
        a2.observe_step(step, batch)
    a2.notify_rollback(150)
    for step, batch in steps[150:170]:
        if step == 151:
            for r in batch:
                r.events = ["resumed", "resume_incomplete:scheduler"]
        a2.observe_step(step, batch)
    d = a2.finish().incidents[-1]
    assert d.top_cause is not None and d.top_cause.value == "resume_state"
    assert "scheduler" in " ".join(d.causes[0].evidence)


def _grad_only(a: StreamingAnalyzer, steps, first: int, n: int = 4) -> None:
    """Grad norm and update ratio 10x for ``n`` steps, the loss calm."""
    for step, batch in steps:
        if first <= step < first + n:
            for r in batch:
                r.grad_norm = (r.grad_norm or 0.0) * 10
                r.update_norm = (r.update_norm or 0.0) * 10
        a.observe_step(step, batch)


def test_optimizer_only_evidence_inside_the_observation_window_needs_the_loss() -> None:
    steps = _steps(2)
    inside = StreamingAnalyzer()
    _grad_only(inside, steps[:200], 0)
    inside.notify_rollback(150, observe_steps=50)
    _grad_only(inside, steps[150:260], 170)
    assert not inside.finish().incidents
    outside = StreamingAnalyzer()  # the same signal with no intervention of the supervisor's own
    _grad_only(outside, steps[:260], 170)
    assert [d.first_anomaly.metric for d in outside.finish().incidents] in (["grad_norm"], ["update_ratio"])


def test_a_loss_fault_inside_the_observation_window_is_found() -> None:
    from tests.core.optim_dynamics import Run

    run = Run("adamw", seed=5)
    a = StreamingAnalyzer()
    while run.step < 200:
        a.observe_step(run.step + 1, run.train())
        if run.step == 150:
            run.save()
    run.restore(150)
    a.notify_rollback(150)
    a.note_overrides(150, warmup_steps=50)
    while run.step < 230:
        k = run.step + 1 - 150
        recs = run.train(min(1.0, k / 50), {1: 6.0} if run.step + 1 == 170 else None)
        a.observe_step(run.step, recs)
    found = [d for d in a.finish().incidents if d.onset_step > 150]
    assert [(d.onset_step, d.first_rank) for d in found] == [(170, 1)]


def test_own_restore_and_window_survive_state_dict() -> None:
    steps = _steps(0)
    a = StreamingAnalyzer()
    for step, batch in steps[:200]:
        a.observe_step(step, batch)
    a.notify_rollback(150)
    a.note_overrides(150, warmup_steps=30)
    b = StreamingAnalyzer()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert (b.own_restore, b.observe_until, b.ramp_end) == (150, a.observe_until, 180)
    assert b.observing(200) and not b.observing(300)


# -- the rank that moved first, non-finite values included --------------------------------------


def test_one_rank_nan_is_named_on_that_rank_though_the_all_reduced_grad_norm_is_nan_everywhere() -> None:
    """Issue 24 point 3: NaN in rank 1's loss; DDP's all-reduce makes every rank's grad norm NaN."""
    for ranks in (2, 4):
        a = StreamingAnalyzer()
        for step, batch in _steps(3, n=240, ranks=ranks):
            if step == 200:
                for r in batch:
                    r.grad_norm = float("nan")
                    r.nonfinite = True
                    r.events = ["step_skipped_nonfinite"]
                set_loss(batch[1], float("nan"))
            a.observe_step(step, batch)
        d = a.finish().incidents[0]
        assert (d.onset_step, d.first_rank, d.rank_local, d.first_anomaly.rank) == (200, 1, True, 1), (
            d.to_json()
        )
        assert d.nonfinite and d.causes[0].cause.value == "numeric"


def _precision_change(tell: bool) -> StreamingAnalyzer:
    """fp16 with a scaler grown to 2**20; the supervisor switches precision after step 200: a new
    scaler starts at 2**16; the loss, grad norm and update move to new levels (exaggerated here:
    8%, 2.5x, 2x, so that an unannounced change does open an incident)."""
    a = StreamingAnalyzer()
    for step, batch in _steps(5, n=320):
        for r in batch:
            r.loss_scale = 2.0**20 if step <= 200 else 2.0**16
            if step > 200:
                set_loss(r, r.loss * 1.08)
                r.grad_norm = (r.grad_norm or 0.0) * 2.5
                r.update_norm = (r.update_norm or 0.0) * 2.0
        a.observe_step(step, batch)
        if step == 200 and tell:
            a.note_overrides(200, precision="fp16", reason="precision")
    return a


def test_own_precision_change_moves_levels_and_loss_scale_without_an_incident() -> None:
    assert _precision_change(tell=False).finish().incidents  # unannounced, the shift reads as a fault
    told = _precision_change(tell=True).finish().incidents
    assert not told, [d.to_json() for d in told]


def test_a_rank_that_stops_reporting_is_no_loss_spike() -> None:
    """Issue 24 point 4: a rank process crashed; the steps after it carry the other ranks' records
    only (and a last half-written one). A worker failure is the runtime's incident."""
    a = StreamingAnalyzer()
    for step, batch in _steps(6, n=260, ranks=4):
        if 168 <= step < 175:
            batch = [r for r in batch if r.rank != 2]
            for r in batch:  # the survivors wait in the collective: slow, heavier-tailed steps
                set_loss(r, r.loss * (1.0 + 0.6 * (r.rank == 3)))
        if step >= 175:
            break
        a.observe_step(step, batch)
    assert not a.finish().incidents


def test_onset_is_never_after_detection() -> None:
    for d in _rewarm_run(1).finish().incidents:
        assert d.detected_step is None or d.onset_step <= d.detected_step


def test_a_persistent_corruption_of_one_ranks_update_is_not_transient() -> None:
    """Held-out class of issue 24 point 5: one rank's replica applies a corrupted update from step
    250 on (its fingerprint stays in the minority); its own loss stays 15% above the other ranks',
    which lifts the mean of 4 ranks within its noise. A persistent rank fault, not a transient.
    (A replica that differs once and stays silent in the loss, the corpus's replica_divergence,
    stays transient: the fingerprints alone cannot tell the two apart.)"""
    from supervisor.core.model import Phenotype

    recs = synthetic_records(340, 4, seed=6)
    for r in recs:
        if r.step >= 250 and r.rank == 2:
            r.param_checksum = f"other{r.step}"
            set_loss(r, r.loss * 1.15)
    a = StreamingAnalyzer()
    for step, batch in group_steps(recs):
        a.observe_step(step, batch)
    (d,) = a.finish().incidents
    assert (d.onset_step, d.first_rank) == (250, 2)
    assert (
        d.phenotype is Phenotype.DIVERGENCE and d.top_cause is not None and d.top_cause.value == "distributed"
    )

"""An LR fault under observation that comes back: the first abnormal quantity is the LR itself.

A persistent LR bug is in every timeline. After the supervisor's rollback and re-warm it returns
at the same step (the re-warm over ``onset - target`` steps ends right there), and under SGD or at
the last steps of a run the loss may not react before training ends or for many steps: the LR,
with the supervisor's own factor divided out, is the evidence. Pure Python over synthetic records
with the traits of the sampler's failing cells (a constant or decaying schedule, a x20-x40 LR).
"""

from __future__ import annotations

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.records import Record
from supervisor.traces.synthetic import set_loss, synthetic_records

ONSET = 220
TARGET = 150
N = 400


def _steps(seed: int) -> list[tuple[int, list[Record]]]:
    return list(group_steps(synthetic_records(N, 2, seed=seed)))


def _bug(batch: list[Record], factor: float, loss_gain: float) -> None:
    for r in batch:
        r.lr = (r.lr or 0.0) * factor
        r.update_norm = (r.update_norm or 0.0) * factor
        r.grad_norm = (r.grad_norm or 0.0) * 2
        set_loss(r, r.loss * loss_gain)


def _caught(seed: int, factor: float) -> StreamingAnalyzer:
    a = StreamingAnalyzer()
    for step, batch in _steps(seed):
        if step > ONSET + 8:
            break
        if step >= ONSET:
            _bug(batch, factor, 1.8)
        a.observe_step(step, batch)
    assert a.incidents and a.incidents[0].onset_step == ONSET
    a.notify_rollback(TARGET, reason="fix of incident 1")
    a.note_overrides(TARGET, warmup_steps=ONSET - TARGET, reason="fix of incident 1")
    return a


def _replay(a: StreamingAnalyzer, seed: int, factor: float, *, last: int = N, loss_gain: float = 1.0):
    """The new timeline: the ramp's factor in the logged LR, the bug back from the onset with a
    loss that does not react (``loss_gain`` 1: SGD at a re-warmed LR survives it for a while)."""
    warm = ONSET - TARGET
    updates = []
    for step, batch in _steps(seed):
        if step <= TARGET or step > last:
            continue
        mult = min(1.0, (step - TARGET) / warm)
        for r in batch:
            r.lr = (r.lr or 0.0) * mult
            r.update_norm = (r.update_norm or 0.0) * mult
        if step >= ONSET:
            _bug(batch, factor, loss_gain)
        updates += a.observe_step(step, batch)
    return updates


def _lr_evidence(d) -> bool:
    return any(e.startswith("learning rate") for c in d.causes for e in c.evidence)


def test_a_persistent_lr_bug_that_returns_in_the_window_is_found_though_the_loss_stays_calm() -> None:
    for seed in range(3):
        for factor in (20.0, 40.0):
            a = _caught(seed, factor)
            ups = _replay(a, seed, factor)
            opened = [u.diagnosis for u in ups if u.kind == "opened"]
            assert opened, (seed, factor)
            d = opened[0]
            assert d.onset_step == ONSET, d.to_json()
            assert _lr_evidence(d), d.to_json()
            assert d.severity.value != "low", d.to_json()
            assert any(u.kind == "ready" and u.diagnosis.onset_step == ONSET for u in ups)


def test_a_return_at_the_last_steps_is_ready_before_the_run_ends() -> None:
    """The run ends two steps after the bug returns: no later step can confirm it, so the LR
    evidence is a fact (ready at once), never left open for the end of the window."""
    a = _caught(1, 20.0)
    ups = _replay(a, 1, 20.0, last=ONSET + 1)
    assert any(u.kind == "ready" and u.diagnosis.onset_step == ONSET for u in ups), [
        (u.kind, u.diagnosis.onset_step) for u in ups
    ]


def test_a_cured_lr_fault_leaves_the_window_quiet() -> None:
    for seed in range(3):
        a = _caught(seed, 25.0)
        ups = _replay(a, seed, 1.0)
        assert not [u for u in ups if u.kind == "opened"], [u.diagnosis.to_json() for u in ups]


def test_a_schedule_that_warms_up_again_after_a_rollback_is_no_lr_fault() -> None:
    """Rolled back into the schedule's own warm-up (LR x2 and x1.5 step over step): the LR's own
    rise is the schedule's, below any recurrence of a x20 fault."""
    a = StreamingAnalyzer()
    for step, batch in _steps(4):
        if step > 70:
            break
        if step >= 62:
            _bug(batch, 20.0, 1.8)
        a.observe_step(step, batch)
    assert a.incidents
    a.notify_rollback(1, reason="fix of incident 1")
    ups = []
    for step, batch in _steps(4):
        if 1 < step <= 60:
            ups += a.observe_step(step, batch)
    assert not [u for u in ups if u.kind == "opened"], [u.diagnosis.to_json() for u in ups]

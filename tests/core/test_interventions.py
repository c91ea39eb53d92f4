"""The detector knows what the supervisor did (issue 13, point 2): its own re-warm, LR scale,
clip change, rollback and skipped batches are expected changes, never evidence of a spike."""

from __future__ import annotations

import json
import math

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.interventions import Intervention, Interventions
from supervisor.core.records import Record
from supervisor.traces.synthetic import set_loss, synthetic_records

REWARM = 200


def _steps(seed: int = 0, n: int = 420) -> list[tuple[int, list[Record]]]:
    return list(group_steps(synthetic_records(n, 2, seed=seed)))


def _lr_bug(batch: list[Record]) -> None:
    """A 30x LR: the update ratio follows the LR, the loss and grad norm jump."""
    for r in batch:
        r.lr = (r.lr or 0.0) * 30
        r.update_norm = (r.update_norm or 0.0) * 30
        r.grad_norm = (r.grad_norm or 0.0) * 5
        set_loss(r, r.loss * 1.8)


def _rewarmed(batch: list[Record], mult: float) -> None:
    """What the SDK logs under a supervisor override: the LR and the update scaled by its factor."""
    for r in batch:
        r.lr = (r.lr or 0.0) * mult
        r.update_norm = (r.update_norm or 0.0) * mult


def _run_issue13_point2(tell: bool, seed: int = 0) -> StreamingAnalyzer:
    """Healthy to 251, a 30x LR bug at 252-257, rollback to 150 and a 200-step re-warm."""
    steps = _steps(seed)
    a = StreamingAnalyzer()
    for step, batch in steps:
        if step > 257:
            break
        if step >= 252:
            _lr_bug(batch)
        a.observe_step(step, batch)
    assert len(a.incidents) == 1
    if tell:
        a.notify_rollback(150, reason="rollback")
        a.note_overrides(150, warmup_steps=REWARM, reason="re-warm")
    for step, batch in _steps(seed):  # the re-run: the same healthy data, the LR re-warmed
        if step <= 150:
            continue
        _rewarmed(batch, min(1.0, (step - 150) / REWARM))
        a.observe_step(step, batch)
    return a


def test_rewarm_ramp_unannounced_is_taken_for_a_spike() -> None:
    """The failure of issue 13 point 2, reproduced: without the intervention the ramp opens an incident."""
    a = _run_issue13_point2(tell=False)
    assert len(a.incidents) >= 2


def test_rewarm_after_rollback_opens_nothing() -> None:
    for seed in range(3):
        a = _run_issue13_point2(tell=True, seed=seed)
        assert len(a.incidents) == 1, [d.to_json() for d in a.finish().incidents]


def test_a_real_fault_during_the_rewarm_is_still_found_without_lr_evidence() -> None:
    steps = _steps(4)
    a = StreamingAnalyzer()
    for step, batch in steps[:250]:
        a.observe_step(step, batch)
    a.notify_rollback(200)
    a.note_overrides(200, warmup_steps=100)
    for step, batch in steps[200:]:
        _rewarmed(batch, min(1.0, (step - 200) / 100))
        if step == 300:
            for r in batch:
                set_loss(r, r.loss * 2.5)
                r.grad_norm = (r.grad_norm or 1.0) * 10
        a.observe_step(step, batch)
    diags = a.finish().incidents
    assert [d.onset_step for d in diags] == [300]
    text = json.dumps(diags[0].to_json())
    assert "learning rate" not in text  # the ramp is the supervisor's, not a cause


def test_lr_scale_is_divided_out_of_lr_and_update_ratio() -> None:
    steps = _steps(5, 300)
    a = StreamingAnalyzer()
    for step, batch in steps[:150]:
        a.observe_step(step, batch)
    a.note_overrides(150, lr_scale=0.3)
    assert a.lr_multiplier(150) == 1.0 and a.lr_multiplier(151) == 0.3
    for step, batch in steps[150:]:
        _rewarmed(batch, 0.3)
        a.observe_step(step, batch)
        sig = a.recent[-1]
        assert sig.lr_ratio is None or abs(math.log(sig.lr_ratio)) < 0.1
        assert sig.update_z is None or math.isnan(sig.update_z) or abs(sig.update_z) < 6
    assert a.finish().incidents == []


def test_clip_change_reanchors_the_update_ratio() -> None:
    steps = _steps(6, 300)
    a = StreamingAnalyzer()
    for step, batch in steps[:150]:
        a.observe_step(step, batch)
    a.note_overrides(150, grad_clip=0.25)
    for step, batch in steps[150:]:
        for r in batch:  # a looser effective update after the change: a new level, not a spike
            r.update_norm = (r.update_norm or 0.0) * 3
        a.observe_step(step, batch)
    assert a.finish().incidents == []


def test_rollback_drops_overrides_of_the_abandoned_timeline() -> None:
    known = Interventions()
    known.add(Intervention("override", 100, lr_scale=0.5))
    known.add(Intervention("override", 250, warmup_steps=50))
    assert known.lr_multiplier(275) == 0.25
    known.add(Intervention("rollback", 200))
    assert known.lr_multiplier(275) == 0.5


def test_replayed_steps_are_compared_with_history_before_the_target() -> None:
    """The abandoned timeline's high level must not become the reference of the re-run."""
    steps = _steps(8, 300)
    a = StreamingAnalyzer()
    for step, batch in steps:
        if step > 260:
            break
        if step > 200:  # a slow drift up the detector learned (no incident): abandoned by the rollback
            for r in batch:
                set_loss(r, r.loss * (1 + 0.01 * (step - 200)))
        a.observe_step(step, batch)
    level_before = a.detector.loss.level()
    a.notify_rollback(200)
    assert a.detector.loss.level() < level_before - 0.2
    for step, batch in steps[200:]:
        a.observe_step(step, batch)
    assert a.finish().incidents == []


def test_interventions_round_trip_through_state_dict() -> None:
    steps = _steps(9)
    a = StreamingAnalyzer()
    for step, batch in steps[:257]:
        if step >= 252:
            _lr_bug(batch)
        a.observe_step(step, batch)
    a.notify_rollback(150)
    a.note_overrides(150, warmup_steps=REWARM, grad_clip=0.5)
    steps = _steps(9)  # the re-run sees the healthy data again
    for step, batch in steps[150:170]:
        _rewarmed(batch, min(1.0, (step - 150) / REWARM))
        a.observe_step(step, batch)
    b = StreamingAnalyzer()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.interventions == a.interventions
    assert b.lr_multiplier(200) == a.lr_multiplier(200) == 0.25
    for step, batch in steps[170:]:
        _rewarmed(batch, min(1.0, (step - 150) / REWARM))
        for x in (a, b):
            x.observe_step(step, [Record(**{k: getattr(r, k) for k in r.__slots__}) for r in batch])
    assert b.finish().to_json() == a.finish().to_json()
    assert len(b.finish().incidents) == 1


def test_a_saved_skip_entry_of_an_older_supervisor_loads_without_it() -> None:
    saved = [
        {"kind": "rollback", "step": 150, "from_step": 257},
        {"kind": "skip", "step": 160, "last": 162, "data": True},
        {"kind": "override", "step": 150, "warmup_steps": 40},
    ]
    iv = Interventions()
    iv.load_state_dict(saved)
    assert [x.kind for x in iv.log] == ["rollback", "override"]
    assert iv.lr_multiplier(170) == 0.5

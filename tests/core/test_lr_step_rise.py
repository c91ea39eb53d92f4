"""An LR that rises abruptly to a level no restart goes back to is an LR fault by itself.

Sampler cell ``66957:755137`` (moe, SGD, ``step_decay``, 3 ranks): the schedule's LR was 0.3 until
step 100 and 0.03 until 150, and a bug multiplied it by 40 from step 151, where the schedule itself
took it to 0.003. The ranks reported 0.12: 4x the step before, below every rule's reach -- not 2x
above the run's peak, not a restart back near it -- and SGD's update ratio, noisy, stood 4x its
level at a robust z of 5.6-6.3, under the three steps at 6 that rule ``grad`` needs. The run went on
at the raised LR. A schedule moves the LR gradually, or drops it at a milestone, or restarts it near
its peak; a rise of 2x its own step-to-step ratio in one step to anywhere else is none of these.
The job can say it meant the change (an ``lr_override`` event).
"""

from __future__ import annotations

import math
import random

import pytest

from supervisor.core.analysis import analyze_records
from supervisor.core.model import Cause
from supervisor.core.policy.evidence import findings
from supervisor.core.records import Record
from supervisor.traces.synthetic import synthetic_records

STEPS = 200


def _step_decay(records: list[Record], lr_at: dict[int, float], seed: int) -> None:
    """The LR from each named step on (a step schedule); the update follows it, with SGD's noise
    (momentum SGD's update is the LR times a noisy gradient: ~0.25 in log units a step)."""
    rng = random.Random(seed)
    starts = sorted(lr_at)
    noise = {s: math.exp(rng.gauss(0.0, 0.25)) for s in range(1, STEPS + 1)}
    for r in records:
        new = lr_at[max(s for s in starts if s <= r.step)]
        if r.lr and r.update_norm is not None:
            r.update_norm *= new / r.lr * noise[r.step]
        r.lr = new


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rise_to_a_level_no_restart_goes_back_to_is_an_lr_fault(seed: int) -> None:
    recs = synthetic_records(STEPS, 3, seed=seed, grad_noise=0.2)
    _step_decay(recs, {1: 0.3, 101: 0.03, 151: 0.12}, seed)
    found = analyze_records(recs).incidents
    assert found and found[0].onset_step == 151, [d.to_json() for d in found]
    assert found[0].top_cause is Cause.OPTIMIZER
    assert "lr_jump" in findings(found[0])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_milestones_alone_are_no_incident(seed: int) -> None:
    recs = synthetic_records(STEPS, 3, seed=seed, grad_noise=0.2)
    _step_decay(recs, {1: 0.3, 101: 0.03, 151: 0.003}, seed)
    assert analyze_records(recs).incidents == []


def test_a_rise_back_near_the_peak_is_a_restart() -> None:
    recs = synthetic_records(STEPS, 3, seed=4, grad_noise=0.2)
    _step_decay(recs, {1: 0.3, 101: 0.03, 151: 0.2}, 4)
    assert analyze_records(recs).incidents == []


def test_a_rise_the_job_announced_is_no_fault() -> None:
    recs = synthetic_records(STEPS, 3, seed=5, grad_noise=0.2)
    _step_decay(recs, {1: 0.3, 101: 0.03, 151: 0.12}, 5)
    for r in recs:
        if r.step == 151:
            r.events = ["lr_override"]
    found = analyze_records(recs).incidents
    assert not [d for d in found if "lr_jump" in findings(d)], [d.to_json() for d in found]


def test_a_ramp_back_to_the_level_before_it_is_no_fault() -> None:
    """A re-warm after a restore (the job's own, or the supervisor's read back from a trace) starts
    low and doubles at its second step, climbing back to where the LR was: never past it."""
    recs = synthetic_records(STEPS, 3, seed=6, grad_noise=0.2)
    ramp = {151 + k: 0.03 * (k + 1) / 10 for k in range(10)}
    _step_decay(recs, {1: 0.3, 101: 0.03, **ramp, 161: 0.03}, 6)
    found = analyze_records(recs).incidents
    assert not [d for d in found if "lr_jump" in findings(d)], [d.to_json() for d in found]

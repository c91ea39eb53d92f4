"""The time-lost ledger on its own (observability/time_lost.py): what survives into the final timeline,
per incident and for worker-group restarts, recounted here from the steps fed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from supervisor.incidents.timeline import incident_words
from supervisor.observability.time_lost import RESTARTS, TimeLedger, run_words


def rec(step_time: float | None = None, t: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(step_time=step_time, time=t)


def test_surviving_time_after_a_rollback_and_a_restart() -> None:
    led = TimeLedger({"started_at": 0.0})
    cost = {s: 0.1 + 0.01 * (s % 3) for s in range(1, 121)}
    for s in range(1, 101):
        led.on_step(s, [rec(cost[s]), rec(cost[s] / 2)])  # the slowest rank's time counts
    led.on_rewind(60, 100, incident_id=7)  # an incident's rollback: 40 steps re-trained
    again = {s: 0.2 for s in range(61, 121)}
    for s in range(61, 121):
        led.on_step(s, [rec(again[s])])
    led.on_rewind(100, 120, incident_id=None)  # a worker-group restart from 100
    for s in range(101, 111):
        led.on_step(s, [rec(0.3)])
    led.finish(200.0)
    effective = sum(cost[s] for s in range(1, 61)) + sum(again[s] for s in range(61, 101)) + 10 * 0.3
    assert led.s["effective_s"] == pytest.approx(effective)
    assert led.of_incident(7)["steps_retrained"] == 40
    assert led.of_incident(7)["retrain_s"] == pytest.approx(sum(again[s] for s in range(61, 101)))
    assert led.of_incident(RESTARTS)["steps_retrained"] == 20
    summary = led.summary(downtime_s=12.5)
    assert summary["steps_retrained"] == 60 and summary["wall_s"] == 200.0
    assert summary["effective_training_time_ratio"] == pytest.approx(effective / 200.0, abs=1e-4)
    assert "60 step(s) re-trained" in (run_words(summary) or "")
    assert incident_words(led.of_incident(7)).startswith("40 step(s) re-trained")


def test_record_times_stand_in_for_a_missing_step_time_on_consecutive_steps_only() -> None:
    led = TimeLedger({"started_at": 0.0})
    assert led.on_step(1, [rec(t=10.0)]) == 0.0  # nothing before it to measure from
    assert led.on_step(2, [rec(t=10.5), rec(t=10.7)]) == pytest.approx(0.7)
    assert led.on_step(5, [rec(t=20.0)]) == 0.0  # a gap: not one step's time

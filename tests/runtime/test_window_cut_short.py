"""An observation window that the run's end cuts short is never a passed observation: every step
the run gave goes through the detector, a recurrence in it fails the window, and a window with no
failure is recorded as cut short (not judged), the fix unverified (issue 24, sampler cell
``909167:292247``); real controller, fake workers (tests/runtime/harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, calm, saver, spikes_once

HOLD = str(Path(__file__).parent / "policies" / "hold.yaml")


@pytest.mark.slow
def test_a_window_the_run_ends_inside_is_not_passed(tmp_path: Path) -> None:
    job = make_job(tmp_path, "short", max_steps=240, policy=HOLD)
    ranks = FakeRanks(2, 240, spikes_once(215))  # 50-step window from ~218: the run ends at 240
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ctl.boot()
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    [inc] = ctl.incidents.list_incidents(job="short")
    [obs] = [e for e in ctl.incidents.timeline(inc.id) if e.kind is EventKind.OBSERVATION]
    assert obs.status is not EventStatus.DONE, obs.result
    assert obs.result["passed"] is None and obs.result.get("skipped"), obs.result
    assert inc.state is IncidentState.RESOLVED  # every fix applied, nothing came back: unverified
    why = [e.payload["reason"] for e in ctl.incidents.timeline(inc.id) if e.kind is EventKind.STATE_CHANGED]
    assert "unverified" in why[-1], why


REWARM = str(Path(__file__).parent / "policies" / "rewarm.yaml")


@pytest.mark.slow
def test_a_recurrence_on_an_abandoned_timeline_does_not_fail_the_next_window(tmp_path: Path) -> None:
    """The fault came back in the first window (rank 0 at 130 again), the next plan rolled back
    again: the second window judges its own timeline. It ran its steps and the fault stayed away,
    so it passes -- it is never failed at its first step by the recurrence of the timeline the
    rollback abandoned (sampler cells: "observation [40, 40] failed: recurrence")."""
    job = make_job(tmp_path, "twice", max_steps=260, policy=REWARM, resources={"num_workers": 1})
    seen: list[int] = []

    def twice_at_130(step: int, rank: int) -> float:  # the first two timelines reach it broken
        if step == 130:
            seen.append(step)
            if len(seen) <= 2:
                return calm(step, rank) * 8.0
        return calm(step, rank)

    ranks = FakeRanks(1, 260, twice_at_130, grads_follow_loss=True)
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)
    [inc] = ctl.incidents.list_incidents(job="twice")
    observations = [e for e in ctl.incidents.timeline(inc.id) if e.kind is EventKind.OBSERVATION]
    assert len(observations) == 2, [o.result for o in observations]
    first, second = observations
    assert first.status is EventStatus.FAILED and not first.result["checks"]["recurrence"]["ok"]
    window = second.result["window"]
    assert window[-1] > window[0], second.result  # it ran steps of its own
    assert second.status is EventStatus.DONE and second.result["checks"]["recurrence"]["ok"], second.result
    assert inc.state is IncidentState.RESOLVED

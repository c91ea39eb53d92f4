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
from tests.runtime.harness import FakeRanks, FakeWorkers, spikes_once

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

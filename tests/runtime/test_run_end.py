"""The end of a run, on the real controller with fake workers (tests/runtime/harness.py): the last
steps are analysed like any other before the final checkpoint is marked, and a run that ends
cleanly -- after a resolved incident too -- ends with `latest` on its last checkpoint, healthy."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, calm, saver

LEAN = str(Path(__file__).parent / "policies" / "lean.yaml")


def diverges_once(at: int) -> Any:
    """From step ``at`` the loss (and with ``grads_follow_loss`` the gradients and updates) climbs,
    on the first timeline only: a rollback before ``at`` cures it."""
    seen = {"max": 0, "cured": False}

    def loss(step: int, rank: int) -> float:
        seen["cured"] = seen["cured"] or step < seen["max"]  # the trace went back: rolled back
        seen["max"] = max(seen["max"], step)
        if step < at or seen["cured"]:
            return calm(step, rank)
        return calm(step, rank) * (1.0 + 0.6 * (step - at + 1))

    return loss


def run(tmp_path: Path, ranks: FakeRanks, name: str = "end", max_steps: int = 200) -> Controller:
    job = make_job(tmp_path, name, max_steps=max_steps, policy=LEAN, resources={"num_workers": 1},
                   checkpoint={"every_steps": 25, "keep": 20})  # fmt: skip
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    ranks.run(ctl, lambda: ctl.phase.is_terminal, limit=4000, checkpoint_every=25)
    return ctl


def test_a_late_fault_handled_before_the_end_leaves_latest_on_the_last_checkpoint_healthy(
    tmp_path: Path,
) -> None:
    """Issue 25: a fault 5 steps before the end is rolled back, re-trained, observed and resolved;
    the re-trained last checkpoint is marked like any other: healthy, and `latest` names it."""
    ranks = FakeRanks(1, 200, diverges_once(195), grads_follow_loss=True)
    ctl = run(tmp_path, ranks)
    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    [inc] = ctl.incidents.list_incidents(job="end")
    assert inc.state is IncidentState.RESOLVED
    rollback = next(e for e in ctl.incidents.timeline(inc.id) if e.kind is EventKind.ROLLED_BACK)
    assert rollback.result["to_step"] < 195
    assert ctl.checkpoints.latest() == 200
    assert ctl.checkpoints.manifest(200).health is HealthMark.HEALTHY


class LateUpdateJump(FakeRanks):
    """From step ``at`` the update ratio is 38x its level (an LR 40x too high, as the demo's fault)
    while the loss has not moved yet -- on the first timeline only: a rollback before ``at`` cures it."""

    at: int = 0
    cured: bool = False

    def record(self, step: int, rank: int, events: list[str] | None = None) -> dict[str, Any]:
        rec = super().record(step, rank, events)
        self.cured = self.cured or step < getattr(self, "_high", 0)
        self._high = max(getattr(self, "_high", 0), step)
        if step >= self.at and not self.cured:
            rec["update_norm"] *= 38.0
        return rec


@pytest.mark.parametrize("at", [199, 200])
def test_a_spike_in_the_last_steps_is_an_incident_before_the_final_checkpoint_is_marked(
    tmp_path: Path, at: int
) -> None:
    """Issue 29 point 2: the update ratio jumps at the last step or the one before; no later step
    can confirm it, so the end of the run judges it as it stands -- an incident, handled (rolled
    back to before it, re-trained, `latest` on the re-trained last checkpoint, healthy) or left
    to a person with exit code 1 and `latest` on the newest healthy checkpoint before it."""
    ranks = LateUpdateJump(1, 200)
    ranks.at = at
    ctl = run(tmp_path, ranks)
    found = ctl.incidents.list_incidents(job="end")
    assert found, f"no incident for the update jump at step {at}; ended {ctl.status()}"
    assert found[0].onset_step == at
    latest = ctl.checkpoints.latest()
    assert latest is not None and ctl.checkpoints.manifest(latest).health is HealthMark.HEALTHY
    if ctl.phase is JobPhase.FINISHED:
        rollback = next(e for e in ctl.incidents.timeline(found[0].id) if e.kind is EventKind.ROLLED_BACK)
        assert rollback.result["to_step"] < at and ranks.cured
        assert latest == 200
    else:
        assert ctl.phase.exit_code == 1 and latest < at


def test_a_clean_run_ends_on_its_last_checkpoint_healthy_with_no_incident(tmp_path: Path) -> None:
    """The control: the end judged like any other step opens nothing on a clean run."""
    ctl = run(tmp_path, FakeRanks(1, 200))
    assert ctl.phase is JobPhase.FINISHED and not ctl.incidents.list_incidents(job="end")
    assert ctl.checkpoints.latest() == 200
    assert ctl.checkpoints.manifest(200).health is HealthMark.HEALTHY


class Timed(FakeRanks):
    """Ranks that report each step's own ``step_time``; every record sent is kept, in order."""

    sent: list[tuple[int, float]]

    def record(self, step: int, rank: int, events: list[str] | None = None) -> dict[str, Any]:
        rec = super().record(step, rank, events)
        if not hasattr(self, "sent"):
            self.sent = []
        rec["step_time"] = 0.002 + 0.0005 * (step % 7) + 0.001 * len(self.sent) / 1000
        self.sent.append((step, rec["step_time"]))
        return rec


class TickingClock:
    """The supervisor's wall clock in a test: each reading 10 ms after the one before, so the run's
    wall time and the time it stood still follow from what the supervisor did, never from how
    busy the machine running the test was (the rest of ``time`` is the real one)."""

    def __init__(self) -> None:
        self.now = time.time()

    def time(self) -> float:
        self.now += 0.01
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def test_time_lost_to_instability_against_an_independent_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: per incident the steps re-trained and the time spent re-training them; per run the
    effective training time ratio -- each against the records the ranks sent, recounted here."""
    clock = TickingClock()
    monkeypatch.setattr("supervisor.runtime.controller.time", clock)
    monkeypatch.setattr("supervisor.observability.time_lost.time", clock)
    ranks = Timed(1, 200, diverges_once(195), grads_follow_loss=True)
    before = clock.time()
    ctl = run(tmp_path, ranks)
    after = clock.time()
    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    [inc] = ctl.incidents.list_incidents(job="end")
    rolled = [e for e in ctl.incidents.timeline(inc.id) if e.kind is EventKind.ROLLED_BACK]
    [(frm, to)] = [(e.result["from_step"], e.result["to_step"]) for e in rolled]
    # Independently: the final timeline holds, for each step, the last record sent for it; the
    # re-trained steps are those sent again after the rollback, up to where it left.
    final: dict[int, float] = {}
    retrain, back = 0.0, False
    for i, (step, spent) in enumerate(ranks.sent):
        back = back or (i > 0 and step <= ranks.sent[i - 1][0])
        if back and step <= frm:
            retrain += spent
        final[step] = spent
    effective = sum(final.values())
    lost = next(e.payload["time_lost"] for e in ctl.incidents.timeline(inc.id) if "time_lost" in e.payload)
    assert lost["steps_retrained"] == frm - to > 0
    assert lost["retrain_s"] == pytest.approx(retrain, abs=0.01)
    assert lost["downtime_s"] > 0
    summary = ctl.status()["time_lost"]
    assert summary["effective_s"] == pytest.approx(effective, abs=0.01)
    assert summary["steps_retrained"] == frm - to
    assert summary["downtime_s"] == pytest.approx(ctl.state.downtime_s, abs=0.01)
    # The run's wall time is read from the supervisor's clock when it started and ended, inside the
    # test's own readings; the ratio is the recounted effective time over it, to the summary's
    # rounding (4 decimals). The ticking clock makes the wall longer than the step times the ranks
    # reported, so the ratio is the quotient, not its cap at 1.
    wall = ctl.time_lost.s["ended_at"] - ctl.time_lost.s["started_at"]
    assert before < ctl.time_lost.s["started_at"] < ctl.time_lost.s["ended_at"] < after
    assert summary["wall_s"] == round(wall, 2) and effective < wall
    assert summary["effective_training_time_ratio"] == pytest.approx(effective / wall, abs=6e-5)
    from supervisor.incidents.postmortem import build_postmortem
    from supervisor.incidents.render import render_report

    impact = build_postmortem(ctl.incidents, inc.id).impact
    assert impact.recompute_s == pytest.approx(retrain, abs=0.01)  # measured, not steps x median
    assert impact.downtime_s == lost["downtime_s"] and impact.steps_lost == frm - to
    assert "Re-training of lost steps" in render_report(ctl.incidents, inc.id, "md")
    text = ctl.observability.metrics.render().decode()
    assert f'spike_supervisor_steps_retrained_total{{training_job="end"}} {float(frm - to)}' in text
    assert 'spike_supervisor_effective_training_time_ratio{training_job="end"}' in text


class SavesAfterTheEnd(FakeRanks):
    """A framework that writes its final checkpoint once training has ended (an HF ``Trainer``
    saves after its last step's callbacks): committed to the store, never reported in a record."""

    def apply(self, ctl: Controller, d: dict[str, Any]) -> None:
        super().apply(ctl, d)
        if d["kind"] == "finish" and self.ended and self.on_checkpoint is not None:
            self.on_checkpoint(self.step)


def test_a_final_checkpoint_saved_after_the_last_record_is_verified_and_healthy(tmp_path: Path) -> None:
    """Issue 25: a clean framework run ended with `latest` on an unverified checkpoint."""
    ranks = SavesAfterTheEnd(1, 190)
    ctl = run(tmp_path, ranks, max_steps=190)  # 190: no periodic save at the last step
    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    assert ctl.checkpoints.manifest(190).health is HealthMark.HEALTHY
    assert ctl.checkpoints.latest() == 190

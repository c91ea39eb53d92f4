"""The end of a run, on the real controller with fake workers (tests/runtime/harness.py): the last
steps are analysed like any other before the final checkpoint is marked, and a run that ends
cleanly -- after a resolved incident too -- ends with `latest` on its last checkpoint, healthy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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

"""A replay asked for while the workers hold at their last step runs on the ranks (they are
alive and hold the state), not on the offline single-process path; real controller, fake
workers (tests/runtime/harness.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.incidents import EventKind, EventStatus
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, saver, spikes_once

REPLAY = str(Path(__file__).parent / "policies" / "replay.yaml")


@pytest.mark.slow
def test_a_replay_at_the_end_of_training_runs_on_the_held_ranks(tmp_path: Path) -> None:
    job = make_job(tmp_path, "held", max_steps=200, policy=REPLAY, resources={"num_workers": 1},
                   checkpoint={"every_steps": 25, "keep": 20})  # fmt: skip
    ranks = FakeRanks(1, 200, spikes_once(198), grads_follow_loss=True)
    ranks.replay_result = {"verdict": "data", "why": "suspect loss 23 vs control 2.8: reproduces"}
    ctl = Controller(job, FAST, workers=FakeWorkers(ranks))
    ranks.on_checkpoint = saver(ctl)
    ctl.boot()
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)
    assert ctl.phase is JobPhase.FINISHED, ctl.status()
    assert ranks.replays_at == [200]  # on the rank, while it held at its last step
    assert not ctl.tasks  # no offline replay task was started
    [inc] = ctl.incidents.list_incidents(job="held")
    replayed = next(e for e in ctl.incidents.timeline(inc.id) if e.kind is EventKind.REPLAYED)
    assert replayed.status is EventStatus.DONE and replayed.result["verdict"] == "data"
    assert "directive" in replayed.payload["memo"] and not replayed.payload["memo"].get("offline")

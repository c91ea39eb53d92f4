"""The rollback target is searched in rank 0's process when it can, with the supervisor's answer.

Rank 0 has torch and DCP loaded by training, and the target's deep re-verification opens every
file with them; the supervisor would import both for it (~5 CPU-s of each rollback). The rank
runs the very same search (``checkpoint.lifecycle.pick_rollback_target``) on the same store: the same target,
the same verification, the same one-line reason when none qualifies. When the rank cannot
answer, the supervisor searches itself.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint  # noqa: F401  # loaded, as in a rank that has trained

from supervisor.checkpoint import verify
from supervisor.checkpoint.lifecycle import open_checkpoint_store, pick_rollback_target
from supervisor.checkpoint.training_state import save_training_state
from supervisor.errors import CheckpointError
from supervisor.ranks.worker import TrainWorker
from supervisor.runtime.controller import Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers


def job_with_checkpoints(tmp_path: Path, steps: tuple[int, ...]) -> Any:
    job = make_job(tmp_path, "target", resources={"num_workers": 1})
    store = open_checkpoint_store(job)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        save_training_state(store, step, rank=0, world_size=1, model=model, optimizer=optimizer)
        assert verify(store, step, expected_world_size=1, by="test").ok
    return job


def test_the_rank_finds_what_the_supervisor_finds(tmp_path: Path) -> None:
    job = job_with_checkpoints(tmp_path, (10, 20, 30))
    rank0 = SimpleNamespace(job=job, world_size=1)
    found = TrainWorker.rollback_target(rank0, 25, "verified")  # type: ignore[arg-type]
    here = pick_rollback_target(open_checkpoint_store(job), max_step=25, min_mark="verified", world_size=1)
    assert found is not None and (found["step"], found["verification"]) == here == (20, here[1])
    with pytest.raises(CheckpointError) as none_here:
        pick_rollback_target(open_checkpoint_store(job), max_step=5, min_mark="verified", world_size=1)
    assert TrainWorker.rollback_target(rank0, 5, "verified") == {"error": str(none_here.value)}  # type: ignore[arg-type]


class RankAnswers(FakeWorkers):
    def __init__(self, answer: dict[str, Any] | None) -> None:
        super().__init__(FakeRanks(1, 50))
        self.answer = answer
        self.asked: list[tuple[int, str]] = []

    def rollback_target(self, max_step: int, min_mark: str) -> dict[str, Any] | None:
        self.asked.append((max_step, min_mark))
        return self.answer


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (
            {"step": 20, "verification": {"ok": True, "health": "healthy"}},
            (20, {"ok": True, "health": "healthy"}),
        ),
        (None, "here"),  # the rank cannot answer: the supervisor's own search
        ({"error": "no healthy checkpoint at or before step 5"}, CheckpointError),
    ],
)
def test_the_controller_takes_the_ranks_answer_or_searches_itself(
    tmp_path: Path, answer: Any, expected: Any
) -> None:
    job = job_with_checkpoints(tmp_path, (10, 20))
    workers = RankAnswers(answer)
    ctl = Controller(job, FAST, workers=workers)
    if expected is CheckpointError:
        with pytest.raises(CheckpointError, match="no healthy checkpoint at or before step 5"):
            ctl.rollback_target(5, "verified")
    elif expected == "here":
        assert ctl.rollback_target(25, "verified")[0] == 20
    else:
        assert ctl.rollback_target(25, "verified") == expected
    assert workers.asked == [(5 if expected is CheckpointError else 25, "verified")]

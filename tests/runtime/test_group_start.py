"""A worker group that does not start in time (a loaded host, a slow Ray) is a worker start
failure: retried within the restart budget, and if it keeps failing the job ends `failed` with
exit code 3 (Ray failed), saying so -- never "the supervisor loop crashed"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ray.exceptions import GetTimeoutError

from supervisor.config.runtime import RuntimeSettings
from supervisor.runtime import group as group_mod
from supervisor.runtime.controller import Controller
from supervisor.runtime.group import WorkerGroup, WorkerStartError
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers

HOLD = str(Path(__file__).parent / "policies" / "hold.yaml")


class _Ref:
    def __init__(self, what: str) -> None:
        self.what = what


class _Method:
    def __init__(self, what: str) -> None:
        self.what = what

    def remote(self, *args: Any) -> _Ref:
        return _Ref(self.what)


class _Actor:
    def __init__(self) -> None:
        self.address = _Method("address")
        self.start = _Method("start")


class _Options:
    def remote(self, *args: Any) -> _Actor:
        return _Actor()


class _RemoteWorker:
    @staticmethod
    def options(**kwargs: Any) -> _Options:
        return _Options()


class _PG:
    def ready(self) -> _Ref:
        return _Ref("ready")


def test_a_rank_that_does_not_answer_in_time_is_a_start_failure_and_the_group_is_taken_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed: list[Any] = []
    removed: list[Any] = []

    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(ref, _Ref) and ref.what == "ready":
            return None
        raise GetTimeoutError("Get timed out: some object(s) not ready.")

    monkeypatch.setattr(group_mod, "placement_group", lambda *a, **k: _PG())
    monkeypatch.setattr(group_mod, "PlacementGroupSchedulingStrategy", lambda *a, **k: None)
    monkeypatch.setattr(group_mod, "RemoteWorker", _RemoteWorker)
    monkeypatch.setattr(group_mod, "remove_placement_group", removed.append)
    monkeypatch.setattr(group_mod.ray, "get", get)
    # The placement group is placed at once (the wait polls it; the ranks are what stay silent).
    monkeypatch.setattr(group_mod.ray, "wait", lambda refs, timeout=None: (list(refs), []))
    monkeypatch.setattr(group_mod.ray, "kill", lambda actor, no_restart=True: killed.append(actor))
    job = make_job(tmp_path, "slowstart")
    group = WorkerGroup(job, RuntimeSettings(), generation=0)
    with pytest.raises(WorkerStartError) as err:
        group.launch(None, ready_timeout_s=7)
    assert "did not answer within 7s" in str(err.value) and err.value.exit_code == 3
    assert len(killed) == 2 and len(removed) == 1 and group.workers == [] and group.pg is None


def _setup(tmp_path: Path, fails: int) -> tuple[FakeRanks, FakeWorkers, Controller]:
    job = make_job(tmp_path, "start", max_steps=40, policy=HOLD)
    ranks = FakeRanks(2, 40)
    workers = FakeWorkers(ranks)
    workers.fail_launch = [WorkerStartError("rank 0 did not answer within 120s") for _ in range(fails)]
    return ranks, workers, Controller(job, FAST, workers=workers)


def test_a_start_that_fails_once_is_retried_and_the_job_runs(tmp_path: Path) -> None:
    ranks, workers, ctl = _setup(tmp_path, fails=1)
    ctl.boot()
    assert ctl.phase is JobPhase.RUNNING and len(workers.launches) == 1
    gen, _, _ = workers.launches[0]
    assert gen == 1  # a fresh generation's names: the failed one's may still be registered
    assert len(ctl.state.restart_steps) == 1  # the retry counted in the restart budget
    ranks.run(ctl, lambda: ctl.phase.is_terminal)
    assert ctl.phase is JobPhase.FINISHED and ctl.status()["exit_code"] == 0


def test_a_start_that_keeps_failing_ends_the_job_failed_with_exit_3(tmp_path: Path) -> None:
    # hold.yaml: restarts.max_restarts=2 -> one start and two retries.
    _, workers, ctl = _setup(tmp_path, fails=5)
    phase = ctl.run()
    assert phase is JobPhase.FAILED and workers.launches == [] and len(workers.fail_launch) == 2
    st = ctl.status()
    assert st["exit_code"] == 3, st
    assert "worker group did not start after 3 attempt(s)" in st["reason"]
    assert "restarts.max_restarts=2" in st["reason"] and "crashed" not in st["reason"]

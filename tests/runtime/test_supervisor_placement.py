"""The supervisor actor is pinned to the head node with a hard constraint: a worker node's loss
must never take it down, wherever the launching driver's raylet happens to be."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.client import api
from tests.runtime.conftest import FAST

HEAD, WORKER = "a" * 56, "b" * 56


def _nodes(*, head_alive: bool = True) -> list[dict[str, Any]]:
    return [
        {"NodeID": WORKER, "Alive": True, "Resources": {"CPU": 2.0, f"node:{WORKER}": 1.0}},
        {"NodeID": HEAD, "Alive": head_alive,
         "Resources": {"CPU": 2.0, "node:__internal_head__": 1.0}},
    ]  # fmt: skip


def _options(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    """The options ``api.launch`` starts the supervisor actor with, launched from the worker node."""
    from tests.runtime.conftest import make_job

    seen: dict[str, Any] = {}

    class FakeRemote:
        def options(self, **kw: Any) -> Any:
            seen.update(kw)
            return SimpleNamespace(remote=lambda *a: "handle")

    def no_actor(*a: Any, **k: Any) -> Any:
        raise ValueError("no such actor")

    monkeypatch.setattr(api, "RemoteSupervisor", FakeRemote())
    monkeypatch.setattr(api.ray, "get_actor", no_actor)
    monkeypatch.setattr(api.ray, "nodes", lambda: nodes)
    monkeypatch.setattr(api.ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: WORKER))
    assert api.launch(make_job(tmp_path, "placed"), FAST) == "handle"
    return seen


def test_the_supervisor_is_pinned_to_the_head_node_not_the_drivers_worker_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    strategy = _options(monkeypatch, tmp_path, _nodes())["scheduling_strategy"]
    assert strategy.node_id == HEAD
    assert strategy.soft is False, "a soft request lets Ray place the supervisor on a worker node"


def test_without_a_live_head_the_supervisor_is_pinned_to_the_launching_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    strategy = _options(monkeypatch, tmp_path, _nodes(head_alive=False))["scheduling_strategy"]
    assert strategy.node_id == WORKER and strategy.soft is False


def test_the_supervisor_runs_with_few_malloc_arenas_and_its_niceness(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A long run's RSS grew with glibc's per-thread arenas in the 64-thread actor (ranks/names.py)."""
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    env = _options(monkeypatch, tmp_path, _nodes())["runtime_env"]["env_vars"]
    assert env == {"RAY_worker_niceness": str(FAST.niceness), "MALLOC_ARENA_MAX": "2"}
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the launching environment's own choice is kept
    assert _options(monkeypatch, tmp_path, _nodes())["runtime_env"]["env_vars"]["MALLOC_ARENA_MAX"] == "4"


def test_the_supervisor_records_no_ray_task_events(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Ray would record every call (each record batch, status read and directive poll) and report it
    to the control store; nothing reads them (bench.scale: ranks/names.supervisor_options)."""
    opts = _options(monkeypatch, tmp_path, _nodes())
    assert opts["enable_task_events"] is False and opts["max_concurrency"] == 64 and opts["num_cpus"] == 0

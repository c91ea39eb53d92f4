"""A lost node: the ranks it took with it are the ones named, and a group the live nodes cannot
hold fails at once instead of waiting out its placement timeout. Pure: no Ray is started."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.runtime import group as group_mod
from supervisor.runtime.group import GroupDoesNotFit, GroupHealth, WorkerGroup, shortfall
from supervisor.runtime.machinery import WorkerSupervision
from tests.runtime.conftest import FAST, make_job

HEAD, LOST = "h" * 56, "w" * 56


def _node(node_id: str, cpus: float, *, alive: bool = True, ip: str = "127.0.0.1") -> dict[str, Any]:
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": ip, "Resources": {"CPU": cpus}}


class FakeGroup:
    """The survivors fail first (rank 3 in a collective) while the lost node's ranks 0-1 say nothing."""

    def __init__(
        self, lost: dict[int, str], unreachable: list[int], first: GroupHealth | None = None
    ) -> None:
        self.rank_nodes = {0: LOST, 1: LOST, 2: HEAD, 3: HEAD}
        self._lost, self._unreachable = lost, unreachable
        self._first = first or GroupHealth(
            "failed", 3, "RuntimeError: Connection closed by peer [127.0.0.2]:40123"
        )

    def health(self) -> GroupHealth:
        return self._first

    def lost_ranks(self) -> dict[int, str]:
        return self._lost

    def unreachable_ranks(self) -> list[int]:
        return self._unreachable


def _watch(tmp_path: Path, group: FakeGroup) -> Any:
    sup = WorkerSupervision(make_job(tmp_path, "attrib", resources={"num_workers": 4}), FAST)
    sup.group = group  # type: ignore[assignment]
    return sup.watch([])


def test_the_ranks_of_a_node_ray_declared_dead_are_named_not_the_survivor_that_failed_first(
    tmp_path: Path,
) -> None:
    where = f"node 127.0.0.2 ({LOST[:12]})"
    event = _watch(tmp_path, FakeGroup({0: where, 1: where}, []))
    assert event.kind == "lost" and event.ranks == (0, 1)
    assert "127.0.0.2" in event.reason and "then rank 3 failed" in event.reason


def test_ranks_that_no_longer_answer_are_named_before_ray_declares_their_node_dead(tmp_path: Path) -> None:
    event = _watch(tmp_path, FakeGroup({}, [0, 1]))
    assert event.kind == "lost" and event.ranks == (0, 1)
    assert "do not answer" in event.reason and LOST[:12] in event.reason


def test_a_lost_rank_that_reported_first_is_named_with_the_others_of_its_node(tmp_path: Path) -> None:
    first = GroupHealth("lost", 0, "worker actor died: ActorUnavailableError")
    event = _watch(tmp_path, FakeGroup({}, [0, 1], first))
    assert event.kind == "lost" and event.ranks == (0, 1)


def test_a_killed_rank_alone_is_reported_as_it_died(tmp_path: Path) -> None:
    first = GroupHealth("lost", 2, "worker actor died: ActorDiedError")
    event = _watch(tmp_path, FakeGroup({}, [2], first))
    assert event.kind == "lost" and event.ranks == (2,) and event.reason == first.reason


def test_a_rank_that_failed_with_every_other_rank_answering_is_named_itself(tmp_path: Path) -> None:
    event = _watch(tmp_path, FakeGroup({}, []))
    assert event.kind == "failed" and event.ranks == (3,)


def test_shortfall_counts_whole_bundles_on_the_live_nodes_only() -> None:
    both = [_node(HEAD, 2), _node(LOST, 2, ip="127.0.0.2")]
    assert shortfall({"CPU": 1.0}, 4, both) is None
    assert shortfall({"CPU": 0.5}, 8, both) is None
    assert shortfall({"CPU": 1.5}, 2, both) is None  # one bundle per node
    assert shortfall({"CPU": 1.5}, 3, both) is not None  # 3 CPUs in all, but no node holds two
    one = [_node(HEAD, 2), _node(LOST, 2, alive=False, ip="127.0.0.2")]
    why = shortfall({"CPU": 1.0}, 4, one)
    assert why is not None and "hold 2 of them" in why and "127.0.0.2" in why and "CPU 2 in all" in why
    assert shortfall({"CPU": 1.0, "GPU": 1.0}, 1, both) is not None  # no GPU anywhere


def test_a_group_the_live_nodes_cannot_hold_fails_at_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    group = WorkerGroup(make_job(tmp_path, "unfit", resources={"num_workers": 4}), FAST, 1)
    monkeypatch.setattr(group_mod, "placement_group", lambda *a, **k: SimpleNamespace(ready=lambda: "ref"))
    monkeypatch.setattr(group, "shutdown", lambda: None)
    monkeypatch.setattr(group_mod.ray, "wait", lambda refs, timeout: ([], refs))
    monkeypatch.setattr(group_mod.ray, "nodes", lambda: [_node(HEAD, 2), _node(LOST, 2, alive=False)])
    t0 = time.monotonic()
    with pytest.raises(GroupDoesNotFit, match="hold 2 of them"):
        group._place({"CPU": 1.0}, timeout_s=120.0)
    assert time.monotonic() - t0 < 5.0


@contextlib.contextmanager
def _raylets() -> Iterator[tuple[int, int]]:
    """(port of a raylet that answers, port of one that is gone): a listening socket and a closed one."""
    live, gone = socket.socket(), socket.socket()
    try:
        live.bind(("127.0.0.1", 0))
        live.listen()
        gone.bind(("127.0.0.1", 0))
        port = gone.getsockname()[1]
        gone.close()
        yield live.getsockname()[1], port
    finally:
        live.close()


def _placed_group(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    ports: tuple[int, int],
    first: GroupHealth,
    unreachable: list[int],
) -> WorkerGroup:
    """A group of 4 ranks, 0-1 on the head, 2-3 on a node whose raylet is gone but which Ray still
    counts alive (its health checks have not failed yet)."""
    group = WorkerGroup(make_job(tmp_path, "raylet", resources={"num_workers": 4}), FAST, 1)
    group.rank_nodes = {0: HEAD, 1: HEAD, 2: LOST, 3: LOST}
    nodes = [_node(HEAD, 2) | {"NodeManagerPort": ports[0]}, _node(LOST, 2) | {"NodeManagerPort": ports[1]}]
    monkeypatch.setattr(group_mod.ray, "nodes", lambda: nodes)
    monkeypatch.setattr(group, "health", lambda: first)
    monkeypatch.setattr(group, "unreachable_ranks", lambda timeout_s=5.0: unreachable)
    return group


def test_a_rank_of_the_lost_node_that_reported_a_collective_error_first_is_a_lost_rank(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # Rank 2 (on the lost node) reports first, as a failure in its collective; rank 3 no longer
    # answers; rank 2's actor still answers for a moment: the whole node's ranks are named lost.
    first = GroupHealth("failed", 2, "RuntimeError: [gloo] Connection reset by peer")
    with _raylets() as ports:
        group = _placed_group(monkeypatch, tmp_path, ports, first, unreachable=[3])
        assert set(group.lost_ranks()) == {2, 3}
        sup = WorkerSupervision(make_job(tmp_path, "raylet", resources={"num_workers": 4}), FAST)
        sup.group = group
        event = sup.watch([])
    assert event.kind == "lost" and event.ranks == (2, 3), event
    assert "127.0.0.1" in event.reason and "then rank" not in event.reason


def test_a_survivor_that_failed_first_is_not_named_when_the_lost_nodes_raylet_is_gone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    first = GroupHealth("failed", 0, "RuntimeError: [gloo] Connection reset by peer")
    with _raylets() as ports:
        group = _placed_group(monkeypatch, tmp_path, ports, first, unreachable=[])
        sup = WorkerSupervision(make_job(tmp_path, "raylet", resources={"num_workers": 4}), FAST)
        sup.group = group
        event = sup.watch([])
    assert event.kind == "lost" and event.ranks == (2, 3), event
    assert "then rank 0 failed" in event.reason


def test_every_raylet_answering_names_no_node(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = GroupHealth("failed", 2, "RuntimeError: training raised")
    with _raylets() as (live, _gone):
        group = _placed_group(monkeypatch, tmp_path, (live, live), first, unreachable=[])
        assert group.lost_ranks() == {}
        sup = WorkerSupervision(make_job(tmp_path, "raylet", resources={"num_workers": 4}), FAST)
        sup.group = group
        event = sup.watch([])
    assert event.kind == "failed" and event.ranks == (2,)

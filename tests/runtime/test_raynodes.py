"""The two-node test's `ray start` ports: a worker port range never holds another port of the node
(`ray start` refused one that held its runtime-env agent's port, and the head never listened).
Pure: nothing is started."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.runtime import raynodes
from tests.runtime.raynodes import WORKER_PORTS, worker_ports_low


def test_a_worker_port_range_holding_another_port_of_the_node_is_not_chosen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offered = iter([[50179], [65500], [40000]])
    monkeypatch.setattr(raynodes, "free_ports", lambda n, host="127.0.0.1": next(offered))
    low = worker_ports_low([33801, 50211])  # 50179..50239 holds 50211; 65500.. passes 65535
    assert low == 40000 and not any(low <= p < low + WORKER_PORTS for p in (33801, 50211))


def test_a_ray_start_that_exited_says_why_at_once(tmp_path: Path) -> None:
    node = raynodes.RayNode.__new__(raynodes.RayNode)
    node.ip, node.log_path = "127.0.0.9", tmp_path / "ray-start.log"
    node.log_path.write_text("ValueError: Ray component worker_ports is trying to use a port number 50211\n")
    node.log = node.log_path.open("ab")
    node.proc = raynodes.subprocess.Popen(["true"])
    node.proc.wait()
    with pytest.raises(RuntimeError, match="exited 0: ValueError: Ray component worker_ports"):
        node.running()
    node.log.close()


def test_a_worker_node_whose_raylet_missed_rays_startup_wait_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray gives a joining raylet 30 s to register; at load 20 the slow half's two-node test saw
    `ray start` exit with this line, and the test failed before it began."""
    started: list[raynodes.RayNode] = []

    class Node(raynodes.RayNode):
        def __init__(self, ip: str, temp_dir: Path, **_kw: object) -> None:
            first = not started
            self.ip, self.head, self.seen = ip, False, {}
            self.log_path = tmp_path / f"ray-start-{len(started)}.log"
            self.log_path.write_bytes(b"Exception: The current node timed out during startup.\n" if first
                                      else raynodes.STARTED + b"\n")  # fmt: skip
            self.log = self.log_path.open("ab")
            cmd = ["true"] if first else [sys.executable, "-c", "import time; time.sleep(60)"]
            self.proc = raynodes.subprocess.Popen(cmd, start_new_session=True)
            started.append(self)

    monkeypatch.setattr(raynodes, "RayNode", Node)
    node = raynodes.join("127.0.0.9", tmp_path, "127.0.0.1:1", num_cpus=1, env={})
    try:
        assert len(started) == 2 and node is started[1]
        assert started[0].proc.poll() is not None and started[0].log.closed  # the first one was stopped
    finally:
        node.stop()
    assert node.proc.poll() is not None

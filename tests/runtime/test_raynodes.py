"""The two-node test's `ray start` ports: a worker port range never holds another port of the node
(`ray start` refused one that held its runtime-env agent's port, and the head never listened).
Pure: nothing is started."""

from __future__ import annotations

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

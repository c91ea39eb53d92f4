"""The torchrun-compatible worker contract, piece by piece: topology, environment, socket, stop."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.job import JobSpec
from supervisor.errors import ConfigError
from supervisor.ranks.entrypoint import resolve
from supervisor.ranks.process import RankProcess, Topology, child_env, command_line, describe_exit
from supervisor.ranks.process_link import LinkServer
from supervisor.ranks.process_logs import LogKeeper, generations, read_segments
from supervisor.sdk.directives import Freeze
from supervisor.sdk.local_link import LocalLink
from supervisor.storage import open_backend


def job(tmp_path: Path, **over: Any) -> JobSpec:
    spec = {"name": "j", "entrypoint": "python -m pkg.train --lr 3e-4", "max_steps": 10,
            "storage": {"path": str(tmp_path)}, "resources": {"num_workers": 4, "gpus_per_worker": 1}}  # fmt: skip
    return JobSpec.model_validate({**spec, **over})


def test_topology_follows_ray_placement_like_torchrun_nodes() -> None:
    peers = [("nodeA", ["3"]), ("nodeB", ["0"]), ("nodeA", ["5"]), ("nodeB", ["1"])]
    t2 = Topology.from_peers(2, peers, "10.0.0.1", 29500)
    assert (t2.local_rank, t2.local_world_size, t2.group_rank, t2.group_world_size) == (1, 2, 0, 2)
    assert t2.cuda_devices == ("3", "5")  # LOCAL_RANK indexes the node's GPUs, in local-rank order
    t3 = Topology.from_peers(3, peers, "10.0.0.1", 29500)
    assert (t3.local_rank, t3.group_rank, t3.cuda_devices) == (1, 1, ("0", "1"))


def test_child_env_is_torchrun_env_plus_supervisor_connection(tmp_path: Path) -> None:
    spec = job(tmp_path)
    topo = Topology.from_peers(2, [("a", ["3"]), ("b", ["0"]), ("a", ["5"]), ("b", ["1"])], "10.0.0.1", 29500)
    env = child_env(spec, topo, socket_path="/tmp/s", resume_step=40, generation=2, max_restarts=3)
    want = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "3,5",
            "SUPERVISOR_SOCKET": "/tmp/s", "SUPERVISOR_RESUME_STEP": "40", "SUPERVISOR_GENERATION": "2",
            "TORCHELASTIC_RESTART_COUNT": "2"}  # fmt: skip
    assert {k: env[k] for k in want} == want
    assert JobSpec.model_validate_json(env["SUPERVISOR_JOB"]) == spec
    fresh = child_env(spec, topo, socket_path="/tmp/s", resume_step=None, generation=0, max_restarts=3)
    assert "SUPERVISOR_RESUME_STEP" not in fresh


def test_command_forms(tmp_path: Path) -> None:
    assert command_line(job(tmp_path)) == [sys.executable, "-m", "pkg.train", "--lr", "3e-4"]
    script = job(tmp_path, entrypoint="train.py", args=["--steps", "5"])
    assert script.is_command and command_line(script) == [sys.executable, "train.py", "--steps", "5"]
    assert not job(tmp_path, entrypoint="train.py").is_command  # main(config, ctx) in the actor, as before
    with pytest.raises(ValueError, match="args"):
        job(tmp_path, entrypoint="pkg.train:main", args=[])


def test_a_script_without_main_points_to_args(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text("x = 1\n")
    with pytest.raises(ConfigError, match="main"):
        resolve(str(script))


class Link:
    """The worker actor's SupervisorLink as the socket server sees it: a sink and a directive queue."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.directives: deque[dict[str, Any]] = deque()
        self.got = threading.Event()

    def sink(self, batch: list[dict[str, Any]]) -> None:
        self.records.extend(batch)
        self.got.set()

    def take_directives(self) -> list[dict[str, Any]]:
        out = list(self.directives)
        self.directives.clear()
        return out


def test_socket_carries_records_up_and_directives_down() -> None:
    link = Link()
    server = LinkServer(link, poll_interval_s=0.01)
    client = LocalLink(server.path)
    try:
        client.send([{"step": 1, "loss": float("nan")}, {"step": 2, "loss": 1.5}])
        assert link.got.wait(10)
        assert [r["step"] for r in link.records] == [1, 2] and link.records[0]["loss"] != link.records[0][
            "loss"
        ]
        link.directives.append(Freeze(reason="incident 1", id="d1").to_dict())
        deadline = time.monotonic() + 10
        got: list[Any] = []
        while not got and time.monotonic() < deadline:
            got = client.directives()
            time.sleep(0.01)
        assert [(d.kind, d.id) for d in got] == [("freeze", "d1")]
    finally:
        client.close()
        server.close()
    assert not os.path.exists(server.path)


def test_stop_is_sigterm_then_sigkill_after_the_grace() -> None:
    polite = RankProcess([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ))
    polite.start()
    assert describe_exit(polite.terminate(grace_s=10)) == "killed by SIGTERM"
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    stubborn = RankProcess([sys.executable, "-c", code], dict(os.environ))
    out = stubborn.start()
    assert out.readline().strip() == b"ready"  # the handler is installed
    t0 = time.monotonic()
    assert stubborn.terminate(grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - t0 >= 0.5


def test_process_output_is_kept_per_rank_and_bounded(tmp_path: Path) -> None:
    backend = open_backend(str(tmp_path))
    keeper = LogKeeper(backend, "j", 1, 0, segment_bytes=4000, upload_interval_s=0.05)
    code = "for i in range(400): print(f'line {i:04d} ' + 'x' * 20, flush=True)"
    proc = RankProcess([sys.executable, "-c", code], dict(os.environ))
    reader = keeper.follow(proc.start())
    assert proc.wait() == 0
    reader.join(10)
    keeper.close()
    older, live = read_segments(backend, "j", 1, 0)
    assert len(older) <= 4000 and len(live) <= 4000
    assert (older + live).decode().splitlines()[-1].startswith("line 0399")
    assert generations(backend, "j") == {1: [0]}

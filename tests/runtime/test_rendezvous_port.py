"""The rendezvous port is rank 0's from the moment it is named: nothing else can take it.

Reported: ``TrainWorker.address()`` bound port 0, read the port and closed the socket; rank 0's
``TCPStore`` bound it again only when training began. A process taking the port in between (another
job's ranks, Ray) made rank 0 fail with EADDRINUSE at rendezvous, and the supervisor opened a
restart incident on a clean run. Here a thief binds the named port at the worst moment, right
after rank 0 named it and before any rank started; the group must start and run clean anyway.
"""

from __future__ import annotations

import errno
import json
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.runtime import RuntimeSettings
from supervisor.ranks.process import Topology, child_env
from supervisor.ranks.worker import TrainWorker
from tests.runtime.conftest import FAST, make_job, wait_for

SMALL = "--d-model 32 --layers 1 --data-bytes 100000"
"""The torchrun example at the size of the in-process tinylm jobs here."""


def _worker(tmp_path: Path) -> TrainWorker:
    job = make_job(tmp_path, "rdzv")
    return TrainWorker(job.model_dump(mode="json"), 0, 2, 0, RuntimeSettings().model_dump())


def _try_bind(port: int) -> int:
    """0 when a listening socket could take ``port`` (then released), else the errno."""
    thief = socket.socket()
    try:
        thief.bind(("", port))
        thief.listen()
    except OSError as exc:
        return exc.errno or -1
    finally:
        thief.close()
    return 0


def test_the_named_port_is_held_until_the_worker_goes(tmp_path: Path) -> None:
    import torch.distributed as dist

    worker = _worker(tmp_path)
    addr, port = worker.address()
    assert _try_bind(port) == errno.EADDRINUSE  # held from the moment it was named
    assert worker.address() == (addr, port)  # asked again: the same store, not a second port
    client = dist.TCPStore(addr, port, world_size=2, is_master=False, timeout=timedelta(seconds=10))
    client.set("k", "v")  # a rank connects to the store rank 0's actor hosts
    assert client.get("k") == b"v"


def test_a_command_rank_connects_to_the_actors_store_as_under_torchrun(tmp_path: Path) -> None:
    """torchrun's agent hosts the store and says so (``TORCHELASTIC_USE_AGENT_STORE``): rank 0's
    ``env://`` init then connects to it instead of binding ``MASTER_PORT`` itself."""
    spec = make_job(tmp_path, "rdzv-cmd", entrypoint="python -m examples.torchrun.train", args=[])
    topo = Topology.from_peers(0, [("a", []), ("a", [])], "127.0.0.1", 29500)
    env = child_env(spec, topo, socket_path="/tmp/s", resume_step=None, generation=0, max_restarts=3)
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True" and env["MASTER_PORT"] == "29500"


def _thief_supervisor(record: str) -> Any:
    """A supervisor actor whose rank actors let a thief bind the rendezvous port as soon as rank 0
    named it; each try is one JSON line in ``record``. Defined here: Ray ships it by value."""
    import ray

    from supervisor.runtime.actor import SupervisorActor

    class ThiefWorker(TrainWorker):
        def address(self) -> tuple[str, int]:
            addr, port = super().address()
            self._thief = socket.socket()
            try:
                self._thief.bind(("", port))
                self._thief.listen()
                taken = 0
            except OSError as exc:
                self._thief.close()
                taken = exc.errno or -1
            with open(record, "a") as f:
                f.write(json.dumps({"generation": self.generation, "port": port, "refused": taken}) + "\n")
            return addr, port

    class ThiefSupervisor(SupervisorActor):
        def _worker_supervision(self, spec: Any, settings: Any) -> Any:
            from supervisor.runtime import group

            group.RemoteWorker = ray.remote(ThiefWorker)  # this actor's process only
            return None

    return ray.remote(ThiefSupervisor)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("kind", ["callable", "command"])
def test_a_port_taken_after_it_was_named_opens_no_incident(tmp_path: Path, kind: str) -> None:
    import ray

    from supervisor.client import api
    from supervisor.ranks.names import NAMESPACE, supervisor_name

    over: dict[str, Any] = {"max_steps": 30, "checkpoint": {"every_steps": 10}}
    if kind == "command":
        over["entrypoint"] = f"python -m examples.torchrun.train --steps 30 {SMALL}"
    job = make_job(tmp_path, f"rdzv-{kind}", **over)
    record = tmp_path / "thief.jsonl"
    handle = (
        _thief_supervisor(str(record))
        .options(name=supervisor_name(job.name), namespace=NAMESPACE, max_concurrency=64, num_cpus=0)
        .remote(job.model_dump(mode="json"), FAST.model_dump(), False)
    )
    try:
        # Ends at the first sign of the fault (a restart, an incident) rather than after the budget.
        st = wait_for(lambda: api.status(handle),
                      lambda s: s["terminal"] or s["incidents_total"] or s["group_restarts"], 300)  # fmt: skip
        tries = [json.loads(line) for line in record.read_text().splitlines()]
        assert st["incidents_total"] == 0 and st["group_restarts"] == 0, (st, tries)
        assert st["phase"] == "finished" and st["exit_code"] == 0 and st["step"] == 30, st
        # One launch; the thief tried the port rank 0 named and found it held (not merely closed).
        [tried] = tries
        assert tried["generation"] == 0 and tried["refused"] == errno.EADDRINUSE, tries
    finally:
        ray.kill(handle)

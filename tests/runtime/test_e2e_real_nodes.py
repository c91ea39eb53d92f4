"""Two real Ray nodes (`ray start --head` and `ray start --address=...`, 2 + 2 CPUs, on loopback
with their own temp folder and ports), a 4-rank job spread over both, the second node's raylet
killed by PID mid-incident (an LR fault's fix applied, its observation window begun): the
supervisor, pinned to the head, stays up; the group no longer fits the node left, so `launch`
fails at once with exit code 3 and one reason naming the lost node; the fault's incident names
the ranks that were on it, and the LR incident is escalated with its observation recorded as
cut short by the job's end, none of its actions left pending. With `resources.min_workers: 2`
(and the ranks reporting through a relay per node) the group goes on with the 2 ranks the head
holds instead, and the run ends at its last step.
Every process is stopped by PID.

How it differs from production: both nodes are on one machine (the second on 127.0.0.2, so a
driver's node is never ambiguous), and their resources are logical CPUs of the same cores."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from tenacity import Retrying, stop_after_attempt, wait_fixed

from supervisor.config.job import JobSpec
from supervisor.incidents import EventKind, EventStatus, IncidentState
from tests.runtime.raynodes import RayNode, join

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOB = "twonodes"


def _until(what: str, cond: Any, timeout_s: float, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s")
        time.sleep(every_s)


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture()
def two_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[RayNode, RayNode]]:
    root = Path(tempfile.mkdtemp(prefix="rn", dir="/tmp"))  # short: Ray's socket paths fit 107 bytes
    # Token authentication (Ray's default once a token exists) on every node and every driver:
    # Ray sends its token to an address given explicitly only in this mode.
    env = {"RAY_TMPDIR": str(root), "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "token"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    _reread_ray_config()  # this process is a driver too: Ray read RAY_AUTH_MODE once, maybe before
    nodes: list[RayNode] = []
    try:
        nodes.append(RayNode("127.0.0.1", root, num_cpus=2, env=env))
        _until("the head listens", lambda: nodes[0].running() and _listening(nodes[0].address), 90)
        nodes.append(join("127.0.0.2", root, nodes[0].address, num_cpus=2, env=env))
        yield nodes[0], nodes[1]
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(root, ignore_errors=True)
        monkeypatch.undo()
        _reread_ray_config()
    left = [p.pid for node in nodes for p in node.seen.values() if _running(p)]
    assert not left, f"processes the test started are still running: {left}"


def _reread_ray_config() -> None:
    """Ray caches its settings, the authentication mode among them, when it first reads them (an
    earlier test's import may have); re-read them from the environment, as Ray itself does when
    it turns token authentication on."""
    from ray._raylet import Config

    Config.initialize("")


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _job_file(tmp_path: Path, address: str, **over: Any) -> Path:
    spec: dict[str, Any] = {
        "name": JOB,
        "entrypoint": "examples.tinylm.train:main",
        "config": {
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2},
            "data": {"max_bytes_per_source": 100_000},
        },
        "resources": {"num_workers": 4, "cpus_per_worker": 1},
        "ray": {"address": address},
        "storage": {"path": str(tmp_path / "store")},
        "checkpoint": {"every_steps": 20},
        "telemetry": {"min_history": 50, "window": 200, "hang_timeout_s": 120},
        "max_steps": 2000,
        "faults": [{"kind": "lr_spike", "step": 60, "factor": 40}],
    }
    spec.update(over)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@contextlib.contextmanager
def _observing(
    tmp_path: Path, nodes: tuple[RayNode, RayNode], job_file: Path
) -> Iterator[tuple[subprocess.Popen[bytes], Any]]:
    """A driver on the head, the job launched, and its LR incident observing its fix (the launch
    process and the handle of its supervisor); the launch is killed and the driver shut down at the end."""
    import ray

    from supervisor.client import api
    from supervisor.ranks.names import NAMESPACE

    head, second = nodes
    # A driver's first GCS calls can miss their deadline on a loaded machine: a few tries.
    for attempt in Retrying(stop=stop_after_attempt(4), wait=wait_fixed(3), reraise=True):
        with attempt:
            ray.init(address=head.address, namespace=NAMESPACE, log_to_driver=False)
    launched = None
    try:
        _until(
            "two live nodes", lambda: second.running() and sum(1 for n in ray.nodes() if n["Alive"]) == 2, 90
        )
        log = (tmp_path / "launch.log").open("wb")
        launched = subprocess.Popen([str(BIN / "supervisor"), "launch", str(job_file)], cwd=ROOT,
                                    stdout=log, stderr=subprocess.STDOUT, env={**os.environ})  # fmt: skip
        # The job trains on both nodes; the LR fault's incident is rolled back, fixed, and observed.
        handle = _until("the supervisor actor", lambda: _find(api, JOB), 120)
        _until(
            "the LR incident observes its fix", lambda: _action(api, handle) == "observe", 400, every_s=0.5
        )
        yield launched, handle
    finally:
        if launched is not None and launched.poll() is None:
            launched.kill()
            launched.wait(timeout=30)
        ray.shutdown()


def test_a_worker_node_lost_mid_incident_fails_the_job_at_once_naming_its_ranks(
    tmp_path: Path, two_nodes: tuple[RayNode, RayNode]
) -> None:
    import ray

    from supervisor.client import api
    from supervisor.client.cluster import head_node_id
    from supervisor.config.runtime import RuntimeSettings
    from supervisor.incidents.paths import open_incident_store
    from supervisor.runtime.group import WorkerGroup

    head, second = two_nodes
    job_file = _job_file(tmp_path, head.address)
    job = JobSpec.model_validate(yaml.safe_load(job_file.read_text()))
    with _observing(tmp_path, two_nodes, job_file) as (launched, handle):
        # 1. The job trains on both nodes; its supervisor is on the head.
        head_id = head_node_id()
        second_id = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "127.0.0.2")
        assert api.status(handle)["supervisor_node"] == head_id
        group = WorkerGroup.find(job, RuntimeSettings.model_validate({}))
        assert group is not None
        placed = group.rank_nodes
        lost = sorted(r for r, n in placed.items() if n == second_id)
        assert len(lost) == 2 and set(placed.values()) == {head_id, second_id}, placed
        # 2. The second node's raylet dies; the job fails as soon as Ray has declared it dead.
        killed_at = time.monotonic()
        second.kill_raylet()
        rc = launched.wait(timeout=150)
        took = time.monotonic() - killed_at
        out = (tmp_path / "launch.log").read_text(errors="replace")
        assert rc == 3, out[-3000:]
        assert took < 100, f"failed {took:.0f}s after the kill"
        assert "cannot place 4 workers" in out and "hold 2 of them" in out and "127.0.0.2" in out, out[-3000:]
        # 3. The fault's incident names the ranks that were on the lost node.
        store = open_incident_store(job)
        machinery = [(i, e.payload["machinery"]) for i in store.list_incidents(job=JOB)
                     for e in store.timeline(i.id) if "machinery" in e.payload]  # fmt: skip
        assert machinery, "no incident for the lost node"
        incident, named = machinery[-1]
        assert incident.diagnosis.first_rank == lost[0] and f"rank(s) {lost}" in named, named
        # 4. The LR incident is left to a person, its observation cut short by the end, nothing pending.
        [lr] = [i for i in store.list_incidents(job=JOB) if i.id != incident.id]
        assert lr.state is IncidentState.ESCALATED and not store.pending_events(lr.id)
        [obs] = [e for e in store.timeline(lr.id) if e.kind is EventKind.OBSERVATION]
        assert obs.status is EventStatus.FAILED and "job ended (failed" in obs.result["reason"], obs
        print(f"\nnode loss: ranks {lost} lost, exit {rc} {took:.1f}s after the kill")


def _action(api: Any, handle: Any) -> str | None:
    """The action the job's incident plan is on (None: no plan runs)."""
    incident = api.status(handle)["incident"]
    return incident["action"] if incident else None


def _find(api: Any, name: str) -> Any:
    try:
        return api.find(name)
    except Exception:
        return None


def test_a_worker_node_lost_mid_incident_with_min_workers_goes_on_with_the_ranks_left(
    tmp_path: Path, two_nodes: tuple[RayNode, RayNode]
) -> None:
    """``resources.min_workers: 2``: the group restarts on the head's 2 CPUs with 2 of its 4 ranks,
    from the checkpoint before the LR incident's onset; the incident's fix is redelivered and
    observed, and the run trains to its last step on 2 ranks (exit 0)."""
    import ray

    from supervisor.checkpoint.lifecycle import open_checkpoint_store
    from supervisor.config.runtime import RuntimeSettings
    from supervisor.incidents.paths import open_incident_store
    from supervisor.ranks.names import NAMESPACE
    from supervisor.ranks.relay import relay_name
    from supervisor.runtime.group import WorkerGroup

    head, second = two_nodes
    resources = {"num_workers": 4, "cpus_per_worker": 1, "min_workers": 2}
    # The ranks report through a relay per node (supervisor/ranks/relay.py): the lost node's goes
    # with it, the head's with the group it restarts.
    job_file = _job_file(tmp_path, head.address, resources=resources, max_steps=360,
                         runtime={"relay_from_ranks": 2})  # fmt: skip
    job = JobSpec.model_validate(yaml.safe_load(job_file.read_text()))
    with _observing(tmp_path, two_nodes, job_file) as (launched, _):
        second_id = next(n["NodeID"] for n in ray.nodes() if n["NodeManagerAddress"] == "127.0.0.2")
        group = WorkerGroup.find(job, RuntimeSettings.model_validate({}))
        assert group is not None
        lost = sorted(r for r, n in group.rank_nodes.items() if n == second_id)
        assert len(lost) == 2, group.rank_nodes
        for node in set(group.rank_nodes.values()):  # raises ValueError where a node has no relay
            ray.get_actor(relay_name(JOB, node), namespace=NAMESPACE)
        second.kill_raylet()
        rc = launched.wait(timeout=400)
    out = (tmp_path / "launch.log").read_text(errors="replace")
    assert rc == 0, out[-3000:]
    store = open_incident_store(job)
    [restart] = [i for i in store.list_incidents(job=JOB) if any("machinery" in e.payload for e in store.timeline(i.id))]  # fmt: skip
    assert restart.state is IncidentState.RESOLVED and restart.diagnosis is not None
    assert restart.diagnosis.first_rank == lost[0], restart.diagnosis
    [ev] = [e for e in store.timeline(restart.id) if e.kind is EventKind.WORKER_RESTARTED]
    assert (ev.result or {}).get("world_size") == 2, ev
    lr = next(i for i in store.list_incidents(job=JOB) if i.id != restart.id and i.onset_step is not None)
    assert lr.state is IncidentState.RESOLVED and not store.pending_events(lr.id), lr
    checkpoints = open_checkpoint_store(job)
    last = checkpoints.manifest(360)
    assert last.world_size == 2 and checkpoints.latest() == 360
    print(
        f"\nnode loss with min_workers: went on with 2 ranks, resumed from {(ev.result or {}).get('resume_step')}"
    )

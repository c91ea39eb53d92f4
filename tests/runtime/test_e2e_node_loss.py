"""A job spanning two nodes loses one (ray.cluster_utils.Cluster + remove_node): the group moves and finishes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from supervisor.checkpoint.lifecycle import open_checkpoint_store
from supervisor.client import api
from supervisor.core.model import HealthMark
from supervisor.incidents import EventKind, EventStatus
from supervisor.incidents.paths import open_incident_store
from supervisor.ranks.names import NAMESPACE
from supervisor.runtime.group import WorkerGroup
from tests.runtime.conftest import FAST, make_job, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    # One CPU per worker node and one worker per CPU: the 2 ranks must land on 2 different
    # nodes (a multi-node job), and the third node is where the group can move to. The head has
    # no CPU, so no rank lands on the one node the test cannot remove.
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(3):
        c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, namespace=NAMESPACE, log_to_driver=False)
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


def test_node_lost_restarts_the_group_on_the_remaining_node(tmp_path: Path, cluster: Any) -> None:
    job = make_job(tmp_path, "nodeloss", max_steps=160)
    handle = api.launch(job, FAST)
    checkpoints = open_checkpoint_store(job)

    def verified(step: int) -> bool:
        manifest = checkpoints.find(step)
        return manifest is not None and manifest.health in (HealthMark.VERIFIED, HealthMark.HEALTHY)

    # The node goes once the supervisor has verified the checkpoint at 60: a restart resumes from a
    # verified checkpoint only, and on a loaded machine the verification can trail the ranks' steps
    # by more than the 10 steps between that save and step 70 (it then resumed, rightly, from 40).
    wait_for(lambda: api.status(handle), lambda s: s["step"] >= 70 and verified(60), 300)
    group = WorkerGroup.find(job, FAST)
    assert group is not None and group.pg is not None
    nodes = set(ray.util.placement_group_table(group.pg)["bundles_to_node_id"].values())
    assert len(nodes) == 2, "the workers should span two nodes"
    # A worker node, and not the one the supervisor landed on (on this one-machine simulation the
    # driver's node, which the supervisor prefers, can be any of them).
    supervisor_node = api.status(handle)["supervisor_node"]
    victim = next(
        n for n in cluster.list_all_nodes() if n.node_id in nodes - {supervisor_node} and not n.is_head()
    )
    cluster.remove_node(victim)
    final = api.wait(handle, 400)
    assert final["phase"] == "finished" and final["step"] == 160, f"{final}"
    assert final["group_restarts"] >= 1
    incidents = open_incident_store(job)
    restarts = [e for i in incidents.list_incidents(job=job.name) for e in incidents.timeline(i.id)
                if e.kind is EventKind.WORKER_RESTARTED]  # fmt: skip
    assert restarts and all(e.status is EventStatus.DONE for e in restarts)
    assert restarts[0].result["resume_step"] >= 60
    ray.kill(handle)

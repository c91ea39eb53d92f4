"""End to end through the node relay (``supervisor/ranks/relay.py``): real tinylm ranks on a real local
Ray whose records reach the real supervisor through their node's relay, about one call per step
instead of one per rank; a garbage batch on one rank is found and that rank named, and no record is
lost or missing."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from supervisor.client import api
from supervisor.incidents.paths import open_incident_store
from supervisor.ranks.names import NAMESPACE
from supervisor.ranks.relay import relay_name
from tests.runtime.conftest import FAST, make_job, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]

LEAN = str(Path(__file__).parent / "policies" / "lean.yaml")


def test_ranks_report_through_their_node_relay_and_a_bad_rank_is_named(tmp_path: Path) -> None:
    ranks, steps = 4, 120
    settings = FAST.model_copy(update={"relay_from_ranks": ranks})
    job = make_job(tmp_path, "relay", max_steps=steps, policy=LEAN, resources={"num_workers": ranks},
                   faults=[{"kind": "garbage_batch", "step": 90, "rank": 3}])  # fmt: skip
    handle = api.launch(job, settings)
    wait_for(lambda: api.status(handle), lambda st: st["step"] >= 20, 600)
    relay = ray.get_actor(relay_name(job.name, ray.get_runtime_context().get_node_id()), namespace=NAMESPACE)
    assert ray.get(relay.stats.remote(), timeout=60)["calls"] > 0  # the ranks' batches go through it
    final = api.wait(handle, 600)
    assert final["phase"] == "finished" and final["exit_code"] == 0, f"{final}"
    assert final["records_lost"] == 0 and final["records_missing"] == 0, f"{final}"
    # Directly, each rank makes about a call per step (ranks x steps); relayed, the node about one.
    assert final["record_calls"] < 0.5 * ranks * steps, f"{final}"
    store = open_incident_store(job)
    named = [i.diagnosis.first_rank for i in store.list_incidents(job=job.name) if i.diagnosis is not None]
    assert 3 in named, named
    ray.kill(handle)

"""A group restarted on fewer ranks (``resources.min_workers``): every count of ranks the
supervisor keeps follows the group as placed, and the restart says how many ranks it has."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config.job import Resources
from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.group import bundles_that_fit, shortfall
from supervisor.runtime.restarts import GroupEvent
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers
from tests.runtime.test_crash_consistency import HOLD


def _started(tmp_path: Path, name: str) -> tuple[Controller, FakeRanks, FakeWorkers]:
    """A 4-rank job that may go on with 2, booted on harness workers."""
    job = make_job(tmp_path, name, max_steps=120, policy=HOLD,
                   resources={"num_workers": 4, "min_workers": 2})  # fmt: skip
    ranks = FakeRanks(4, 120)
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ctl.boot()
    return ctl, ranks, workers


def _lose(ctl: Controller, workers: FakeWorkers, lost: tuple[int, ...], placed: int | None = None) -> None:
    """Ranks ``lost`` fail; the restart places ``placed`` ranks (None: all of them)."""
    if placed is not None:
        workers.place = [placed]
    workers.events.append(GroupEvent("lost", lost, f"rank(s) {list(lost)} do not answer (on node 10.0.0.2)"))
    ctl.iterate()
    ctl.iterate()


def test_a_group_restarted_on_fewer_ranks_trains_to_the_end_on_them(tmp_path: Path) -> None:
    ctl, ranks, workers = _started(tmp_path, "fewer")
    ranks.run(ctl, lambda: ranks.step >= 60)
    _lose(ctl, workers, (2, 3), placed=2)  # the live nodes hold two of the four ranks
    assert ctl.phase is JobPhase.RUNNING and ctl.world_size == 2 and ctl.assembler.world_size == 2
    ranks.run(ctl, lambda: ctl.phase.is_terminal)

    assert ctl.phase is JobPhase.FINISHED and ctl.state.reason == "all 2 ranks finished", ctl.status()
    assert ctl.current_step == 120
    [restart] = ctl.incidents.list_incidents(job="fewer")
    assert restart.state is IncidentState.RESOLVED and restart.diagnosis is not None
    assert restart.diagnosis.first_rank == 2
    [ev] = [e for e in ctl.incidents.timeline(restart.id) if e.kind is EventKind.WORKER_RESTARTED]
    assert (ev.result or {})["world_size"] == 2
    moves = [e.payload.get("reason", "") for e in ctl.incidents.timeline(restart.id)]
    assert any("on 2 of 4 ranks (resources.min_workers)" in str(m) for m in moves), moves
    # The report calls it what it was: the group's fault, not a loss spike.
    from supervisor.incidents.postmortem import build_postmortem

    texts = [t for _, t in build_postmortem(ctl.incidents, restart.id).timeline]
    assert (
        texts[0].startswith("Detected a worker-group fault at step") and "rank(s) [2, 3] lost" in texts[0]
    ), texts


def test_min_workers_is_at_most_num_workers() -> None:
    assert Resources(num_workers=4, min_workers=2).fewest_workers == 2
    assert Resources(num_workers=4).fewest_workers == 4
    with pytest.raises(ValueError, match=r"min_workers \(5\) must be <= num_workers \(4\)"):
        Resources(num_workers=4, min_workers=5)


def test_the_bundles_the_live_nodes_hold_count_each_bundle_on_one_node() -> None:
    nodes = [
        {"Alive": True, "Resources": {"CPU": 3.0}},
        {"Alive": True, "Resources": {"CPU": 1.5, "GPU": 1.0}},
        {"Alive": False, "Resources": {"CPU": 64.0}},  # lost: holds nothing
    ]
    assert bundles_that_fit({"CPU": 1.0}, nodes) == 4  # 3 + 1: half a CPU left on each is no bundle
    assert bundles_that_fit({"CPU": 1.0, "GPU": 1.0}, nodes) == 1
    assert shortfall({"CPU": 1.0}, 4, nodes) is None
    why = shortfall({"CPU": 1.0}, 5, nodes)
    assert why is not None and "hold 4 of them" in why and "1 node(s) lost" in why


def test_a_group_resuming_sharded_state_is_asked_for_exactly_the_ranks_that_saved_it(tmp_path: Path) -> None:
    """Sharded torch.save state loads only on as many ranks as saved it: a restart from it is
    never placed on fewer (nor more) ranks; DCP and replicated state may be."""
    import os

    ctl, ranks, workers = _started(tmp_path, "sharded")
    assert ctl.checkpoints is not None
    from supervisor.checkpoint.verify import verify

    for step, layout in ((20, "replicated"), (40, "sharded")):
        files = [
            ctl.checkpoints.write_file(
                step, f"s{r}", lambda f: f.write(os.urandom(32)), rank=r, components=["model", "optimizer"]
            )  # fmt: skip
            for r in range(4)
        ]
        ctl.checkpoints.commit(step, world_size=4, files=files, layout=layout)
        assert verify(ctl.checkpoints, step, expected_world_size=4).ok
    assert ctl._ranks_for(40) == 4 and ctl._ranks_for(20) is None and ctl._ranks_for(None) is None
    ranks.run(ctl, lambda: ranks.step >= 45)
    _lose(ctl, workers, (3,))
    assert workers.launches[-1][1] == 40 and workers.ranks_asked[-1] == 4


def test_a_supervisor_restarted_beside_a_smaller_group_counts_its_ranks(tmp_path: Path) -> None:
    """A supervisor killed after the group went on with fewer ranks re-attaches to that group: the
    steps it assembles, the ranks it waits for and the status follow it, not ``num_workers``."""
    ctl, ranks, workers = _started(tmp_path, "fewer_attach")
    job = ctl.job
    ranks.run(ctl, lambda: ranks.step >= 40)
    _lose(ctl, workers, (3,), placed=3)
    ranks.run(ctl, lambda: ranks.step >= 70)
    ctl.persist(force=True)
    del ctl  # killed: the group of 3 trains on

    again = Controller(job, FAST, attach=True, workers=workers)
    again.boot()
    assert again.world_size == 3 and again.assembler.world_size == 3
    st = again.status()
    assert (st["world_size"], st["num_workers"]) == (3, 4)
    ranks.run(again, lambda: again.phase.is_terminal)
    assert again.phase is JobPhase.FINISHED and again.state.reason == "all 3 ranks finished", again.status()

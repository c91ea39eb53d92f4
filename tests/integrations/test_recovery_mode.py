"""Which recovery a rollback gets (``supervisor.config.recovery``), on the real controller
with fake workers (tests/runtime/harness.py): in place for the supervisor's own checkpoints, a
restart of the worker group for an adopted framework checkpoint or with ``recovery: restart``.
The e2e run through a real framework's resume path is in test_frameworks_e2e.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from supervisor.checkpoint.adopt import adopt_local
from supervisor.checkpoint.training_state import save_training_state
from supervisor.config.recovery import rollback_mode
from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime.controller import Controller
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import FakeRanks, FakeWorkers, spikes_once

REOPEN = str(Path(__file__).parents[1] / "runtime" / "policies" / "reopen.yaml")


def test_mode_follows_the_setting_and_the_target() -> None:
    assert rollback_mode("auto", False)[0] == "in_place"
    assert rollback_mode("auto", True)[0] == "restart" and "framework" in rollback_mode("auto", True)[1]
    assert (
        rollback_mode("restart", False)[0] == "restart"
        and "recovery: restart" in rollback_mode("restart", False)[1]
    )
    assert rollback_mode("auto", None)[0] == "in_place"  # explain: not known which target yet


def framework_saver(ctl: Controller, tmp_path: Path) -> Any:
    """A 'framework' writes checkpoint-N/ (torch files) under the storage path; the store adopts it."""

    def save(step: int) -> None:
        folder = tmp_path / "store" / ctl.job.name / "fw" / f"checkpoint-{step}"
        folder.mkdir(parents=True, exist_ok=True)  # the new timeline writes the same step again
        torch.save({"w": torch.full((2,), float(step))}, folder / "model.pt")
        torch.save({"state": {}}, folder / "optimizer.pt")
        adopt_local(ctl.checkpoints, step, folder, world_size=2, extra={"framework": "test"})

    return save


def native_saver(ctl: Controller) -> Any:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def save(step: int) -> None:
        save_training_state(ctl.checkpoints, step, rank=0, world_size=1, model=model, optimizer=optimizer)

    return save


# In place (recovery: auto, the supervisor's own checkpoint) is what tests/runtime and the e2e
# tests run everywhere; here the two ways a rollback becomes a restart.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("recovery", "framework", "mode"), [("auto", True, "restart"), ("restart", False, "restart")]
)
def test_rollback_mode_on_the_real_controller(
    tmp_path: Path, recovery: str, framework: bool, mode: str
) -> None:
    job = make_job(tmp_path, "mode", max_steps=220, policy=REOPEN, recovery=recovery)
    ranks = FakeRanks(2, 220, spikes_once(130), grads_follow_loss=True)
    workers = FakeWorkers(ranks)
    ctl = Controller(job, FAST, workers=workers)
    ranks.on_checkpoint = framework_saver(ctl, tmp_path) if framework else native_saver(ctl)
    ctl.boot()
    ranks.run(ctl, lambda: ctl.phase.is_terminal, checkpoint_every=25)

    [incident] = ctl.incidents.list_incidents(job="mode")
    assert incident.state is IncidentState.RESOLVED, ctl.status()
    timeline = ctl.incidents.timeline(incident.id)
    rolled = next(e for e in timeline if e.kind is EventKind.ROLLED_BACK and e.result)
    assert rolled.result["mode"] == mode and rolled.result["to_step"] == 100, rolled.result
    assert ("framework" if framework else "recovery: " + recovery) in rolled.result["mode_why"]
    from supervisor.incidents.timeline import describe

    assert ("by restarting the worker group" in describe(rolled)) == (mode == "restart"), describe(rolled)
    if mode == "restart":
        # The group went down and generation 1 started from the target; it was frozen again
        # (the freeze is re-delivered), got the fix, and was released by the observation.
        assert [(g, r) for g, r, _ in workers.launches] == [(0, None), (1, 100)], workers.launches
        assert any(d["kind"] == "apply" for d in ranks.applied)
        assert ctl.status()["generation"] == 1 and ctl.status()["group_restarts"] == 0
    else:
        assert len(workers.launches) == 1
    assert ctl.phase.value == "finished" and ranks.step == 220


def test_policy_explain_says_which_mode_and_why(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from supervisor.cli.main import cli
    from tests.policy.test_explain_cli import write_divergence_trace

    trace = tmp_path / "divergence.jsonl"
    write_divergence_trace(trace)
    base = ["policy", "explain", "default", "--trace", str(trace)]
    auto = CliRunner().invoke(cli, base)
    assert auto.exit_code == 0, auto.output
    assert "supervision steer, recovery in-place" in auto.stdout
    assert (
        "recovery: recovery: auto: in place when the target is the supervisor's own checkpoint" in auto.stdout
    )
    forced = CliRunner().invoke(cli, [*base, "--recovery", "restart", "--json"])
    assert forced.exit_code == 0, forced.output
    import json

    [incident] = json.loads(forced.stdout)["incidents"]
    assert (
        incident["recovery_mode"]["mode"] == "restart"
        and "recovery: restart" in incident["recovery_mode"]["why"]
    )

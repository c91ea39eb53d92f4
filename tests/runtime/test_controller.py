"""The controller stepped one iteration at a time, without Ray: records in, directives out.

A harness as docs/architecture.md (Tests in layers) describes: the real controller, incident store, policy
engine, detector and checkpoint store; only the workers are replaced by the test, which
feeds records and acknowledges directives by hand. How it differs from production: no worker
group (the machinery has nothing to watch), one rank, synthetic records.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import torch

from supervisor.checkpoint.training_state import save_training_state
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.runtime.controller import Controller
from supervisor.runtime.state import JobPhase
from tests.runtime.conftest import FAST, make_job
from tests.runtime.harness import send

LEAN = str(Path(__file__).parent / "policies" / "lean.yaml")


def record(
    step: int, rng: random.Random, *, loss: float | None = None, events: list[str] | None = None
) -> dict[str, Any]:
    value = 3.0 + rng.gauss(0, 0.02) if loss is None else loss
    return {"step": step, "rank": 0, "world_size": 1, "loss": value, "grad_norm": 1.0 + rng.gauss(0, 0.02),
            "param_norm": 100.0, "update_norm": 0.1, "tokens_per_s": 1000.0, "lr": 1e-3,
            "nonfinite": not math.isfinite(value), "events": events or []}  # fmt: skip


def ack(ctl: Controller, kind: str, step: int) -> str:
    """Acknowledge the newest directive of ``kind`` the way the SDK does while frozen."""
    d = next(e for e in reversed(ctl.directives.entries) if e["kind"] == kind)
    send(
        ctl,
        0,
        [{"step": step, "rank": 0, "control": True, "events": [f"directive_applied:{d['id']}:{kind}"]}],
    )
    return str(d["id"])


def spin(ctl: Controller, until: Any, limit: int = 200) -> None:
    for _ in range(limit):
        ctl.iterate()
        if until():
            return
    raise AssertionError(f"not reached; status {ctl.status()}")


def test_nonfinite_incident_walks_through_the_plan(tmp_path: Path) -> None:
    job = make_job(tmp_path, "harness", max_steps=1000, policy=LEAN, resources={"num_workers": 1})
    ctl = Controller(job, FAST)
    model = torch.nn.Linear(4, 4)
    for step in (40, 60):
        save_training_state(ctl.checkpoints, step, rank=0, world_size=1, model=model,
                            optimizer=torch.optim.AdamW(model.parameters()))  # fmt: skip
    rng = random.Random(0)
    send(ctl, 0, [record(s, rng, events=["checkpoint_saved"] if s in (40, 60) else []) for s in range(1, 81)])
    ctl.iterate()
    assert ctl.current_step == 80 and ctl.status()["incident"] is None
    assert ctl.checkpoints.manifest(40).health.value == "healthy"
    assert ctl.checkpoints.latest() == 60

    # 1. A NaN: the incident opens and is ready at once; alert then freeze.
    send(ctl, 0, [record(81, rng, loss=math.nan)])
    spin(ctl, lambda: any(e["kind"] == "freeze" for e in ctl.directives.entries))
    assert ctl.phase is JobPhase.INCIDENT
    incident = ctl.status()["incident"]["id"]
    ack(ctl, "freeze", 81)
    # 2. Snapshot, block latest, rollback: each waits for its acknowledgement.
    spin(ctl, lambda: any(e["kind"] == "snapshot" for e in ctl.directives.entries))
    assert ctl.state.frozen
    ack(ctl, "snapshot", 81)
    spin(ctl, lambda: any(e["kind"] == "rollback" for e in ctl.directives.entries))
    assert ctl.checkpoints.block_state() is not None
    rollback = next(e for e in ctl.directives.entries if e["kind"] == "rollback")
    assert rollback["step"] == 40
    ack(ctl, "rollback", 40)
    spin(ctl, lambda: any(e["kind"] == "apply" for e in ctl.directives.entries))
    assert ctl.current_step == 40 and ctl.assembler.watermark == 40
    # Step 60 is the abandoned timeline now: quarantined, and `latest` no longer names it.
    assert ctl.checkpoints.manifest(60).health.value == "quarantined"
    assert ctl.checkpoints.latest() == 40
    ack(ctl, "apply", 40)
    # 3. Observe releases the freeze and needs 50 clean steps after the rollback point -- and
    #    at least up to the onset (81) plus the policy's observation.onset_margin_steps (20).
    spin(ctl, lambda: not ctl.state.frozen)
    send(ctl, 0, [record(s, rng) for s in range(41, 91)])
    for _ in range(5):
        ctl.iterate()
    assert not any(e["kind"] == "continue" and "resume" in e["id"] for e in ctl.directives.entries)
    send(ctl, 0, [record(s, rng) for s in range(91, 102)])
    spin(ctl, lambda: any(e["kind"] == "continue" and "resume" in e["id"] for e in ctl.directives.entries))
    ack(ctl, "continue", 102)
    spin(ctl, lambda: ctl.status()["incident"] is None)
    assert ctl.phase is JobPhase.RUNNING
    store = ctl.incidents
    assert store.get(incident).state is IncidentState.RESOLVED
    acted = [e for e in store.timeline(incident) if e.action_id]
    assert [e.kind for e in acted] == [
        EventKind.ALERT_SENT, EventKind.FROZE, EventKind.SNAPSHOT, EventKind.LATEST_BLOCKED,
        EventKind.ROLLED_BACK, EventKind.FIX_APPLIED, EventKind.OBSERVATION, EventKind.RESUMED,
    ]  # fmt: skip
    assert all(e.status is EventStatus.DONE for e in acted)
    assert ctl.checkpoints.block_state() is None


def test_a_restarted_controller_skips_done_actions_and_repolls_the_pending_one(tmp_path: Path) -> None:
    job = make_job(tmp_path, "restart", max_steps=1000, policy=LEAN, resources={"num_workers": 1})
    ctl = Controller(job, FAST)
    rng = random.Random(1)
    send(ctl, 0, [record(s, rng) for s in range(1, 81)] + [record(81, rng, loss=math.inf)])
    spin(ctl, lambda: any(e["kind"] == "freeze" for e in ctl.directives.entries))
    ctl.persist(force=True)
    freeze_id = next(e["id"] for e in ctl.directives.entries if e["kind"] == "freeze")

    # The supervisor dies with the freeze pending; a new one attaches and hears the ack.
    again = Controller(job, FAST, attach=True)
    assert again.directives.has(freeze_id) and again.state.active is not None
    ack(again, "freeze", 81)
    spin(again, lambda: any(e["kind"] == "snapshot" for e in again.directives.entries))
    incident = again.state.active.incident_id
    freezes = [e for e in again.incidents.timeline(incident) if e.kind is EventKind.FROZE]
    assert len(freezes) == 1 and freezes[0].status is EventStatus.DONE
    assert [e["kind"] for e in again.directives.entries].count("freeze") == 1

"""Builders of realistic incidents for the tests (plain functions, importable from any test)."""

from __future__ import annotations

import random
from typing import Any

from supervisor.incidents import IncidentStore


def diagnosis(**over: Any) -> dict[str, Any]:
    """A Diagnosis JSON (the stable contract of supervisor.core.model) for a rank-local data spike."""
    base: dict[str, Any] = {
        "onset_step": 100,
        "peak_step": 102,
        "end_step": 106,
        "phenotype": "transient",
        "rank_local": True,
        "first_rank": 1,
        "source_local": "web",
        "causes": [
            {
                "cause": "data",
                "score": 0.82,
                "evidence": ["loss rose on rank 1 only", "source web carried 91% of it"],
            },
            {"cause": "optimizer", "score": 0.1, "evidence": []},
        ],
        "suspect_samples": ["web-000017", "web-000018"],
        "severity": "high",
        "first_anomaly": {"step": 100, "metric": "loss", "rank": 1, "value": 6.8, "baseline": 2.9, "z": 41.0},
        "detected_step": 103,
    }
    base.update(over)
    return base


def telemetry(first: int = 20, last: int = 160, ranks: int = 2, grad_lead: int = 5) -> list[dict[str, Any]]:
    """Per-rank records: a spike on rank 1 at steps 100-104 whose grad norm rises ``grad_lead`` steps earlier."""
    rng = random.Random(7)
    rows = []
    for step in range(first, last):
        for rank in range(ranks):
            loss = 3.0 - step * 0.002 + rng.gauss(0, 0.02)
            grad = 1.0 + rng.gauss(0, 0.05)
            if rank == 1 and 100 <= step <= 104:
                loss += 4.0
            if rank == 1 and 100 - grad_lead <= step <= 104:
                grad *= 5.0
            rows.append(
                {
                    "step": step,
                    "rank": rank,
                    "world_size": ranks,
                    "loss": loss,
                    "grad_norm": grad,
                    "param_norm": 100.0,
                    "update_norm": 0.1 * grad,
                    "lr": 1e-3 * min(1.0, step / 50),
                    "time": 1_000.0 + step * 0.5,
                    "step_time": 0.5,
                }  # fmt: skip
            )
    return rows


def full_incident(store: IncidentStore, job: str = "tinylm") -> int:
    """An incident taken through the whole policy: freeze, snapshot, rollback, fix, observe, resolve."""
    inc = store.open_incident(job, diagnosis(), key=1)
    store.attach_series(inc.id, telemetry())
    store.record(inc.id, "metric_check", actor="supervisor", step=103, result={"artifact": False})
    store.record(inc.id, "alert_sent", actor="supervisor", step=103, payload={"channel": "log"})
    store.transition(inc.id, "frozen", "policy rule data_spike: freeze", actor="supervisor", step=103)
    ev = store.begin(inc.id, "snapshot", actor="runtime", step=103, payload={"checkpoint": "step_00000103"})
    store.finish(ev.id, result={"mark": "diagnostic"})
    store.add_artifact(inc.id, "snapshot", "tinylm/checkpoints/step_00000103", {"mark": "diagnostic"})
    store.record(inc.id, "latest_blocked", actor="runtime", step=103)
    store.transition(inc.id, "acting", "rollback with margin 20", actor="supervisor", step=103)
    ev = store.begin(
        inc.id, "rolled_back", actor="runtime", step=103, action_id="p1.rollback",
        payload={"from_step": 103, "to_step": 80, "checkpoint": "step_00000080"},
    )  # fmt: skip
    store.finish(ev.id, result={"verified": True})
    store.record(
        inc.id, "fix_applied", actor="runtime", step=80,
        payload={"exclude_samples": ["web-000017", "web-000018"], "exclude_batches": [100, 104], "lr_scale": 0.5},
    )  # fmt: skip
    store.record(inc.id, "resumed", actor="runtime", step=80)
    healthy = [r for r in telemetry(first=80, last=131) if r["rank"] == 0]
    store.attach_series(inc.id, [{**r, "rank": rank} for r in healthy for rank in (0, 1)], replay=1)
    store.transition(inc.id, "observing", "fix applied, watching 50 steps", actor="supervisor", step=80)
    store.record(
        inc.id, "observation", actor="supervisor", step=130, payload={"window": [80, 130]},
        result={"passed": True, "checks": {"loss": {"ok": True}, "grad_norm": {"ok": True}}},
    )  # fmt: skip
    store.transition(inc.id, "resolved", "observation passed", actor="supervisor", step=130)
    return inc.id

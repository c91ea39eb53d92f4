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


def _act(store: IncidentStore, inc: int, kind: str, action: str, step: int, params: dict[str, Any],
         memo: dict[str, Any], result: dict[str, Any] | None, *, failed: bool = False) -> None:  # fmt: skip
    """An action event as the runtime writes it: pending with {action, params, memo, reason}, then finished."""
    ev = store.begin(
        inc, kind, actor="supervisor", step=step, action_id=f"i{inc}-p1-{action}",
        payload={"action": action, "params": params, "memo": memo, "reason": f"rule 'r' action: {action}"},
    )  # fmt: skip
    if result is not None:
        store.finish(ev.id, result=result, failed=failed)


def rollback_incident(
    store: IncidentStore, job: str = "tinylm", *, rank_local: bool = False, top_cause: str = "optimizer",
    observation_ok: bool = True,
) -> int:  # fmt: skip
    """An incident shaped like the runtime's own records (action payloads, per-rank and replayed
    series): a spike at step 100 (on rank 1 only when ``rank_local``), frozen at 103, rolled back
    to 80, re-warmed, observed on the new timeline over steps 81-130, resolved."""
    suspects = ["web-000017", "web-000018"]
    d = diagnosis(
        phenotype="divergence" if not rank_local else "transient", rank_local=rank_local,
        first_rank=1 if rank_local else None, source_local=None,
        causes=[{"cause": top_cause, "score": 0.9, "evidence": [f"{top_cause} evidence at step 100"]}],
        suspect_samples=suspects,
    )  # fmt: skip
    inc = store.open_incident(job, d, key=7).id
    rows = telemetry(first=20, last=108)
    if not rank_local:  # the spike on every rank
        for r in rows:
            if 100 <= r["step"] <= 107:
                r["loss"] += 4.0
    store.attach_series(inc, rows)
    store.attach_series(inc, [{k: v for k, v in r.items() if k != "rank"} for r in rows if r["rank"] == 1])
    store.record(inc, "diagnosed", actor="diagnose", step=103, payload={"diagnosis": d})
    store.record(inc, "note", actor="policy", step=103,
                 payload={"plan": "rule r: alert, freeze, rollback, apply, observe, resume", "attempt": 1,
                          "escalate": None, "why": "rule 'r' matched"})  # fmt: skip
    _act(
        store, inc, "alert_sent", "alert", 103, {}, {"format": "json", "webhook": None}, {"channels": ["log"]}
    )
    store.transition(inc, "frozen", "action freeze begins", actor="supervisor", step=103)
    _act(store, inc, "froze", "freeze", 103, {}, {"directive": {"id": "f"}},
         {"acked_at_step": 104, "directive": "f", "ranks": [0, 1]})  # fmt: skip
    store.transition(inc, "acting", "action rollback begins", actor="supervisor", step=104)
    ver = {"ok": True, "health": "healthy", "rejected": []}
    _act(store, inc, "rolled_back", "rollback", 104, {"margin_steps": 20},
         {"from_step": 104, "to_step": 80, "verification": ver},
         {"from_step": 104, "to_step": 80, "verification": ver, "acked_at_step": 104, "ranks": [0, 1]})  # fmt: skip
    blamed = top_cause == "data"  # a data incident excludes its suspects; an optimizer one only re-warms
    exclusions = {"samples": suspects if blamed else [], "sources": [], "batch_ranges": []}
    params: dict[str, Any] = {"warmup_steps": 50, **({"exclude": {"samples": "suspects"}} if blamed else {})}
    _act(store, inc, "fix_applied", "apply", 80, params, {"directive": {"id": "a"}},
         {"overrides": {"kind": "apply", "warmup_steps": 50, "exclusions": exclusions}, "unsupported": [],
          "acked_at_step": 80, "ranks": [0, 1]})  # fmt: skip
    store.transition(inc, "observing", "action observe begins", actor="supervisor", step=80)
    again = [r for r in telemetry(first=81, last=131) if True]
    store.attach_series(inc, again, replay=1)
    store.attach_series(
        inc, [{k: v for k, v in r.items() if k != "rank"} for r in again if r["rank"] == 0], replay=1
    )
    base = {
        "loss_median": 2.85,
        "loss_mad": 0.02,
        "grad_norm": 1.0,
        "update_ratio": 0.001,
        "tokens_per_s": 1000.0,
    }
    checks = {
        "finite": {"ok": True, "value": 0.0, "limit": 0.0, "detail": "all finite"},
        "loss": {"ok": observation_ok, "value": 2.84 if observation_ok else 3.4, "limit": 2.85 + 3 * 1.4826 * 0.02,
                 "detail": f"window median {2.84 if observation_ok else 3.4} vs limit 2.939"},
        "grad_norm": {"ok": True, "value": 1.02, "limit": 2.0, "detail": "1.02x baseline (must be <= 2x)"},
    }  # fmt: skip
    _act(store, inc, "observation", "observe", 80, {"steps": 50}, {"from_step": 80, "steps": 50, "onset_step": 100},
         {"window": [81, 130], "covers_onset": True, "checks": checks, "baseline": base, "passed": observation_ok},
         failed=not observation_ok)  # fmt: skip
    if observation_ok:
        _act(store, inc, "resumed", "resume", 130, {}, {"directive": {"id": "c"}},
             {"latest_unblocked": True, "acked_at_step": 130, "ranks": [0, 1]})  # fmt: skip
        store.transition(inc, "resolved", "every planned action done", actor="supervisor", step=130)
    return inc

"""The supervisor's Prometheus endpoint, scraped over loopback, and the incident-series recorder,
fed the way the controller feeds them: per-rank records of each complete step, a real SQLite
incident store, real checkpoint manifests."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.checkpoint.manifest import Manifest
from supervisor.config.observability import ObservabilitySettings
from supervisor.core.model import HealthMark
from supervisor.core.records import Record
from supervisor.incidents import IncidentStore
from supervisor.observability.hub import Observability
from tests.incidents.builders import diagnosis

JOB = SimpleNamespace(name="tinylm")


def _records(step: int, ranks: int = 2, spike_rank: int | None = None, dropped: int = 0) -> list[Record]:
    out = []
    for rank in range(ranks):
        loss = 3.0 - step * 0.001 + (4.0 if rank == spike_rank else 0.0)
        attrs = {"dropped_records": dropped} if dropped and rank == 1 else {}
        out.append(
            Record(step=step, loss=loss, rank=rank, world_size=ranks, time=1000.0 + step, grad_norm=1.0,
                   param_norm=100.0, update_norm=0.1, lr=1e-3, tokens_per_s=500.0, attrs=attrs)
        )  # fmt: skip
    return out


def _aggregate(records: list[Record]) -> dict[str, Any]:
    return {"loss": sum(r.loss for r in records) / len(records), "grad_norm": 1.0, "tokens_per_s": 1000.0}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IncidentStore]:
    with IncidentStore(tmp_path / "incidents.sqlite") as s:
        yield s


class _Checkpoints:
    """The checkpoint store as the metrics read it: ``manifests()``, here real Manifest values."""

    def __init__(self) -> None:
        now = time.time()
        self.items = [
            Manifest(
                job="tinylm", step=50, world_size=2, files=[], health=HealthMark.HEALTHY, created_at=now - 120
            ),
            Manifest(
                job="tinylm", step=100, world_size=2, files=[], health=HealthMark.HEALTHY, created_at=now - 60
            ),
            Manifest(
                job="tinylm", step=103, world_size=2, files=[], health=HealthMark.DIAGNOSTIC, created_at=now
            ),
            Manifest(
                job="tinylm", step=150, world_size=2, files=[], health=HealthMark.VERIFIED, created_at=now
            ),
        ]

    def manifests(self) -> list[Manifest]:
        return self.items


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


def test_metrics_endpoint_serves_incidents_actions_ranks_and_checkpoints(store: IncidentStore) -> None:
    settings = ObservabilitySettings.model_validate(
        {"metrics": {"port": 0, "host": "127.0.0.1", "checkpoint_refresh_s": 0.05}}
    )
    obs = Observability(JOB, store, _Checkpoints(), settings)
    try:
        assert obs.metrics_port
        for step in range(90, 103):
            recs = _records(step, dropped=7 if step > 95 else 0)
            obs.on_step(step, recs, _aggregate(recs))
        inc = store.open_incident("tinylm", diagnosis(onset_step=100, detected_step=103), key=1)
        ev = store.begin(inc.id, "rolled_back", actor="supervisor", step=103, action_id="i1-p1-a4-rollback",
                         payload={"action": "rollback"})  # fmt: skip
        store.finish(ev.id, result={"to_step": 50})
        store.begin(inc.id, "observation", actor="supervisor", step=103, action_id="i1-p1-a6-observe",
                    payload={"action": "observe"})  # fmt: skip
        store.open_incident(
            "tinylm", diagnosis(onset_step=40, detected_step=41, phenotype="divergence"), key=2
        )
        store.transition(2, "escalated", "a person decides", actor="supervisor")
        obs._refreshed = 0.0  # the loop refreshes incident counts every 2 s; do it on this step
        recs = _records(103)
        obs.on_step(103, recs, _aggregate(recs))

        deadline = time.monotonic() + 30
        while (
            "spike_supervisor_checkpoint_newest_healthy_step" not in (m := _scrape(obs.metrics_port))
            or not m["spike_supervisor_checkpoint_newest_healthy_step"]
        ):
            assert time.monotonic() < deadline, "checkpoint metrics never appeared"
            time.sleep(0.05)
    finally:
        obs.close()

    assert _value(m, "spike_supervisor_incidents", state="open", phenotype="transient") == 1
    assert _value(m, "spike_supervisor_incidents", state="escalated", phenotype="divergence") == 1
    assert _value(m, "spike_supervisor_actions_total", action="rollback", status="done") == 1
    assert _value(m, "spike_supervisor_actions_pending", action="observe") == 1
    assert _value(m, "spike_supervisor_detection_delay_steps_count", training_job="tinylm") == 2
    assert _value(m, "spike_supervisor_detection_delay_steps_sum", training_job="tinylm") == 3 + 1
    assert _value(m, "spike_supervisor_detection_delay_steps_bucket", le="1.0") == 1
    assert _value(m, "spike_supervisor_step", training_job="tinylm") == 103
    assert _value(m, "spike_supervisor_rank_last_step", rank="0") == 103
    assert _value(m, "spike_supervisor_rank_last_record_timestamp_seconds", rank="1") == 1103.0
    assert _value(m, "spike_supervisor_dropped_records_total", rank="1") == 7
    assert _value(m, "spike_supervisor_dropped_records_total", rank="0") == 0
    assert _value(m, "spike_supervisor_checkpoints", health="healthy") == 2
    assert _value(m, "spike_supervisor_checkpoints", health="quarantined") == 0
    assert _value(m, "spike_supervisor_checkpoint_newest_healthy_step", training_job="tinylm") == 100
    assert _value(m, "spike_supervisor_checkpoint_newest_healthy_age_steps", training_job="tinylm") == 3
    assert (
        55 <= _value(m, "spike_supervisor_checkpoint_newest_healthy_age_seconds", training_job="tinylm") < 120
    )


def test_metrics_off_by_default_and_a_failing_sink_does_not_stop_the_loop(store: IncidentStore) -> None:
    obs = Observability(JOB, store)
    assert obs.metrics_port is None and obs.tensorboard is None

    def broken(*_: Any) -> None:
        raise RuntimeError("sink down")

    obs.metrics.on_step = broken  # type: ignore[method-assign]
    obs.on_step(1, _records(1), None)
    obs.on_step(2, _records(2), None)
    assert obs._errors == {"metrics": 2}
    assert obs.series.ring[-1][0] == 2  # the other pieces went on


def test_series_keeps_per_rank_rows_and_the_timeline_after_a_rollback(store: IncidentStore) -> None:
    obs = Observability(JOB, store)
    for step in range(60, 100):  # before the incident: only in the ring
        recs = _records(step)
        obs.on_step(step, recs, _aggregate(recs))
    inc = store.open_incident("tinylm", diagnosis(onset_step=100, first_rank=1), key=1)
    for step in range(100, 108):  # the spike on rank 1, then the freeze
        recs = _records(step, spike_rank=1 if step < 104 else None)
        obs.on_step(step, recs, _aggregate(recs))
    for step in range(81, 95):  # rolled back to 80: the new timeline
        recs = _records(step)
        obs.on_step(step, recs, _aggregate(recs))
    store.transition(inc.id, "resolved", "observation passed", actor="supervisor")
    recs = _records(95)
    obs.on_step(95, recs, _aggregate(recs))  # resolved: no longer recorded

    first = store.series(inc.id, replay=0)
    again = [r for r in store.series(inc.id, replay=None) if r.get("replay") == 1]
    rank1 = {r["step"]: r["loss"] for r in first if r.get("rank") == 1}
    assert min(rank1) == 60 and max(rank1) == 107  # backfilled from the ring, then step by step
    assert rank1[101] - {r["step"]: r["loss"] for r in first if r.get("rank") == 0}[101] == pytest.approx(4.0)
    assert {r["step"] for r in first if "rank" not in r} == set(range(60, 108))  # aggregates too
    assert sorted({r["step"] for r in again}) == list(range(81, 95))
    assert {r.get("rank") for r in again} == {0, 1, None}


def test_a_taken_port_is_logged_and_supervision_goes_on(store: IncidentStore) -> None:
    taken = ObservabilitySettings.model_validate({"metrics": {"port": 0, "host": "127.0.0.1"}})
    first = Observability(JOB, store, None, taken)
    try:
        again = ObservabilitySettings.model_validate(
            {"metrics": {"port": first.metrics_port, "host": "127.0.0.1"}}
        )
        second = Observability(JOB, store, None, again)
        assert second.metrics_port is None
        second.on_step(1, _records(1), None)  # the loop goes on
        assert second.series.ring[-1][0] == 1
    finally:
        first.close()

"""deploy/grafana agrees with the metrics the supervisor exports: every metric and label a
dashboard query names is in a real scrape, every variable it uses is defined."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from supervisor.checkpoint.manifest import Manifest
from supervisor.core.model import HealthMark
from supervisor.core.records import Record
from supervisor.observability.metrics import SupervisorMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "spike-supervisor.json"
PROMQL_WORDS = {
    "sum",
    "by",
    "or",
    "vector",
    "increase",
    "histogram_quantile",
    "changes",
    "time",
    "le",
    "rate",
}


def _exported() -> dict[str, set[str]]:
    """Sample name -> label names, from a scrape of metrics fed like the supervisor feeds them."""
    m = SupervisorMetrics("tinylm")
    m.on_step(
        5,
        [Record(step=5, loss=2.0, rank=0, time=1.0, attrs={"dropped_records": 1})],
        {"loss": 2.0, "grad_norm": 1.0, "tokens_per_s": 9.0},
    )
    inc = SimpleNamespace(
        state=SimpleNamespace(value="open"), phenotype="transient", detected_step=3, onset_step=2
    )
    events = [
        SimpleNamespace(payload={"action": "rollback"}, action_id="a", status=SimpleNamespace(value=status))
        for status in ("done", "pending")
    ]
    m.on_incidents([inc], events)
    m.on_checkpoints([Manifest(job="tinylm", step=4, world_size=1, files=[], health=HealthMark.HEALTHY)])
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def _exprs(dash: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return exprs


def test_every_query_names_exported_metrics_and_labels() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exported = _exported()
    assert len(_exprs(dash)) >= 15
    for expr in _exprs(dash):
        names = set(re.findall(r"\b(spike_supervisor_\w+)", expr))
        assert names, f"query names no supervisor metric: {expr}"
        for name in names:
            assert name in exported, f"{name} is not exported (in {expr!r})"
        for selector_name, body in re.findall(r"(spike_supervisor_\w+)\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)\s*=~?", body):
                assert label in exported[selector_name], f"{selector_name} has no label {label} (in {expr!r})"
        for grouped in re.findall(r"by \(([^)]*)\)", expr):
            for label in (x.strip() for x in grouped.split(",")):
                assert any(label in labels for labels in exported.values()), (label, expr)


def test_dashboard_shape_and_variables() -> None:
    dash = json.loads(DASHBOARD.read_text())
    defined = {v["name"] for v in dash["templating"]["list"]}
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(dash)))
    assert used <= defined, used - defined
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
    text = json.dumps(dash)
    for wanted in (
        "incidents",
        "actions",
        "detection_delay",
        "rank_last_step",
        "dropped_records",
        "checkpoint",
    ):
        assert f"spike_supervisor_{wanted}" in text

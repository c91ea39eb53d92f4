"""Incidents exported as JSON next to the checkpoints (local directory and S3 over HTTP), and re-imported."""

from __future__ import annotations

import json
import math
from pathlib import Path

from supervisor.incidents import IncidentStore
from supervisor.incidents.export import (
    encode_export,
    export_document,
    export_incident,
    import_incident,
    read_export,
)
from supervisor.incidents.models import strict
from supervisor.incidents.postmortem import build_postmortem
from supervisor.storage import open_backend
from tests.incidents.builders import full_incident


def test_export_to_a_local_storage_root(store: IncidentStore, tmp_path: Path) -> None:
    incident_id = full_incident(store)
    backend = open_backend(str(tmp_path / "storage"))
    key = export_incident(store, incident_id, backend, "tinylm")
    assert key == f"tinylm/incidents/{incident_id}.json"
    doc = json.loads((tmp_path / "storage" / key).read_text())
    assert doc["format"] == "spike-supervisor.incident/1" and doc["incident"]["state"] == "resolved"
    assert len(doc["series"]) == 280 and doc["impact"]["steps_lost"] == 23


def test_export_to_s3_survives_the_loss_of_the_database(
    store: IncidentStore, s3_url: str, tmp_path: Path
) -> None:
    incident_id = full_incident(store)
    backend = open_backend("s3://incidents-test/runs", endpoint_url=s3_url, region="us-east-1")
    export_incident(store, incident_id, backend, "tinylm")
    doc = read_export(backend, "tinylm", incident_id)

    rebuilt = IncidentStore(tmp_path / "new-machine.sqlite")  # the supervisor's machine is gone
    new_id = import_incident(rebuilt, doc)
    before, after = build_postmortem(store, incident_id), build_postmortem(rebuilt, new_id)
    assert after.incident.state == before.incident.state
    assert [(e.kind, e.step, e.status, e.payload) for e, _ in after.timeline] == [
        (e.kind, e.step, e.status, e.payload) for e, _ in before.timeline
    ]
    assert (
        after.impact == before.impact and after.replayed == before.replayed and after.series == before.series
    )
    assert after.detection.earlier_signal == before.detection.earlier_signal
    assert [a["ref"] for a in after.artifacts] == [a["ref"] for a in before.artifacts]


def test_export_is_replaced_as_the_incident_moves_on(store: IncidentStore, tmp_path: Path) -> None:
    backend = open_backend(str(tmp_path / "storage"))
    inc = store.open_incident(
        "j", {"onset_step": 5, "peak_step": 5, "end_step": None, "phenotype": "transient"}
    )
    export_incident(store, inc.id, backend, "j")
    assert read_export(backend, "j", inc.id)["incident"]["state"] == "open"
    store.transition(inc.id, "dismissed", "metric artifact", actor="supervisor")
    export_incident(store, inc.id, backend, "j")
    assert read_export(backend, "j", inc.id)["incident"]["state"] == "dismissed"


def test_export_is_strict_json_whether_or_not_the_series_holds_non_finite_values(
    store: IncidentStore, tmp_path: Path
) -> None:
    """The export is written compact through json's C encoder; a NaN or an Infinity in the series
    still comes out as null or a string, never as a literal other programs cannot read."""
    incident_id = full_incident(store)
    backend = open_backend(str(tmp_path / "storage"))
    doc = export_document(store, incident_id)
    assert json.loads(encode_export(doc)) == json.loads(json.dumps(strict(doc)))
    store.attach_series(incident_id, [{"step": 999, "rank": 0, "loss": math.nan, "grad_norm": math.inf}])
    store.attach_series(incident_id, [{"step": 998, "rank": 1, "loss": 2.5}], replay=1)
    key = export_incident(store, incident_id, backend, "tinylm")
    text = (tmp_path / "storage" / key).read_text()
    assert "NaN" not in text and "\n" not in text
    doc = json.loads(text)
    row = next(r for r in doc["series"] if r["step"] == 999)
    assert row["loss"] is None and row["grad_norm"] == "Infinity"
    every = store.series(incident_id, replay=None)
    assert store.series(incident_id, reruns=True) == [r for r in every if r.get("replay")]
    assert {r["step"] for r in doc["replayed"]} >= {998}

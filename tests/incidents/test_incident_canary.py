"""Canary: a recognisable string in the sample *text* never reaches an incident record, export or report.

The batch's samples are referenced by hash IDs, as the SDK does. Careless writers then try
to smuggle the text in every way an integration could: extra record fields, record attrs,
event payloads and results, artifact metadata. None of it may survive.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.incidents import IncidentStore
from supervisor.incidents.export import export_incident
from supervisor.incidents.render import render_report
from supervisor.storage import open_backend
from tests.incidents.builders import diagnosis, telemetry

CANARY = "CANARY-7f3a9c-do-not-leak"


def test_sample_text_never_reaches_records_exports_or_reports(tmp_path: Path) -> None:
    texts = [f"def f():\n    return '{CANARY} {i}'\n" for i in range(4)]
    ids = [hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts]
    db = tmp_path / "incidents.sqlite"
    store = IncidentStore(db)

    records = telemetry()
    for rec in records:
        rec["samples"] = ids
        rec["sample_text"] = texts[0]
        rec["attrs"] = {"text": texts[1], "note": texts[2]}
        rec["nonfinite_at"] = texts[3]
    inc = store.open_incident(
        "tinylm", diagnosis(suspect_samples=ids), payload={"batch": {"ids": ids, "text": texts[0]}}
    )
    store.attach_series(inc.id, records)
    store.record(inc.id, "replayed", actor="runtime", payload={"samples": ids, "content": texts},
                 result={"decoded": texts[1], "reproduced": True})  # fmt: skip
    ev = store.begin(
        inc.id, "fix_applied", actor="runtime", payload={"exclude_samples": ids, "raw_text": texts}
    )
    store.finish(ev.id, result={"prompt": texts[2]})
    store.add_artifact(inc.id, "replay_log", "tinylm/replays/1.jsonl", {"document": texts[3]})
    store.close()

    outputs = [render_report(IncidentStore(db), inc.id, fmt) for fmt in ("md", "html", "json")]
    backend = open_backend(str(tmp_path / "storage"))
    key = export_incident(IncidentStore(db), inc.id, backend, "tinylm")
    outputs.append(backend.get_bytes(key).decode())
    for args in (
        ["list", "--json"],
        ["show", str(inc.id)],
        ["show", str(inc.id), "--json"],
        ["report", str(inc.id)],
    ):
        res = CliRunner().invoke(cli, ["incidents", *args, "--db", str(db)])
        assert res.exit_code == 0, res.output
        outputs.append(res.output)

    raw = b"".join(p.read_bytes() for p in tmp_path.glob("incidents.sqlite*"))
    assert CANARY.encode() not in raw
    for out in outputs:
        assert CANARY not in out
    # ...while the sample IDs, which are what a reviewer needs, are all there.
    assert all(i in outputs[0] for i in ids)
    assert json.loads(outputs[3])["root_cause"]["suspect_samples"] == ids

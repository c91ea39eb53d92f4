"""The end-of-run summary of `supervisor launch`: incident, what was done, report path."""

from __future__ import annotations

import io
import time
from pathlib import Path

from rich.console import Console

from supervisor.cli.outcome import print_outcome
from supervisor.config.job import JobSpec
from supervisor.core.model import Cause, CauseScore, Diagnosis, Phenotype, Severity
from supervisor.incidents import EventKind, IncidentState, IncidentStore


def _job(tmp_path: Path) -> JobSpec:
    return JobSpec.model_validate(
        {"name": "demo", "entrypoint": "examples.tinylm.train:main", "storage": {"path": str(tmp_path)},
         "max_steps": 400}
    )  # fmt: skip


def test_summary_names_incident_actions_and_writes_the_report(tmp_path: Path) -> None:
    job = _job(tmp_path)
    store = IncidentStore(tmp_path / "incidents.sqlite")
    before = time.time() - 1
    diag = Diagnosis(onset_step=250, peak_step=256, end_step=None, phenotype=Phenotype.DIVERGENCE,
                     causes=[CauseScore(Cause.OPTIMIZER, 1.0, ["update ratio 40x median"])],
                     severity=Severity.HIGH, first_rank=None)  # fmt: skip
    inc = store.open_incident("demo", diag, step=251)
    ev = store.begin(inc.id, EventKind.ROLLED_BACK, actor="supervisor", step=257,
                     payload={"from_step": 257, "to_step": 150})  # fmt: skip
    store.finish(ev.id, result={"verified": True})
    ev = store.begin(inc.id, EventKind.FIX_APPLIED, actor="supervisor", step=257,
                     payload={"params": {"warmup_steps": 200}})  # fmt: skip
    store.finish(ev.id)
    pending = store.begin(inc.id, EventKind.RESUMED, actor="supervisor", step=260)
    store.transition(inc.id, IncidentState.ACTING, "plan started", actor="supervisor", step=254)
    buf = io.StringIO()
    final = {"phase": "finished", "step": 400, "max_steps": 400, "reason": "all 2 ranks finished"}
    print_outcome(job, store, final, before, Console(file=buf, width=200))
    text = buf.getvalue()
    report = tmp_path / "demo" / "reports" / f"incident-{inc.id}.html"
    assert f"Incident #{inc.id}" in text and "divergence" in text and "top cause optimizer" in text
    assert "rolled back 257→150 → applied fix (warmup_steps=200)" in text
    assert "resumed" not in text, "a pending action is not reported as done"
    assert str(report) in text and report.read_text().startswith("<!DOCTYPE html>")
    assert pending.status.value == "pending"


def test_no_incident_in_this_run(tmp_path: Path) -> None:
    store = IncidentStore(tmp_path / "incidents.sqlite")
    buf = io.StringIO()
    print_outcome(_job(tmp_path), store, {"phase": "finished", "step": 3, "max_steps": 3}, time.time(),
                  Console(file=buf, width=200))  # fmt: skip
    assert "No incidents in this run." in buf.getvalue()

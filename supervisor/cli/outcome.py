"""What `supervisor launch` prints when a job ends: each incident of the run, what the
supervisor did about it, and where its HTML postmortem is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from supervisor.config.job import JobSpec
from supervisor.core.policy.actions import ACTIONS
from supervisor.incidents import EventKind, EventStatus, IncidentStore
from supervisor.incidents.render import render_report
from supervisor.incidents.timeline import RELEASE_HINT, exclusion_words, incident_words
from supervisor.observability.time_lost import run_words

# Timeline events that are things the supervisor did (in the words of the summary line): the
# action table's ``did`` of each action, and the two the supervisor does outside a plan.
_DID = {EventKind(a.event): a.did for a in ACTIONS.values() if a.did} | {
    EventKind.WORKER_RESTARTED: "restarted workers",
    EventKind.DISMISSED: "dismissed",
}


def _did(event: Any) -> str:
    text = _DID[event.kind]
    if event.kind is EventKind.ROLLED_BACK:
        text += f" {event.payload.get('from_step', '?')}→{event.payload.get('to_step', '?')}"
    elif event.kind is EventKind.OBSERVATION and event.result is not None:
        text += " (passed)" if event.result.get("passed") else " (failed)"
    elif event.kind is EventKind.FIX_APPLIED:
        params = event.payload.get("params") or {}
        shown = [
            f"{k}={v}" for k, v in sorted(params.items()) if v not in (None, [], {}, "") and k != "exclude"
        ]
        shown += exclusion_words(event)  # the range in steps, as the timeline says it
        text += f" ({', '.join(shown)})" if shown else ""
    if event.status is EventStatus.FAILED:
        text += " [failed]"
    return text


def reports_dir(job: JobSpec) -> Path:
    """Local storage: next to the job's checkpoints. S3 storage: ./reports/<job>."""
    if job.storage.is_s3:
        return Path("reports") / job.name
    return Path(job.storage.path) / job.name / "reports"


def print_outcome(
    job: JobSpec, store: IncidentStore, final: dict[str, Any], since: float, out: Console
) -> None:
    """One paragraph per incident opened since ``since`` (unix time), with its report's path."""
    out.print(
        f"\n[bold]{job.name}[/]: {final.get('phase', '?')} at step {final.get('step')}/{final.get('max_steps')}"
        f" — {final.get('reason', '')}"
    )
    lost = run_words(final.get("time_lost"))
    if lost:
        out.print(f"Time: {lost}")
    incidents = [i for i in store.list_incidents(job=job.name) if i.opened_at >= since]
    if not incidents:
        out.print("No incidents in this run.")
        return
    folder = reports_dir(job)
    folder.mkdir(parents=True, exist_ok=True)
    for inc in sorted(incidents, key=lambda i: i.id):
        d = inc.diagnosis
        what = f"{inc.phenotype or '?'}, top cause {inc.top_cause or '?'}, severity {inc.severity or '?'}"
        where = f"onset step {inc.onset_step}, detected at {inc.detected_step}"
        if d is not None and d.first_rank is not None:
            where += f", first rank {d.first_rank}"
        done = [
            _did(e) for e in store.timeline(inc.id) if e.kind in _DID and e.status is not EventStatus.PENDING
        ]
        path = folder / f"incident-{inc.id}.html"
        path.write_text(render_report(store, inc.id, "html"), encoding="utf-8")
        out.print(f"[bold yellow]Incident #{inc.id}[/] ({inc.state.value}): {what}; {where}")
        out.print(f"  done:   {' → '.join(done) if done else 'nothing (recorded only)'}")
        noted = [e.payload["time_lost"] for e in store.timeline(inc.id) if "time_lost" in e.payload]
        if noted:
            out.print(f"  time:   {incident_words(noted[-1])}")
        out.print(f"  report: {path}")
        if inc.state.value in ("escalated", "stopped"):
            out.print(f"  `latest` stays held; to release: {RELEASE_HINT.format(id=inc.id)}")
    out.print(f"Review: supervisor incidents list --db {store.path}")

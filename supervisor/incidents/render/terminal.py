"""Postmortem and incident lists on a terminal (rich)."""

from __future__ import annotations

from datetime import datetime, timezone

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from supervisor.incidents.models import Incident
from supervisor.incidents.postmortem import Postmortem
from supervisor.incidents.render.text import detection_lines, impact_lines

_STATUS_STYLE = {"pending": "yellow", "failed": "bold red", "done": ""}
_STATE_STYLE = {
    "resolved": "green",
    "escalated": "bold red",
    "stopped": "bold yellow",
    "dismissed": "dim",
    "open": "yellow",
}


def incidents_table(incidents: list[Incident]) -> Table:
    table = Table(title="Incidents", title_justify="left")
    widest_job = max((len(inc.job) for inc in incidents), default=3)
    table.add_column("id", no_wrap=True)
    table.add_column("job", no_wrap=True, min_width=min(widest_job, 40))  # the one column never truncated
    for col in ("state", "opened", "onset", "detected", "phenotype", "severity", "top cause"):
        table.add_column(col)
    for inc in incidents:
        style = _STATE_STYLE.get(inc.state.value, "cyan")
        table.add_row(
            str(inc.id),
            escape(inc.job),
            f"[{style}]{inc.state.value}[/]",
            _short_time(inc.opened_at),
            _opt(inc.onset_step),
            _opt(inc.detected_step),
            inc.phenotype or "",
            inc.severity or "",
            inc.top_cause or "",
        )
    return table


def timeline_table(pm: Postmortem) -> Table:
    """Time, step and one sentence per event: fits 80 columns (the sentence wraps, nothing else)."""
    table = Table(title=f"Timeline of incident {pm.incident.id}", title_justify="left", expand=False)
    table.add_column("time", no_wrap=True)
    table.add_column("step", no_wrap=True, justify="right")
    table.add_column("what happened", overflow="fold", ratio=1)
    for ev, text in pm.timeline:
        style = _STATUS_STYLE[ev.status.value]
        table.add_row(
            _clock(ev.wall_time), _opt(ev.step), f"[{style}]{escape(text)}[/]" if style else escape(text)
        )
    return table


def print_postmortem(pm: Postmortem, console: Console, *, full: bool = True) -> None:
    """``full=False`` (``incidents show``): summary and timeline; ``True`` adds the analysis sections."""
    console.print(
        f"[bold]Incident {pm.incident.id}[/bold] — {escape(pm.incident.job)} ({pm.incident.state.value})"
    )
    console.print(pm.summary, highlight=False, markup=False)
    console.print(timeline_table(pm))
    if not full:
        return
    diag = pm.diagnosis
    if diag is not None:
        console.print("[bold]Root cause and evidence[/bold]")
        for cs in diag.causes:
            console.print(f"  {cs.cause.value} ({cs.score:.2f})", highlight=False)
            for line in cs.evidence:
                console.print(f"    - {line}", highlight=False, markup=False)
    for title, rows in (("Impact", impact_lines(pm)), ("Detection gap", detection_lines(pm))):
        console.print(f"[bold]{title}[/bold]")
        for key, value in rows:
            console.print(f"  {key}: {value}", highlight=False, markup=False)
    console.print("[bold]Permanent measures[/bold]")
    for i, m in enumerate(pm.measures, 1):
        console.print(f"  {i}. {m.kind}: {m.action}", highlight=False, markup=False)


def _clock(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%H:%M:%S")


def _short_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%m-%d %H:%M:%S")


def _opt(value: int | None) -> str:
    return "" if value is None else str(value)

"""Postmortem as Markdown, and the pieces of wording every renderer shares."""

from __future__ import annotations

from datetime import datetime, timezone

from supervisor.incidents.postmortem import Postmortem, rollbacks_words, suspects_relevant


def when(ts: float | None) -> str:
    return (
        "—" if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    )


def clock(ts: float) -> str:
    """Time of day (UTC) of a timeline event; the report's header gives the date."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%H:%M:%S")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def impact_lines(pm: Postmortem) -> list[tuple[str, str]]:
    im = pm.impact
    return [
        ("Steps lost (all rollbacks)" if len(im.rollbacks) > 1 else "Steps lost", rollbacks_words(im)),
        ("Downtime (detection → resume)", duration(im.downtime_s)),
        ("Re-training of lost steps", duration(im.recompute_s)),
        ("Wall time lost", duration(im.wall_time_lost_s)),
        ("Data excluded", "; ".join(im.data_excluded) or "none"),
    ]


def detection_lines(pm: Postmortem) -> list[tuple[str, str]]:
    d = pm.detection
    first = "unknown" if d.first_step is None else f"step {d.first_step}: {d.first_metric}"
    if d.first_rank is not None:
        first += f" on rank {d.first_rank}"
    gap = "unknown" if d.gap_steps is None else f"{d.gap_steps} steps"
    if d.gap_s is not None:
        gap += f", {duration(d.gap_s)}"
    earlier = d.earlier_signal.label if d.earlier_signal else "none"
    return [
        ("First abnormal quantity", first),
        ("Detected at", "unknown" if d.detected_step is None else f"step {d.detected_step}"),
        ("Detection gap", gap),
        ("Signal that would have caught it earlier", earlier),
        ("Why", d.note),
    ]


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(pm: Postmortem) -> str:
    inc, diag = pm.incident, pm.diagnosis
    out = [f"# Incident {inc.id} — {inc.job}", "", pm.summary, ""]
    out += [
        f"- **State:** {inc.state.value}",
        f"- **Opened:** {when(inc.opened_at)}; **closed:** {when(inc.closed_at)}",
        "",
        "## Timeline",
        "",
        "| time | step | what happened |",
        "|---|---|---|",
    ]
    for ev, text in pm.timeline:
        out.append(f"| {clock(ev.wall_time)} | {'' if ev.step is None else ev.step} | {_cell(text)} |")
    out += ["", "## Root cause and evidence", ""]
    if diag is None:
        out.append("No diagnosis recorded.")
    else:
        out.append(
            f"Phenotype **{diag.phenotype.value}**; attributes: {', '.join(diag.attributes) or 'none'}."
        )
        if diag.nonfinite_at:
            out.append(f"First non-finite value at `{diag.nonfinite_at}`.")
        out.append("")
        for cs in diag.causes:
            out.append(f"- **{cs.cause.value}** (score {cs.score:.2f})")
            out += [f"  - {_cell(ev)}" for ev in cs.evidence]
        if suspects_relevant(diag):
            out += ["", "Suspect samples (IDs): " + ", ".join(f"`{s}`" for s in diag.suspect_samples)]
    out += ["", "## Impact", ""] + [f"- **{k}:** {v}" for k, v in impact_lines(pm)]
    out += ["", "## Detection gap", ""] + [f"- **{k}:** {v}" for k, v in detection_lines(pm)]
    if pm.detection.crossings:
        out += ["", "| signal | left its band at step | value | baseline | z |", "|---|---|---|---|---|"]
        for c in pm.detection.crossings:
            out.append(f"| {c.label} | {c.step} | {c.value:.4g} | {c.baseline:.4g} | {c.z:.1f} |")
    out += ["", "## Permanent measures", ""]
    out += [f"{i}. **{m.kind}**: {m.action} _Why:_ {m.why}." for i, m in enumerate(pm.measures, 1)] or [
        "None."
    ]
    if pm.artifacts:
        out += ["", "## Artifacts", ""] + [f"- {a['kind']}: `{a['ref']}`" for a in pm.artifacts]
    return "\n".join(out) + "\n"

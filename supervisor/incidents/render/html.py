"""Postmortem as one self-contained HTML file: inline CSS, plots embedded as base64 PNG, no network.

A small inline script records each plot's natural size on ``<body data-plot-sizes>`` once
the page has loaded, so a headless browser test can check the images really decoded.
"""

from __future__ import annotations

import base64
from html import escape

from supervisor.incidents.postmortem import Postmortem, suspects_relevant
from supervisor.incidents.render.text import clock, detection_lines, impact_lines, when

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } .pending { color: #b36b00; } .failed { color: #b00020; font-weight: bold; }
.state { display: inline-block; padding: 1px 8px; border-radius: 8px; background: #eef; }
img.plot { display: block; max-width: 100%; margin: 0.6em 0; border: 1px solid #eee; }
code { background: #f6f6f6; padding: 0 3px; }
"""

_SCRIPT = """
window.addEventListener("load", function () {
  var sizes = [];
  document.querySelectorAll("img.plot").forEach(function (img) {
    sizes.push(img.naturalWidth + "x" + img.naturalHeight);
  });
  document.body.setAttribute("data-plot-sizes", sizes.join(","));
  document.body.setAttribute("data-loaded", "1");
});
"""


def to_html(pm: Postmortem, *, plots: list[tuple[str, bytes]] | None = None) -> str:
    """The report; ``plots`` defaults to the standard panels of ``render.plots``."""
    if plots is None:
        from supervisor.incidents.render.plots import plot_panels  # matplotlib only when rendering HTML

        plots = plot_panels(pm)
    inc = pm.incident
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Incident {inc.id} — {escape(inc.job)}</title>",
        f"<style>{_CSS}</style></head>",
        f'<body data-incident="{inc.id}">',
        f"<h1>Incident {inc.id} — {escape(inc.job)} <span class='state'>{escape(inc.state.value)}</span></h1>",
        f"<p>{escape(pm.summary)}</p>",
        f"<p>Opened {escape(when(inc.opened_at))}; closed {escape(when(inc.closed_at))}.</p>",
        "<h2>Telemetry around the incident</h2>",
    ]
    if plots:
        for title, png in plots:
            data = base64.b64encode(png).decode("ascii")
            parts.append(f'<img class="plot" alt="{escape(title)}" src="data:image/png;base64,{data}">')
    else:
        parts.append("<p>No telemetry window was stored with this incident.</p>")
    parts += _timeline(pm) + _root_cause(pm)
    parts += ["<h2>Impact</h2>", _kv(impact_lines(pm)), "<h2>Detection gap</h2>", _kv(detection_lines(pm))]
    parts += ["<h2>Permanent measures</h2>", "<ol>"]
    parts += [
        f"<li><b>{escape(m.kind)}</b>: {escape(m.action)} <i>Why: {escape(m.why)}.</i></li>"
        for m in pm.measures
    ]
    parts.append("</ol>")
    if pm.artifacts:
        parts += ["<h2>Artifacts</h2>", "<ul>"]
        parts += [f"<li>{escape(a['kind'])}: <code>{escape(a['ref'])}</code></li>" for a in pm.artifacts]
        parts.append("</ul>")
    parts += [f"<script>{_SCRIPT}</script>", "</body></html>"]
    return "\n".join(parts) + "\n"


def _kv(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _timeline(pm: Postmortem) -> list[str]:
    rows = [
        "<h2>Timeline</h2>",
        "<table class='timeline'><tr><th>time (UTC)</th><th>step</th><th>what happened</th></tr>",
    ]
    for ev, text in pm.timeline:
        cls = ev.status.value
        step = "" if ev.step is None else str(ev.step)
        rows.append(
            f"<tr class='{cls}' data-kind='{escape(ev.kind.value)}'><td>{escape(clock(ev.wall_time))}</td>"
            f"<td>{step}</td><td>{escape(text)}</td></tr>"
        )
    rows.append("</table>")
    return rows


def _root_cause(pm: Postmortem) -> list[str]:
    out = ["<h2>Root cause and evidence</h2>"]
    diag = pm.diagnosis
    if diag is None:
        return [*out, "<p>No diagnosis recorded.</p>"]
    attrs = ", ".join(diag.attributes) or "none"
    out.append(f"<p>Phenotype <b>{escape(diag.phenotype.value)}</b>; attributes: {escape(attrs)}.</p>")
    if diag.nonfinite_at:
        out.append(f"<p>First non-finite value at <code>{escape(diag.nonfinite_at)}</code>.</p>")
    out.append("<ul>")
    for cs in diag.causes:
        evidence = "".join(f"<li>{escape(e)}</li>" for e in cs.evidence)
        out.append(f"<li><b>{escape(cs.cause.value)}</b> (score {cs.score:.2f})<ul>{evidence}</ul></li>")
    out.append("</ul>")
    if suspects_relevant(diag):
        ids = ", ".join(f"<code>{escape(s)}</code>" for s in diag.suspect_samples)
        out.append(f"<p>Suspect samples (IDs): {ids}</p>")
    return out

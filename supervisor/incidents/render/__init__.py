"""Report renderers, by format name (a registry: an unknown name lists the valid ones)."""

from __future__ import annotations

import json
from collections.abc import Callable

from supervisor.errors import IncidentStoreError
from supervisor.incidents.postmortem import Postmortem, build_postmortem
from supervisor.incidents.store import IncidentStore


def _json(pm: Postmortem) -> str:
    return json.dumps(pm.to_json(), indent=2, allow_nan=False) + "\n"


def _md(pm: Postmortem) -> str:
    from supervisor.incidents.render.text import to_markdown

    return to_markdown(pm)


def _html(pm: Postmortem) -> str:
    from supervisor.incidents.render.html import to_html

    return to_html(pm)


FORMATS: dict[str, Callable[[Postmortem], str]] = {"md": _md, "html": _html, "json": _json}


def render_postmortem(pm: Postmortem, fmt: str) -> str:
    try:
        renderer = FORMATS[fmt]
    except KeyError:
        raise IncidentStoreError(f"unknown report format {fmt!r}; valid: {', '.join(FORMATS)}") from None
    return renderer(pm)


def render_report(store: IncidentStore, incident_id: int, fmt: str) -> str:
    """The postmortem of one incident as Markdown, HTML or JSON text."""
    return render_postmortem(build_postmortem(store, incident_id), fmt)


__all__ = ["FORMATS", "render_postmortem", "render_report"]

"""One-line descriptions of timeline events, one describer per kind (a registry; unknown kinds fall back)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from supervisor.incidents.models import Event
from supervisor.incidents.states import EventKind, EventStatus


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple):
        return f"[{', '.join(_fmt(v) for v in value[:6])}{', …' if len(value) > 6 else ''}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_fmt(v)}" for k, v in list(value.items())[:6]) + "}"
    return str(value)


def _pairs(d: dict[str, Any] | None, skip: tuple[str, ...] = ()) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in (d or {}).items() if k not in skip)


def _detected(e: Event) -> str:
    d = e.payload.get("diagnosis") or {}
    return f"{d.get('phenotype', 'loss')} spike detected (onset step {d.get('onset_step')}, severity {d.get('severity')})"


def _diagnosed(e: Event) -> str:
    d = e.payload.get("diagnosis") or {}
    causes = ", ".join(f"{c['cause']} {c['score']:.2f}" for c in d.get("causes", [])[:3]) or "no causes"
    return f"diagnosis: {d.get('phenotype')}; causes {causes}"


def _state(e: Event) -> str:
    return f"{e.payload.get('from')} → {e.payload.get('to')}: {e.payload.get('reason', '')}"


def _rolled_back(e: Event) -> str:
    p, r = e.payload, e.result or {}
    verified = "" if "verified" not in r else (", verified" if r["verified"] else ", NOT verified")
    ckpt = f" ({p['checkpoint']})" if p.get("checkpoint") else ""
    return f"rolled back from step {p.get('from_step', e.step)} to step {p.get('to_step')}{ckpt}{verified}"


def _observation(e: Event) -> str:
    r = e.result or {}
    passed = r.get("passed")
    verdict = "running" if passed is None else ("passed" if passed else "failed")
    checks = r.get("checks") or {}
    detail = ", ".join(
        f"{k} {'ok' if (v.get('ok') if isinstance(v, dict) else v) else 'FAILED'}" for k, v in checks.items()
    )
    window = e.payload.get("window") or (f"{e.payload['steps']} steps" if e.payload.get("steps") else "")
    return f"observation {_fmt(window)}: {verdict}{f' ({detail})' if detail else ''}"


def _generic(e: Event) -> str:
    body = _pairs(e.payload)
    result = _pairs(e.result)
    return f"{e.kind.value.replace('_', ' ')}{f': {body}' if body else ''}{f' → {result}' if result else ''}"


DESCRIBERS: dict[EventKind, Callable[[Event], str]] = {
    EventKind.DETECTED: _detected,
    EventKind.DIAGNOSED: _diagnosed,
    EventKind.STATE_CHANGED: _state,
    EventKind.ROLLED_BACK: _rolled_back,
    EventKind.OBSERVATION: _observation,
}


def describe(event: Event) -> str:
    text = DESCRIBERS.get(event.kind, _generic)(event)
    if event.status == EventStatus.PENDING:
        return text + " (pending: started, not finished)"
    if event.status == EventStatus.FAILED:
        return text + " (FAILED)"
    return text

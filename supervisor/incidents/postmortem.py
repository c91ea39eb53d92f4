"""The postmortem: a value built from an incident's timeline, diagnosis and telemetry window.

Every renderer (terminal, Markdown, JSON, HTML) formats the same ``Postmortem``; nothing
here formats text for a particular output.

Payload conventions read from the timeline (written by the runtime):
``rolled_back``: ``from_step``, ``to_step``, ``checkpoint``; ``fix_applied``: ``exclude_samples``,
``exclude_sources``, ``exclude_batches`` ([first, last] step), ``skip_batches``, and any
override (``lr_scale``, ``warmup_steps``, ``grad_clip``, ``precision``); ``observation``:
``window`` ([first, last] step) or ``steps``, result ``passed`` and ``checks``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from supervisor.core.model import Diagnosis
from supervisor.incidents.measures import Measure, suggest
from supervisor.incidents.models import Event, Incident, strict
from supervisor.incidents.signals import Crossing, aggregate, first_crossings
from supervisor.incidents.states import EventKind, EventStatus
from supervisor.incidents.store import IncidentStore
from supervisor.incidents.timeline import describe


@dataclass(slots=True)
class Impact:
    steps_lost: int = 0
    rollback_from: int | None = None
    rollback_to: int | None = None
    downtime_s: float | None = None
    recompute_s: float | None = None
    data_excluded: list[str] = field(default_factory=list)

    @property
    def wall_time_lost_s(self) -> float | None:
        parts = [p for p in (self.downtime_s, self.recompute_s) if p is not None]
        return sum(parts) if parts else None


@dataclass(slots=True)
class DetectionGap:
    first_step: int | None
    first_metric: str | None
    first_rank: int | None
    detected_step: int | None
    gap_steps: int | None
    gap_s: float | None
    crossings: list[Crossing]
    earlier_signal: Crossing | None
    note: str


@dataclass(slots=True)
class Markers:
    """What the plots mark: steps of the incident's landmarks and ranges."""

    onset_step: int | None = None
    first_step: int | None = None
    first_rank: int | None = None
    detected_step: int | None = None
    rollback_to: int | None = None
    excluded: list[tuple[int, int]] = field(default_factory=list)
    observation: tuple[int, int] | None = None


@dataclass(slots=True)
class Postmortem:
    incident: Incident
    summary: str
    timeline: list[tuple[Event, str]]
    diagnosis: Diagnosis | None
    impact: Impact
    detection: DetectionGap
    measures: list[Measure]
    markers: Markers
    series: list[dict[str, Any]]
    replayed: list[dict[str, Any]]
    artifacts: list[dict[str, Any]]
    generated_at: float

    def to_json(self) -> dict[str, Any]:
        det = self.detection
        return strict(
            {
                "incident": self.incident.to_json(),
                "summary": self.summary,
                "timeline": [{**e.to_json(), "summary": text} for e, text in self.timeline],
                "root_cause": {
                    "top_cause": self.incident.top_cause,
                    "causes": [c.to_json() for c in self.diagnosis.causes] if self.diagnosis else [],
                    "attributes": self.diagnosis.attributes if self.diagnosis else [],
                    "suspect_samples": self.diagnosis.suspect_samples if self.diagnosis else [],
                },
                "impact": {**asdict(self.impact), "wall_time_lost_s": self.impact.wall_time_lost_s},
                "detection_gap": {
                    **{
                        k: getattr(det, k)
                        for k in ("first_step", "first_metric", "first_rank", "detected_step")
                    },
                    "gap_steps": det.gap_steps,
                    "gap_s": det.gap_s,
                    "earlier_signal": det.earlier_signal.to_json() if det.earlier_signal else None,
                    "crossings": [c.to_json() for c in det.crossings],
                    "note": det.note,
                },
                "measures": [m.to_json() for m in self.measures],
                "markers": asdict(self.markers),
                "artifacts": self.artifacts,
                "series_rows": len(self.series),
                "replayed_rows": len(self.replayed),
                "generated_at": self.generated_at,
            }
        )


def build_postmortem(store: IncidentStore, incident_id: int, *, z_threshold: float = 6.0) -> Postmortem:
    incident = store.get(incident_id)
    events = store.timeline(incident_id)
    series = store.series(incident_id)
    diagnosis = incident.diagnosis
    impact = _impact(incident, events, series)
    detection = _detection(incident, diagnosis, events, series, z_threshold)
    markers = _markers(incident, diagnosis, events, impact, detection)
    return Postmortem(
        incident=incident,
        summary=_summary(incident, diagnosis, impact),
        timeline=[(e, describe(e)) for e in events],
        diagnosis=diagnosis,
        impact=impact,
        detection=detection,
        measures=suggest(diagnosis, detection.earlier_signal.signal if detection.earlier_signal else None),
        markers=markers,
        series=series,
        replayed=[r for r in store.series(incident_id, replay=None) if r.get("replay")],
        artifacts=[a.to_json() for a in store.artifacts(incident_id)],
        generated_at=time.time(),
    )


def _done(events: list[Event], kind: EventKind) -> list[Event]:
    return [e for e in events if e.kind == kind and e.status == EventStatus.DONE]


def _pick(d: dict[str, Any] | None, *names: str) -> Any:
    for name in names:
        if d and d.get(name) is not None:
            return d[name]
    return None


def _impact(incident: Incident, events: list[Event], series: list[dict[str, Any]]) -> Impact:
    impact = Impact()
    for ev in _done(events, EventKind.ROLLED_BACK):
        src = _pick(ev.payload, "from_step", "from") or ev.step
        dst = _pick(ev.payload, "to_step", "to", "target_step")
        if src is not None and dst is not None:
            impact.steps_lost += max(0, int(src) - int(dst))
            impact.rollback_from, impact.rollback_to = int(src), int(dst)
    for ev in _done(events, EventKind.FIX_APPLIED):
        impact.data_excluded += _excluded_text(ev.payload)
    detected = next((e.wall_time for e in events if e.kind == EventKind.DETECTED), incident.opened_at)
    resumed = _done(events, EventKind.RESUMED)
    end = resumed[-1].wall_time if resumed else incident.closed_at
    impact.downtime_s = (end - detected) if end is not None else None
    # The runtime measures it when the incident closes: wall time training did not advance.
    measured = [
        e.payload["downtime_s"] for e in events if e.kind == EventKind.NOTE and "downtime_s" in e.payload
    ]
    if measured:
        impact.downtime_s = float(measured[-1])
    step_time = _median_step_time(series)
    if step_time is not None:
        impact.recompute_s = impact.steps_lost * step_time
    return impact


def _excluded_text(p: dict[str, Any]) -> list[str]:
    out = []
    if p.get("exclude_samples"):
        ids = [str(s) for s in p["exclude_samples"]]
        out.append(f"{len(ids)} samples: {', '.join(ids[:8])}{' …' if len(ids) > 8 else ''}")
    if p.get("exclude_sources"):
        out.append("sources: " + ", ".join(str(s) for s in p["exclude_sources"]))
    rng = p.get("exclude_batches")
    if isinstance(rng, list | tuple) and len(rng) == 2:
        out.append(f"batches of steps {rng[0]}–{rng[1]}")
    if p.get("skip_batches"):
        out.append(f"skipped {p['skip_batches']} batches")
    return out


def _median_step_time(series: list[dict[str, Any]]) -> float | None:
    agg = aggregate(series)
    direct = [row["step_time"] for row in agg.values() if "step_time" in row]
    if direct:
        return float(statistics.median(direct))
    timed = sorted((step, row["time"]) for step, row in agg.items() if "time" in row)
    deltas = [(t2 - t1) / (s2 - s1) for (s1, t1), (s2, t2) in zip(timed, timed[1:], strict=False) if s2 > s1]
    return float(statistics.median(deltas)) if deltas else None


def _detection(
    incident: Incident, diag: Diagnosis | None, events: list[Event], series: list[dict[str, Any]], z: float
) -> DetectionGap:
    fa = diag.first_anomaly if diag else None
    first_step = fa.step if fa else incident.onset_step
    detected = incident.detected_step
    if detected is None:
        detected = next((e.step for e in events if e.kind == EventKind.DETECTED), None)
    gap = detected - first_step if detected is not None and first_step is not None else None
    times = {s: row["time"] for s, row in aggregate(series).items() if "time" in row}
    gap_s = (
        times[detected] - times[first_step]
        if detected is not None and first_step is not None and {detected, first_step} <= set(times)
        else None
    )
    reference = min(x for x in (incident.onset_step, first_step, detected) if x is not None) if series else 0
    crossings = first_crossings(series, reference, z_threshold=z) if series else []
    loss_hit = next((c.step for c in crossings if c.signal == "loss" and c.rank is None), None)
    alarm = loss_hit if loss_hit is not None else detected
    earlier = next(
        (c for c in crossings if c.signal != "loss" and alarm is not None and c.step < alarm), None
    )
    return DetectionGap(
        first_step=first_step,
        first_metric=fa.metric if fa else ("loss" if first_step is not None else None),
        first_rank=fa.rank if fa else (diag.first_rank if diag else None),
        detected_step=detected,
        gap_steps=gap,
        gap_s=gap_s,
        crossings=crossings,
        earlier_signal=earlier,
        note=_gap_note(gap, detected, earlier, loss_hit),
    )


def _gap_note(gap: int | None, detected: int | None, earlier: Crossing | None, loss_hit: int | None) -> str:
    parts = []
    if gap is not None:
        parts.append(f"detected {gap} step{'s' if gap != 1 else ''} after the first abnormal quantity")
    if earlier is not None and detected is not None:
        ref = f"the loss did (step {loss_hit})" if loss_hit is not None else f"detection (step {detected})"
        lead = (loss_hit if loss_hit is not None else detected) - earlier.step
        parts.append(
            f"{earlier.label} left its band at step {earlier.step}, {lead} step{'s' if lead != 1 else ''} "
            f"before {ref}; an alert on it would have caught the incident "
            f"{detected - earlier.step} steps earlier"
        )
    elif detected is not None:
        parts.append("no other signal left its band before the loss")
    return "; ".join(parts) or "no detection data"


def _markers(
    incident: Incident, diag: Diagnosis | None, events: list[Event], impact: Impact, det: DetectionGap
) -> Markers:
    m = Markers(
        onset_step=incident.onset_step,
        first_step=det.first_step,
        first_rank=det.first_rank,
        detected_step=det.detected_step,
        rollback_to=impact.rollback_to,
    )
    for ev in _done(events, EventKind.FIX_APPLIED):
        rng = ev.payload.get("exclude_batches")
        if isinstance(rng, list | tuple) and len(rng) == 2:
            m.excluded.append((int(rng[0]), int(rng[1])))
        elif ev.payload.get("skip_batches") and ev.step is not None:
            m.excluded.append((ev.step, ev.step + int(ev.payload["skip_batches"]) - 1))
    resumed = _done(events, EventKind.RESUMED)
    start_default = resumed[0].step if resumed and resumed[0].step is not None else impact.rollback_to
    for ev in [e for e in events if e.kind == EventKind.OBSERVATION]:
        window = ev.payload.get("window")
        if isinstance(window, list | tuple) and len(window) == 2:
            m.observation = (int(window[0]), int(window[1]))
        elif ev.payload.get("steps") and start_default is not None:
            m.observation = (start_default, start_default + int(ev.payload["steps"]))
    return m


def _summary(incident: Incident, diag: Diagnosis | None, impact: Impact) -> str:
    if diag is None:
        return f"Incident {incident.id} of job {incident.job}: {incident.state.value}, no diagnosis recorded."
    where = f" on rank {diag.first_rank}" if diag.first_rank is not None else ""
    attrs = f" [{', '.join(diag.attributes)}]" if diag.attributes else ""
    cause = diag.causes[0] if diag.causes else None
    why = f"; most likely cause {cause.cause.value} ({cause.score:.2f})" if cause else ""
    parts = [
        f"Incident {incident.id} of job {incident.job}: {diag.severity.value} {diag.phenotype.value} loss spike"
        f"{attrs} starting at step {diag.onset_step}{where}, detected at step {incident.detected_step}{why}."
    ]
    if impact.rollback_to is not None:
        parts.append(
            f"Rolled back from step {impact.rollback_from} to {impact.rollback_to} ({impact.steps_lost} steps lost)."
        )
    parts.append(f"State: {incident.state.value}.")
    return " ".join(parts)

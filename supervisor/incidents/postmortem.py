"""The postmortem: a value built from an incident's timeline, diagnosis and telemetry window.

Every renderer (terminal, Markdown, JSON, HTML) formats the same ``Postmortem``; nothing
here formats text for a particular output.

Fields read from the timeline (``timeline.field``: the action's result, memo, params, then the
payload): ``rolled_back``: ``from_step``, ``to_step``, ``checkpoint``; ``fix_applied``: the
applied ``overrides`` (``exclusions``: samples, sources, batch ranges) or ``exclude_samples``,
``exclude_sources``, ``exclude_batches`` ([first, last] step), ``skip_batches``, and any
override (``lr_scale``, ``warmup_steps``, ``grad_clip``, ``precision``); ``observation``:
``window`` ([first, last] step) or ``from_step`` + ``steps``, result ``passed``, ``checks``
(``value``/``limit`` per criterion) and the ``baseline`` they were judged against.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from dataclasses import field as dataclass_field
from typing import Any

from supervisor.core.model import Diagnosis
from supervisor.incidents.measures import Measure, root_cause, suggest
from supervisor.incidents.models import Event, Incident, strict
from supervisor.incidents.signals import Crossing, aggregate, first_crossings
from supervisor.incidents.states import EventKind, EventStatus
from supervisor.incidents.store import IncidentStore
from supervisor.incidents.timeline import Context, describe, field


@dataclass(slots=True)
class Impact:
    steps_lost: int = 0
    """Steps trained again, summed over every rollback of the incident (``rollbacks``)."""
    rollback_from: int | None = None
    rollback_to: int | None = None
    rollbacks: list[tuple[int, int]] = dataclass_field(default_factory=list)
    """(from step, to step) of each done rollback, oldest first; the last is ``rollback_from/_to``."""
    downtime_s: float | None = None
    recompute_s: float | None = None
    data_excluded: list[str] = dataclass_field(default_factory=list)

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


@dataclass(frozen=True, slots=True)
class Threshold:
    """One pass criterion drawn on a plot: ``value`` in the signal's units, over the window."""

    value: float
    upper: bool
    ok: bool
    label: str


@dataclass(slots=True)
class Markers:
    """What the plots mark: steps of the incident's landmarks and ranges."""

    onset_step: int | None = None
    first_step: int | None = None
    first_rank: int | None = None
    detected_step: int | None = None
    rollback_to: int | None = None
    excluded: list[tuple[int, int]] = dataclass_field(default_factory=list)
    observation: tuple[int, int] | None = None
    rank_local: bool = False
    thresholds: dict[str, Threshold] = dataclass_field(default_factory=dict)
    """Pass criteria of the last judged observation, per plotted signal, in the signal's units."""


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
                    "first": (r.to_json() if (r := root_cause(self.diagnosis)) is not None else None),
                    "causes": [c.to_json() for c in self.diagnosis.causes] if self.diagnosis else [],
                    "attributes": self.diagnosis.attributes if self.diagnosis else [],
                    "suspect_samples": self.diagnosis.suspect_samples
                    if suspects_relevant(self.diagnosis) and self.diagnosis
                    else [],
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
    impact = _impact(incident, diagnosis, events, series)
    detection = _detection(incident, diagnosis, events, series, z_threshold)
    markers = _markers(incident, diagnosis, events, impact, detection)
    ctx = Context(world_size=_world_size(series, events), closed=incident.state.is_terminal)
    return Postmortem(
        incident=incident,
        summary=_summary(incident, diagnosis, impact),
        timeline=[(e, describe(e, ctx)) for e in events],
        diagnosis=diagnosis,
        impact=impact,
        detection=detection,
        measures=suggest(diagnosis, detection.earlier_signal.signal if detection.earlier_signal else None),
        markers=markers,
        series=series,
        replayed=store.series(incident_id, reruns=True),
        artifacts=[a.to_json() for a in store.artifacts(incident_id)],
        generated_at=time.time(),
    )


def suspects_relevant(diag: Diagnosis | None) -> bool:
    """Suspect samples matter to a reader only when the data is blamed: never for an optimizer,
    numeric or metric incident, where listing them would send a person after the wrong thing."""
    if diag is None or not diag.suspect_samples or not diag.causes:
        return False
    return diag.causes[0].cause.value == "data"


def _world_size(series: list[dict[str, Any]], events: list[Event]) -> int | None:
    sizes = [int(r["world_size"]) for r in series if isinstance(r.get("world_size"), int)]
    if sizes:
        return max(sizes)
    ranks = {int(r["rank"]) for r in series if isinstance(r.get("rank"), int)}
    acked = [len(field(e, "ranks")) for e in events if isinstance(field(e, "ranks"), list)]
    return max([len(ranks)] * bool(ranks) + acked, default=None)


def rollbacks_words(impact: Impact) -> str:
    """ "86 steps in total over 2 rollbacks: 300 → 257 (43), 343 → 300 (43)"; one: "43 (rollback 300 → 257)"."""
    if not impact.rollbacks:
        return f"{impact.steps_lost} (rollback none)"
    if len(impact.rollbacks) == 1:
        return f"{impact.steps_lost} (rollback {impact.rollbacks[0][0]} → {impact.rollbacks[0][1]})"
    each = [f"{a} → {b} ({max(0, a - b)})" for a, b in impact.rollbacks]
    return f"{impact.steps_lost} in total over {len(each)} rollbacks: {', '.join(each)}"


def _done(events: list[Event], kind: EventKind) -> list[Event]:
    return [e for e in events if e.kind == kind and e.status == EventStatus.DONE]


def _impact(
    incident: Incident, diag: Diagnosis | None, events: list[Event], series: list[dict[str, Any]]
) -> Impact:
    impact = Impact()
    for ev in _done(events, EventKind.ROLLED_BACK):
        src = field(ev, "from_step")
        src = src if src is not None else ev.step
        dst = field(ev, "to_step")
        if src is not None and dst is not None:
            impact.steps_lost += max(0, int(src) - int(dst))
            impact.rollback_from, impact.rollback_to = int(src), int(dst)
            impact.rollbacks.append((int(src), int(dst)))
    suspects = set(diag.suspect_samples) if suspects_relevant(diag) and diag is not None else set()
    for ev in _done(events, EventKind.FIX_APPLIED):
        impact.data_excluded += _excluded_text(ev, suspects)
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
    # Measured when the run ended (``observability.time_lost``): the re-trained steps' own time, and
    # the incident's share of the time training stood still.
    noted = [e.payload["time_lost"] for e in events if e.kind == EventKind.NOTE and isinstance(e.payload.get("time_lost"), dict)]  # fmt: skip
    if noted:
        if noted[-1].get("steps_retrained"):
            impact.recompute_s = float(noted[-1].get("retrain_s") or 0.0)
        if noted[-1].get("downtime_s") is not None:
            impact.downtime_s = float(noted[-1]["downtime_s"])
    return impact


def _exclusions(ev: Event) -> tuple[list[str], list[str], list[tuple[int, int]]]:
    """(samples, sources, step ranges) a fix excluded: what the runtime applied, else what was asked."""
    overrides = field(ev, "overrides")
    applied = overrides.get("exclusions") if isinstance(overrides, dict) else None
    asked = field(ev, "exclude") if isinstance(field(ev, "exclude"), dict) else {}
    samples = (applied or {}).get("samples") or field(ev, "exclude_samples") or asked.get("samples") or []
    sources = (applied or {}).get("sources") or field(ev, "exclude_sources") or asked.get("sources") or []
    ranges = []
    rng = field(ev, "exclude_batches") or asked.get("batch_range")
    if isinstance(rng, list | tuple) and len(rng) == 2:
        ranges.append((int(rng[0]), int(rng[1])))
    return (
        [str(x) for x in samples] if isinstance(samples, list | tuple) else [],
        [str(x) for x in sources] if isinstance(sources, list | tuple) else [],
        ranges,
    )


def _excluded_text(ev: Event, suspects: set[str]) -> list[str]:
    samples, sources, ranges = _exclusions(ev)
    out = []
    if samples and set(samples) == suspects:
        out.append(
            f"the {len(samples)} suspect sample{'s' if len(samples) != 1 else ''} (IDs under root cause)"
        )
    elif samples:
        out.append(f"{len(samples)} samples: {', '.join(samples[:8])}{' …' if len(samples) > 8 else ''}")
    if sources:
        out.append("sources: " + ", ".join(sources))
    out += [f"batches of steps {a}–{b}" for a, b in ranges]
    if field(ev, "skip_batches"):
        out.append(f"skipped {field(ev, 'skip_batches')} batches")
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
        rank_local=bool(diag and diag.rank_local),
    )
    for ev in _done(events, EventKind.FIX_APPLIED):
        m.excluded += _exclusions(ev)[2]
        if field(ev, "skip_batches") and ev.step is not None:
            m.excluded.append((ev.step, ev.step + int(field(ev, "skip_batches")) - 1))
    resumed = _done(events, EventKind.RESUMED)
    start_default = resumed[0].step if resumed and resumed[0].step is not None else impact.rollback_to
    for ev in [e for e in events if e.kind == EventKind.OBSERVATION]:
        window, start, steps = field(ev, "window"), field(ev, "from_step"), field(ev, "steps")
        start = start if start is not None else start_default
        if isinstance(window, list | tuple) and len(window) == 2:
            m.observation = (int(window[0]), int(window[1]))
        elif steps and start is not None:
            m.observation = (int(start), int(start) + int(steps))
        if isinstance(field(ev, "checks"), dict):
            m.thresholds = _thresholds(field(ev, "checks"), field(ev, "baseline") or {})
    return m


def _thresholds(checks: dict[str, Any], base: dict[str, Any]) -> dict[str, Threshold]:
    """The observation's criteria in each plotted signal's units (grad norm and update ratio are
    judged as a ratio to the baseline)."""
    out: dict[str, Threshold] = {}
    loss = checks.get("loss")
    if isinstance(loss, dict) and _num(loss.get("limit")):
        out["loss"] = Threshold(
            float(loss["limit"]), True, bool(loss.get("ok")), "loss limit (baseline median + MADs)"
        )
    for name in ("grad_norm", "update_ratio"):
        c = checks.get(name)
        if isinstance(c, dict) and _num(c.get("limit")) and _num(base.get(name)):
            value = float(c["limit"]) * float(base[name])
            out[name] = Threshold(
                value, True, bool(c.get("ok")), f"{name.replace('_', ' ')} limit ({c['limit']:g}x baseline)"
            )
    return out


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _summary(incident: Incident, diag: Diagnosis | None, impact: Impact) -> str:
    if diag is None:
        return f"Incident {incident.id} of job {incident.job}: {incident.state.value}, no diagnosis recorded."
    where = f" on rank {diag.first_rank}" if diag.first_rank is not None else ""
    attrs = f" [{', '.join(diag.attributes)}]" if diag.attributes else ""
    root = root_cause(diag)
    why = f"; root cause {root.headline()}" if root is not None else ""
    detected = incident.detected_step
    if diag.detected_step is not None and (detected is None or detected < diag.onset_step):
        detected = diag.detected_step  # a later occurrence's own detection, never one before its onset
    when = f"detected at step {detected}"
    if detected is not None and detected < diag.onset_step:  # a recurrence reopened the incident
        when = f"first detected at step {detected}, this occurrence from step {diag.onset_step}"
    parts = [
        f"Incident {incident.id} of job {incident.job}: {diag.severity.value} {diag.phenotype.value} loss spike"
        f"{attrs} starting at step {diag.onset_step}{where}, {when}{why}."
    ]
    if len(impact.rollbacks) > 1:
        parts.append(f"Steps lost: {rollbacks_words(impact)}.")
    elif impact.rollback_to is not None:
        parts.append(
            f"Rolled back from step {impact.rollback_from} to {impact.rollback_to} ({impact.steps_lost} steps lost)."
        )
    parts.append(f"State: {incident.state.value}.")
    return " ".join(parts)

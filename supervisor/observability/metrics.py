"""Prometheus metrics of a supervised job, through ``prometheus-client``.

The values are snapshots the supervisor's loop thread hands in (``on_step``, ``on_incidents``,
``on_checkpoints``); a custom collector renders them at scrape time from the HTTP server's
thread, under a lock. Counts of incidents and actions are recomputed from the incident store,
so they survive a supervisor restart (Prometheus sees a counter that never went back).

Every series carries the label ``training_job`` (the job's name; ``job`` is Prometheus's own
scrape-job label). Names (prefix ``spike_supervisor_``):

| metric | type | labels | meaning |
|---|---|---|---|
| ``incidents`` | gauge | state, phenotype | incidents of the job by state and phenotype |
| ``actions_total`` | counter | action, status | policy actions finished (``done``/``failed``) |
| ``actions_pending`` | gauge | action | actions started and not finished |
| ``detection_delay_steps`` | histogram | | detected step - onset step, per incident |
| ``step`` | gauge | | the last complete step the supervisor analysed |
| ``loss``, ``grad_norm``, ``tokens_per_second`` | gauge | | that step's aggregates |
| ``rank_last_step`` | gauge | rank | the last step each rank reported |
| ``rank_last_record_timestamp_seconds`` | gauge | rank | wall time of that record |
| ``dropped_records_total`` | counter | rank | records the rank's SDK had to drop (bounded buffer) |
| ``checkpoints`` | gauge | health | committed checkpoints by health mark |
| ``checkpoint_newest_healthy_step`` | gauge | | step of the newest healthy checkpoint |
| ``checkpoint_newest_healthy_age_seconds`` | gauge | | its age |
| ``checkpoint_newest_healthy_age_steps`` | gauge | | steps trained since it |
| ``effective_training_time_ratio`` | gauge | | time on steps that survive into the final timeline / wall time |
| ``wall_seconds``, ``effective_training_seconds`` | gauge | | the run's wall time, and the surviving steps' time |
| ``downtime_seconds`` | gauge | | wall time training did not advance (frozen, restarting, held) |
| ``steps_retrained_total`` | counter | | steps trained again after a rollback, all incidents |
| ``retrain_seconds_total`` | counter | | wall time spent re-training them |
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from supervisor.core.frame import StepFrame

PREFIX = "spike_supervisor_"
DELAY_BUCKETS = (0, 1, 2, 3, 5, 10, 20, 50, 100)
HEALTH_MARKS = ("unverified", "verified", "healthy", "diagnostic", "quarantined")


FOLD_STEPS = 64
"""Steps' columns kept unfolded at most (a job nobody scrapes folds them every this many steps)."""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


@dataclass
class _Rank:
    step: int
    time: float | None
    dropped: int = 0


@dataclass
class _Snapshot:
    step: int | None = None
    loss: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    ranks: dict[int, _Rank] = field(default_factory=dict)
    unfolded: list[tuple[list[Any], list[Any], list[Any], list[tuple[int, int]]]] = field(
        default_factory=list
    )
    """Per step not yet in ``ranks``: its rank, step and time columns and (rank, dropped records)
    where a rank said, oldest first."""
    incidents: Counter[tuple[str, str]] = field(default_factory=Counter)
    actions: Counter[tuple[str, str]] = field(default_factory=Counter)
    delays: list[int] = field(default_factory=list)
    checkpoints: Counter[str] | None = None
    newest_healthy: tuple[int, float] | None = None  # (step, created_at)
    time_lost: dict[str, Any] | None = None  # ``observability.time_lost.TimeLedger.summary``


class SupervisorMetrics:
    """The metrics of one job, in their own registry (several jobs may share a process)."""

    def __init__(self, job: str, registry: CollectorRegistry | None = None) -> None:
        self.job = job
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self._lock = threading.Lock()
        self._s = _Snapshot()
        self.registry.register(_Collector(self))
        self._server: Any = None

    # -- inputs (the supervisor's loop thread) ---------------------------------------------------
    def on_step(self, step: int, records: Iterable[Any], aggregate: dict[str, Any] | None = None) -> None:
        """One complete step: every rank's record, and the supervisor's aggregate of them. A step's
        frame is kept as its columns and folded into the per-rank rows when they are read (a
        scrape), so the step costs no work per rank."""
        with self._lock:
            s = self._s
            s.step = step
            if type(records) is StepFrame:
                ranks = records.col("rank")
                drops = [
                    (r, d)
                    for r, a in zip(ranks, records.col("attrs"), strict=True)
                    if "dropped_records" in a and isinstance(d := a["dropped_records"], int)
                ] if records.has("attrs") else []  # fmt: skip
                s.unfolded.append((ranks, records.col("step"), records.col("time"), drops))
                if len(s.unfolded) >= FOLD_STEPS:
                    _fold(s)
            else:
                _fold(s)
                _fold_rows(s.ranks, _rows_of(records))
            agg = aggregate or {}
            s.loss, s.grad_norm = _num(agg.get("loss")), _num(agg.get("grad_norm"))
            s.tokens_per_s = _num(agg.get("tokens_per_s"))

    def on_incidents(self, incidents: Sequence[Any], events: Iterable[Any]) -> None:
        """Every incident of the job (``Incident`` rows) and their timeline events."""
        by_state: Counter[tuple[str, str]] = Counter(
            (inc.state.value, inc.phenotype or "unknown") for inc in incidents
        )
        actions: Counter[tuple[str, str]] = Counter()
        for ev in events:
            action = (ev.payload or {}).get("action")
            if ev.action_id and action:
                actions[(str(action), ev.status.value)] += 1
        delays = [
            inc.detected_step - inc.onset_step
            for inc in incidents
            if inc.detected_step is not None and inc.onset_step is not None
        ]
        with self._lock:
            self._s.incidents, self._s.actions, self._s.delays = by_state, actions, delays

    def on_checkpoints(self, manifests: Sequence[Any]) -> None:
        """Every committed checkpoint manifest of the job."""
        marks = Counter(str(getattr(m.health, "value", m.health)) for m in manifests)
        healthy = [m for m in manifests if str(getattr(m.health, "value", m.health)) == "healthy"]
        newest = max(healthy, key=lambda m: m.step) if healthy else None
        with self._lock:
            self._s.checkpoints = marks
            self._s.newest_healthy = (newest.step, float(newest.created_at)) if newest else None

    def on_time_lost(self, summary: dict[str, Any]) -> None:
        """The run's time lost to instability so far (``observability.time_lost.TimeLedger.summary``)."""
        with self._lock:
            self._s.time_lost = dict(summary)

    # -- outputs ---------------------------------------------------------------------------------
    def render(self) -> bytes:
        """The exposition text a scrape gets."""
        return bytes(generate_latest(self.registry))

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on a daemon thread; returns the bound port (``port=0``: any free one)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return int(server.server_port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def families(self) -> Iterator[Metric]:
        job = self.job
        with self._lock:
            s = self._s
            _fold(s)
            ranks = {k: replace(v) for k, v in s.ranks.items()}  # on_step updates the rows in place
            snap = (s.step, s.loss, s.grad_norm, s.tokens_per_s)
            incidents, actions, delays = Counter(s.incidents), Counter(s.actions), list(s.delays)
            checkpoints, newest = (
                (Counter(s.checkpoints) if s.checkpoints is not None else None),
                s.newest_healthy,
            )
            lost = dict(s.time_lost) if s.time_lost is not None else None
        yield from _incident_families(job, incidents, actions, delays)
        yield from _step_families(job, snap, ranks)
        if checkpoints is not None:
            yield from _checkpoint_families(job, checkpoints, newest, snap[0])
        if lost is not None:
            yield from _time_lost_families(job, lost)


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=["training_job", *labels])


def _incident_families(
    job: str, incidents: Counter[tuple[str, str]], actions: Counter[tuple[str, str]], delays: list[int]
) -> Iterator[Metric]:
    g = _gauge("incidents", "Incidents of the job by state and phenotype.", ["state", "phenotype"])
    for (state, phenotype), n in sorted(incidents.items()):
        g.add_metric([job, state, phenotype], n)
    yield g
    c = CounterMetricFamily(
        PREFIX + "actions",
        "Policy actions finished, by outcome.",
        labels=["training_job", "action", "status"],
    )
    pending = _gauge("actions_pending", "Policy actions started and not finished.", ["action"])
    for (action, status), n in sorted(actions.items()):
        if status == "pending":
            pending.add_metric([job, action], n)
        else:
            c.add_metric([job, action, status], n)
    yield c
    yield pending
    buckets = [(floatToGoString(b), float(sum(1 for d in delays if d <= b))) for b in DELAY_BUCKETS]
    buckets.append(("+Inf", float(len(delays))))
    h = HistogramMetricFamily(
        PREFIX + "detection_delay_steps",
        "Steps from an incident's onset to its detection.",
        labels=["training_job"],
    )
    h.add_metric([job], buckets, sum_value=float(sum(delays)))
    yield h


def _fold(s: _Snapshot) -> None:
    """Fold the steps' columns into the per-rank rows: each rank's newest step and time, and the
    newest count of records it dropped."""
    entries, rows = s.unfolded, s.ranks
    seen: set[int] = set()
    for ranks, steps, times, _ in reversed(entries):  # newest first: a rank's newest record counts
        if seen.issuperset(ranks):
            continue
        for r, st, t in zip(ranks, steps, times, strict=True):
            if r not in seen:
                seen.add(r)
                row = rows.get(r)
                if row is None:
                    row = rows[r] = _Rank(step=0, time=None)
                row.step, row.time = int(st), _num(t)
    for *_, drops in entries:
        for r, d in drops:
            rows[r].dropped = int(d)
    entries.clear()


def _rows_of(records: Iterable[Any]) -> Iterator[tuple[int, Any, Any, Any]]:
    """(rank, step, time, attrs) of each record (a ``Record`` or a dict as sent)."""
    for rec in records:
        if isinstance(rec, dict):
            yield int(rec.get("rank") or 0), rec.get("step"), rec.get("time"), rec.get("attrs")
        else:
            yield rec.rank, rec.step, rec.time, rec.attrs


def _fold_rows(rows: dict[int, _Rank], records: Iterable[tuple[int, Any, Any, Any]]) -> None:
    for rank, step_of, t, attrs in records:  # every rank every step: one object per rank kept
        dropped = attrs.get("dropped_records") if attrs else None
        row = rows.get(rank)
        if row is None:
            row = rows[rank] = _Rank(step=0, time=None)
        row.step, row.time = int(step_of), _num(t)
        if isinstance(dropped, int):
            row.dropped = int(dropped)


def _step_families(
    job: str, snap: tuple[int | None, float | None, float | None, float | None], ranks: dict[int, _Rank]
) -> Iterator[Metric]:
    names = (
        ("step", "The last complete step the supervisor analysed."),
        ("loss", "Token-weighted loss of that step (all ranks)."),
        ("grad_norm", "Grad norm of that step (mean over ranks)."),
        ("tokens_per_second", "Throughput of that step (sum over ranks)."),
    )
    for (name, doc), value in zip(names, snap, strict=True):
        g = _gauge(name, doc)
        if value is not None:
            g.add_metric([job], value)
        yield g
    last = _gauge("rank_last_step", "The last step each rank reported.", ["rank"])
    seen = _gauge("rank_last_record_timestamp_seconds", "Wall time of each rank's last record.", ["rank"])
    dropped = CounterMetricFamily(
        PREFIX + "dropped_records",
        "Records a rank's SDK dropped from its bounded buffer.",
        labels=["training_job", "rank"],
    )
    for rank, r in sorted(ranks.items()):
        last.add_metric([job, str(rank)], r.step)
        if r.time is not None:
            seen.add_metric([job, str(rank)], r.time)
        dropped.add_metric([job, str(rank)], r.dropped)
    yield from (last, seen, dropped)


def _checkpoint_families(
    job: str, marks: Counter[str], newest: tuple[int, float] | None, step: int | None
) -> Iterator[Metric]:
    g = _gauge("checkpoints", "Committed checkpoints by health mark.", ["health"])
    for mark in sorted(set(HEALTH_MARKS) | set(marks)):
        g.add_metric([job, mark], marks.get(mark, 0))
    yield g
    at = _gauge("checkpoint_newest_healthy_step", "Step of the newest healthy checkpoint.")
    age_s = _gauge("checkpoint_newest_healthy_age_seconds", "Age of the newest healthy checkpoint.")
    age_steps = _gauge(
        "checkpoint_newest_healthy_age_steps", "Steps trained since the newest healthy checkpoint."
    )
    if newest is not None:
        at.add_metric([job], newest[0])
        age_s.add_metric([job], max(0.0, time.time() - newest[1]))
        if step is not None:
            age_steps.add_metric([job], max(0, step - newest[0]))
    yield from (at, age_s, age_steps)


_TIME_GAUGES = (
    ("effective_training_time_ratio", "effective_training_time_ratio",
     "Time on steps that survive into the final timeline / the run's wall time."),
    ("wall_seconds", "wall_s", "Wall time since the run started."),
    ("effective_training_seconds", "effective_s", "Time spent on steps that survive into the final timeline."),
    ("downtime_seconds", "downtime_s", "Wall time training did not advance (frozen, restarting, held)."),
)  # fmt: skip
_TIME_COUNTERS = (
    ("steps_retrained", "steps_retrained", "Steps trained again after a rollback, over all incidents."),
    ("retrain_seconds", "retrain_s", "Wall time spent re-training steps after a rollback."),
)


def _time_lost_families(job: str, lost: dict[str, Any]) -> Iterator[Metric]:
    for name, key, doc in _TIME_GAUGES:
        g = _gauge(name, doc)
        if (v := _num(lost.get(key))) is not None:
            g.add_metric([job], v)
        yield g
    for name, key, doc in _TIME_COUNTERS:
        c = CounterMetricFamily(PREFIX + name, doc, labels=["training_job"])
        c.add_metric([job], _num(lost.get(key)) or 0.0)
        yield c


class _Collector(Collector):
    def __init__(self, metrics: SupervisorMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return list(self.metrics.families())

"""What the supervisor's loop calls: one object, one call per analysed step.

``Observability(job, incidents, checkpoints)`` is built with the controller and
``on_step(step, records, aggregate)`` is called after each complete step. It feeds:

- the incident-series recorder (always: incident reviews need per-rank rows and the timeline
  after a rollback),
- the Prometheus metrics (``observability.metrics.port`` in job.yaml),
- the TensorBoard sink (``observability.tensorboard.logdir``).

A step number that goes back means training was rolled back (or restarted from a
checkpoint): each piece is told once. Nothing here may stop supervision: a failing sink is
logged (first time, then every 100th) and the loop goes on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from supervisor.config.observability import ObservabilitySettings
from supervisor.logging import get_logger
from supervisor.observability.metrics import SupervisorMetrics
from supervisor.observability.series import IncidentSeries

log = get_logger("supervisor.observability")

INCIDENT_REFRESH_S = 2.0


class Observability:
    def __init__(
        self, job: Any, incidents: Any, checkpoints: Any = None, settings: ObservabilitySettings | None = None
    ) -> None:
        self.job = job.name
        self.settings = settings or getattr(job, "observability", None) or ObservabilitySettings()
        self.incidents = incidents
        self.checkpoints = checkpoints
        self.series = IncidentSeries(incidents, job.name)
        self.metrics = SupervisorMetrics(job.name)
        self.metrics_port: int | None = None
        self.tensorboard: Any = None
        self._last_step: int | None = None
        self._refreshed = 0.0
        self._events: dict[int, tuple[float, list[Any]]] = {}  # incident id -> (updated_at, timeline)
        self._errors: dict[str, int] = {}
        self._stop = threading.Event()
        m = self.settings.metrics
        if m.port is not None:
            try:
                self.metrics_port = self.metrics.serve(m.host, m.port)
            except OSError as exc:  # a taken port must not keep the job from being supervised
                log.error("metrics_not_served", job=self.job, host=m.host, port=m.port, error=str(exc))
            else:
                log.info("metrics_serving", job=self.job, host=m.host, port=self.metrics_port)
            if checkpoints is not None and self.metrics_port is not None:
                threading.Thread(
                    target=self._watch_checkpoints, name="observability-ckpt", daemon=True
                ).start()
        if self.settings.tensorboard.logdir:
            from supervisor.observability.tensorboard import TensorBoardSink

            self.tensorboard = TensorBoardSink(self.settings.tensorboard.logdir)

    def on_step(self, step: int, records: Sequence[Any], aggregate: Any = None) -> None:
        agg = aggregate.to_json() if hasattr(aggregate, "to_json") else aggregate
        if self._last_step is not None and step <= self._last_step:
            self._guard("rewind", self._rewind, step - 1)
        self._last_step = step
        now = time.monotonic()
        if now - self._refreshed >= INCIDENT_REFRESH_S:
            self._refreshed = now
            self._guard("incidents", self._refresh_incidents, step)
        self._guard("series", self.series.on_step, step, records, agg)
        self._guard("metrics", self.metrics.on_step, step, records, agg)
        if self.tensorboard is not None:
            self._guard("tensorboard", self.tensorboard.on_step, step, records, agg)

    def flush(self) -> None:
        """Write what the incident series still holds back (the job ends)."""
        self._guard("series", self.series.flush)

    def close(self) -> None:
        self._stop.set()
        self.metrics.close()
        if self.tensorboard is not None:
            self.tensorboard.close()

    # -- pieces ----------------------------------------------------------------------------------
    def _rewind(self, to_step: int) -> None:
        self.series.on_rewind(to_step)
        if self.tensorboard is not None:
            self.tensorboard.on_rewind(to_step)

    def _refresh_incidents(self, step: int) -> None:
        incidents = self.incidents.list_incidents(job=self.job)
        events: list[Any] = []
        for inc in incidents:
            cached = self._events.get(inc.id)
            if cached is None or cached[0] != inc.updated_at:
                cached = (inc.updated_at, self.incidents.timeline(inc.id))
                self._events[inc.id] = cached
            events.extend(cached[1])
        self.metrics.on_incidents(incidents, events)
        if self.tensorboard is not None:
            self.tensorboard.on_incidents(incidents, step)
            self.tensorboard.flush()

    def _watch_checkpoints(self) -> None:
        every = self.settings.metrics.checkpoint_refresh_s
        while not self._stop.is_set():
            self._guard("checkpoints", lambda: self.metrics.on_checkpoints(self.checkpoints.manifests()))
            self._stop.wait(every)

    def _guard(self, what: str, fn: Callable[..., Any], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as exc:  # observability must never stop supervision
            n = self._errors[what] = self._errors.get(what, 0) + 1
            if n == 1 or n % 100 == 0:
                log.warning("observability_failed", part=what, error=repr(exc), times=n)

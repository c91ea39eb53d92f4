"""The supervisor's control loop: records in, decisions out, actions carried out.

    while not phase.is_terminal:
        ingest()      # records -> acks, steps -> detector -> incident updates -> plans
        advance()     # the active plan: one action transition at a time
        machinery()   # worker group finished / died / hung -> finish or restart
        tend()        # checkpoints seen -> verified -> healthy
        persist()

Ray actor threads call ``ingest_batch`` / ``directives_after`` / ``status`` / ``request_stop``;
everything else runs on the loop thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from supervisor.config.job import JobSpec
from supervisor.core.model import Diagnosis
from supervisor.core.policy import load_policy
from supervisor.errors import SupervisorError
from supervisor.logging import get_logger
from supervisor.observability.hub import Observability
from supervisor.runtime.assembler import StepAssembler
from supervisor.runtime.directives import DirectiveLog
from supervisor.runtime.incidents import IncidentFlow
from supervisor.runtime.machinery import Machinery
from supervisor.runtime.observe import StepStats, aggregate
from supervisor.runtime.settings import RuntimeSettings, open_traces
from supervisor.runtime.state import JobPhase, RuntimeState
from supervisor.runtime.stores import open_checkpoint_store, open_incident_store, runtime_state_path
from supervisor.sdk.directives import Directive


class Controller:
    def __init__(
        self, job: JobSpec, settings: RuntimeSettings | None = None, *, attach: bool = False
    ) -> None:
        self.job = job
        self.settings = settings or RuntimeSettings.model_validate({})
        self.world_size = job.resources.num_workers
        self.log = get_logger("supervisor.runtime", job=job.name)
        self.policy = load_policy(job.policy)
        self.incidents = open_incident_store(job)
        self.checkpoints = open_checkpoint_store(job)
        self.state_path = runtime_state_path(job)
        self.attach = attach
        self.state = (RuntimeState.load(self.state_path) if attach else None) or RuntimeState(job=job.name)
        self.directives = DirectiveLog(self.state.directives)
        self.assembler = StepAssembler(self.world_size, self.settings.step_deadline_s)
        self.assembler.watermark = self.state.watermark
        self.current_step = max(self.state.watermark, 0)
        self.history: deque[StepStats] = deque(maxlen=max(1000, job.telemetry.window))
        self.batches: dict[int, int] = {}
        self.inbox: queue.SimpleQueue[tuple[int, list[dict[str, Any]]]] = queue.SimpleQueue()
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="supervisor-io")
        self.tasks: dict[str, Any] = {}
        self.stop_requested: str | None = None
        self.flow = IncidentFlow(self)
        self.observability = Observability(job, self.incidents, self.checkpoints)  # metrics, incident series
        self.machinery = Machinery(self)
        self._lock = threading.Lock()
        self._last_persist = 0.0
        self._exported: dict[int, float] = {}  # incident id -> updated_at of its last export
        self._last_export = 0.0
        self._trace = open_traces(self.settings, self.world_size)  # telemetry.trace: per-rank JSONL

    # -- the loop -----------------------------------------------------------------------------
    @property
    def phase(self) -> JobPhase:
        return self.state.phase

    def run(self) -> JobPhase:
        self.machinery.boot()
        while not self.phase.is_terminal:
            if not self.iterate():
                time.sleep(self.settings.loop_interval_s)
        self.machinery.close()
        self.persist(force=True)
        self.export_incidents(force=True)
        if self._trace is not None:
            self._trace.close()
        self.log.info("job_ended", phase=self.phase.value, reason=self.state.reason)
        return self.phase

    def iterate(self) -> bool:
        """One pass of the loop; True when it changed something (the loop then goes on at once)."""
        busy = self.ingest()
        busy |= self.flow.advance()
        self.machinery.watch()
        self.machinery.tend_checkpoints()
        self.persist()
        self.export_incidents()
        return busy

    def ingest(self) -> bool:
        took = False
        while True:
            try:
                rank, batch = self.inbox.get_nowait()
            except queue.Empty:
                break
            took = True
            for rec in batch:
                self._note(rank, rec)
                self.assembler.add(rank, rec)
            if self._trace is not None:
                self._trace.write(batch)
        for step, records in self.assembler.ready():
            stats = aggregate(step, records)
            self.history.append(stats)
            self.current_step = step
            self.flow.observe(step, records)
            self.observability.on_step(step, records, self.history[-1])
        return took

    def _note(self, rank: int, rec: dict[str, Any]) -> None:
        events = [e for e in rec.get("events") or () if isinstance(e, str)]
        step = rec.get("step")
        if not isinstance(step, int):
            return
        self.directives.note_events(int(rec.get("rank", rank)), step, events)
        batch = (rec.get("attrs") or {}).get("batch")
        if isinstance(batch, int):
            self.batches[step] = batch
        for ev in events:
            if ev == "checkpoint_saved" or ev.startswith("checkpoint_saved:"):
                saved = int(ev.split(":")[1]) if ":" in ev and ev.split(":")[1].isdigit() else step
                if saved not in self.state.checkpoints_seen:
                    self.state.checkpoints_seen.append(saved)

    def export_incidents(self, force: bool = False) -> None:
        """Copy every incident that changed to ``<job>/incidents/<id>.json`` in the job's storage,
        so the record survives the loss of this machine's SQLite file."""
        if not force and time.monotonic() - self._last_export < self.settings.export_interval_s:
            return
        self._last_export = time.monotonic()
        from supervisor.incidents.export import export_incident

        for inc in self.incidents.list_incidents(job=self.job.name):
            if self._exported.get(inc.id) == inc.updated_at:
                continue
            try:
                export_incident(self.incidents, inc.id, self.checkpoints.backend, self.job.name)
                self._exported[inc.id] = inc.updated_at
            except SupervisorError as exc:  # storage trouble must not stop supervision; retried next pass
                self.log.warning("incident_export_failed", incident=inc.id, error=exc.one_line())

    def persist(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_persist < 0.5:
            return
        self.state.directives = self.directives.entries
        self.state.watermark = self.assembler.watermark
        self.state.analyzer = self.flow.analyzer_state()
        self.state.save(self.state_path)
        self._last_persist = time.monotonic()

    def end_job(self, phase: str, reason: str) -> None:
        """Record how the job ends; the loop stops once the workers are down."""
        self.machinery.ending = (JobPhase(phase), reason)

    # -- what actions may ask (actions.base.Runtime) ------------------------------------------
    @property
    def incident_id(self) -> int:
        return self.flow.active_incident_id

    @property
    def diagnosis(self) -> Diagnosis:
        return self.flow.active_diagnosis

    def issue(self, directive: Directive) -> None:
        """Persist, then publish: a worker can never fetch a directive a restart would not know."""
        if self.directives.has(directive.id):
            return
        probe = DirectiveLog(self.directives.entries)
        probe.append(directive)
        self.state.directives = probe.entries
        self.state.save(self.state_path)
        self.directives.append(directive)
        self.log.info("directive_issued", kind=directive.kind, id=directive.id, step=self.current_step)

    def set_frozen(self, frozen: bool) -> None:
        self.state.frozen = frozen
        self.assembler.touch()

    def rewind(self, to_step: int) -> None:
        """The job continues from checkpoint ``to_step``: steps after it start over."""
        self.assembler.rewind(to_step)
        self.current_step = to_step
        self.flow.notify_rollback(to_step)
        self.machinery.abandon_after(to_step)

    def window_after(self, step: int) -> list[StepStats]:
        return [h for h in self.history if h.step > step]

    def baseline(self) -> dict[str, Any] | None:
        return self.flow.active.baseline if self.flow.active else None

    def batch_range(self, first_step: int, last_step: int) -> tuple[int, int]:
        return self.batches.get(first_step, first_step), self.batches.get(last_step, last_step)

    def submit(self, name: str, fn: Any, *args: Any) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.pool.submit(fn, *args)

    def submit_replay(self, name: str, step: int, suspects: list[str], numeric: bool) -> None:
        if name not in self.tasks:
            self.tasks[name] = self.machinery.replay(step, suspects, numeric)

    def result_of(self, name: str) -> tuple[bool, Any] | None:
        task = self.tasks.get(name)
        if task is None:
            return None
        if isinstance(task, Future):
            if not task.done():
                return None
            exc = task.exception()
            return (False, repr(exc)) if exc else (True, task.result())
        return self.machinery.ray_result(task)

    def incidents_opened_since(self, step: int) -> int:
        return self.flow.opened_since(step)

    def training_ended(self) -> bool:
        return self.machinery.finished

    # -- called from actor threads ------------------------------------------------------------
    def ingest_batch(self, rank: int, batch: list[dict[str, Any]]) -> None:
        self.inbox.put((rank, batch))

    def directives_after(self, rank: int, seq: int, wait_s: float = 0.0) -> list[dict[str, Any]]:
        return self.directives.after(seq, wait_s)

    def request_stop(self, reason: str) -> None:
        self.stop_requested = reason

    def status(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else None
        return {
            "job": self.job.name,
            "phase": self.phase.value,
            "terminal": self.phase.is_terminal,
            "exit_code": self.phase.exit_code if self.phase.is_terminal else None,
            "reason": self.state.reason,
            "step": max(self.current_step, 0),
            "max_steps": self.job.max_steps,
            "loss": last.loss if last else None,
            "grad_norm": last.grad_norm if last else None,
            "tokens_per_s": last.tokens_per_s if last else None,
            "lr": last.lr if last else None,
            "frozen": self.state.frozen,
            "generation": self.state.generation,
            "group_restarts": self.state.group_restarts,
            "incident": self.flow.summary(),
            "incidents_total": len(self.state.incident_keys),
            "mode": self.job.mode,
        }

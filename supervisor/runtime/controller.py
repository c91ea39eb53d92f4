"""The supervisor's control loop: records in, decisions out, actions carried out.

Until the phase is terminal, each iteration ingests records, advances the active plan, acts on the
worker group's event, tends the checkpoints, settles the end and persists the state
(docs/architecture.md, "The control loop"). The controller alone writes the job's phase
(``set_phase``), its workers' lifecycle (``set_lifecycle``, ``lifecycle.py``) and every incident's
move; the incident flow (``incidents.py``, given the job's moment as ``incidents.Now``), the plan
runner (``plans.py``) and the action executors (reading the job through ``actions.base.Runtime``,
passed per call) return effects, which ``apply`` alone carries out ("One writer per state").

Ray actor threads call ``ingest_wire`` / ``directives.after`` / ``status`` / ``request_stop``;
everything else runs on the loop thread.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Generator, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from itertools import accumulate
from typing import Any, TypeGuard

from tenacity import Retrying, retry_if_exception_type, wait_exponential

from supervisor.checkpoint.lifecycle import open_checkpoint_store, pick_rollback_target, restart_step
from supervisor.checkpoint.manifest import Manifest
from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.core.frame import StepFrame
from supervisor.core.model import Cause, CauseScore, Diagnosis, HealthMark, Phenotype, Severity
from supervisor.core.policy import action_names, load_policy
from supervisor.core.records import Record
from supervisor.errors import CheckpointError, RuntimeBackendError, SupervisorError
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.incidents.paths import open_incident_store
from supervisor.logging import get_logger
from supervisor.observability.hub import Observability
from supervisor.observability.time_lost import TimeLedger
from supervisor.runtime import actions, effects
from supervisor.runtime.actions.checkpoints import in_force as rollback_in_force
from supervisor.runtime.assembler import StepAssembler
from supervisor.runtime.directives import DirectiveLog
from supervisor.runtime.group import WorkerStartError
from supervisor.runtime.incidents import IncidentFlow, Now
from supervisor.runtime.lifecycle import Ended, Ending, Lifecycle, Relaunching, Running, Stopping
from supervisor.runtime.machinery import Workers, WorkerSupervision
from supervisor.runtime.observe import StepStats, aggregate
from supervisor.runtime.plans import action_id, move
from supervisor.runtime.receipts import Receipts
from supervisor.runtime.restarts import GroupEvent, Restarting, decide
from supervisor.runtime.state import (
    ActivePlan,
    BufferJSON,
    JobPhase,
    RuntimeState,
    StepHistory,
    runtime_state_path,
    write_state,
)
from supervisor.runtime.tending import CheckpointTending
from supervisor.sdk.directives import END_REACHED, Directive, Finish, Stop
from supervisor.sdk.wire import Group, Packed, unpack, unpack_frame
from supervisor.traces.rank_traces import open_traces

#: A restart during an open incident without a rollback in its plan resumes at least this many
#: steps before the incident's onset (a rollback in the plan brings its own margin).
RESTART_MARGIN_STEPS = 10
#: Steps of per-step aggregates kept in the persisted state (baselines, observation windows).
HISTORY_KEPT = 1000
#: The state is written at most this often while records flow (each write acknowledges them).
PERSIST_INTERVAL_S = 0.5
Queued = tuple[int, list[Any], list[int] | None, str | None]
"""(rank, records, seqs, link id) of one link's batch taken into the inbox."""
START_TIMEOUT_S = 120.0
"""Time a worker generation has to be placed and to answer; doubled on each retry (``_launch``)."""


class Controller:
    def __init__(
        self,
        job: JobSpec,
        settings: RuntimeSettings | None = None,
        *,
        attach: bool = False,
        workers: Workers | None = None,
    ) -> None:
        self.job = job
        self.settings = settings or RuntimeSettings.model_validate({})
        self.world_size = job.resources.num_workers
        self.log = get_logger("supervisor.runtime", job=job.name)
        self.policy = load_policy(job.policy)
        actions.check(action_names())  # one executor per action the policy language has
        self.incidents = open_incident_store(job, self.settings.export_interval_s)
        self.checkpoints = open_checkpoint_store(job)
        self.state_path = runtime_state_path(job)
        self.attach = attach
        self.state = (RuntimeState.load(self.state_path) if attach else None) or RuntimeState(job=job.name)
        self.incarnation = uuid.uuid4().hex[:12]
        self.directives = DirectiveLog(self.state.directives, self.state.acks, self.state.failures)
        self.receipts = Receipts(self.state.receipts)
        self.assembler = StepAssembler(self.world_size, self.settings.step_deadline_s,
                                       on_release=self.receipts.release,
                                       on_release_unit=self.receipts.release_unit)  # fmt: skip
        self.assembler.watermark = self.state.watermark
        self.current_step = max(self.state.watermark, 0)
        self.history = StepHistory(
            (StepStats(**h) for h in self.state.history), maxlen=max(HISTORY_KEPT, job.telemetry.window)
        )
        self.state.hold_history(self.history)
        self.batches: dict[int, int] = {int(k): v for k, v in self.state.batches.items()}
        self.inbox: queue.SimpleQueue[list[Queued] | Packed] = queue.SimpleQueue()
        """One item per ingest call: its links' accepted batches, in the order they came."""
        self._wake = threading.Event()
        """Set by an actor thread when the loop has something to take (records, acks, a stop request)."""
        self.pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="supervisor-io")
        self.tasks: dict[str, Any] = {}
        self.stop_requested: str | None = None
        """Why a person asked the job to stop; set by an actor thread, acted on by the loop (``Stopping``)."""
        self.workers = workers or WorkerSupervision(job, self.settings)
        self.tending = CheckpointTending(self.checkpoints, self.world_size, self.settings.healthy_after_steps,
                                         job.checkpoint.keep)  # fmt: skip
        self.flow = IncidentFlow(job, self.policy, self.incidents, self.state, self.checkpoints,
                                 healthy_after=self.settings.healthy_after_steps)  # fmt: skip
        self.observability = Observability(job, self.incidents, self.checkpoints)  # metrics, incident series
        self.time_lost = TimeLedger(self.state.time_lost)  # re-trained steps, effective training time
        self.generation_started_at = 0.0
        """Wall time the current worker generation started (directive deadlines count from it)."""
        self.lifecycle: Lifecycle = Running()
        """What the workers do and how the job ends once they are down (``lifecycle.py``)."""
        self._last_persist = 0.0
        self._written: str | None = None  # the state file's content as this controller last wrote it
        self._analyzer_json = BufferJSON()  # the analyzer's state, its buffers' entries serialized once
        self._trace = open_traces(self.settings, self.world_size)  # telemetry.trace: per-rank JSONL
        self.effects_applied: list[effects.Effect] = []
        """The effects carried out in the current (or last) iteration, in order."""

    # -- the phase: one writer ------------------------------------------------------------------
    @property
    def phase(self) -> JobPhase:
        return self.state.phase

    def set_phase(self, phase: JobPhase, reason: str) -> None:
        old = self.state.phase
        if old is phase and self.state.reason == reason:
            return
        self.state.phase = phase
        self.state.reason = reason
        self.log.info("phase", old=old.value, new=phase.value, reason=reason, step=self.current_step)

    def set_lifecycle(self, new: Lifecycle, reason: str) -> None:
        old, self.lifecycle = self.lifecycle, new
        if new != old:
            self.log.info("lifecycle", old=repr(old), new=repr(new), reason=reason, step=self.current_step)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> JobPhase:
        self.boot()
        while not self.phase.is_terminal:
            # Cleared before the pass: what an actor thread brings during it wakes the next wait at once.
            self._wake.clear()
            if not self.iterate():
                self._wake.wait(self.settings.loop_interval_s)
        self.workers.shutdown()
        self._abandon_pending_events()
        self.persist(force=True)
        summary = self.time_lost.summary(self.state.downtime_s)
        self.observability.flush()
        if self.incidents.exporter is not None:  # incident exports run on their own thread: finish them
            self.incidents.exporter.close()
        if self._trace is not None:
            self._trace.close()
        self.log.info("job_ended", phase=self.phase.value, reason=self.state.reason, **summary)
        return self.phase

    def iterate(self) -> bool:
        """One pass of the loop; True when it changed something (the loop then goes on at once)."""
        self.effects_applied = []
        busy = self.ingest()
        if not isinstance(self.lifecycle, Relaunching):  # no plan step while no workers exist to carry it out
            busy |= self.advance_plan()
        self._send_stop_if_asked()
        match self.lifecycle:
            case Relaunching(restart, then) if time.monotonic() >= restart.due:
                self._relaunch(restart, then)
            case Running() if (event := self.workers.watch(self._silent_ranks())) is not None:
                self.on_group_event(event)
        self.tend()
        self.settle_end()
        self._count_downtime()
        self.persist()
        return busy

    # -- start / re-attach ----------------------------------------------------------------------
    def boot(self) -> None:
        if self.attach:
            self.flow.rebuild_interventions()  # what it did, from its own records, before any record
            found = self.workers.find()
            if found:
                self._adopt_world_size()
                for rank, applied, last_step in self.workers.link_acks():  # sent while no supervisor listened
                    self.directives.note_applied(rank, applied, last_step)
            self._note_resumed(found)
            if not found and not self.phase.is_terminal:
                self._restart(GroupEvent("lost", (), "no workers found when the supervisor re-attached"))
            return
        if self.workers.exists_on_cluster():
            raise RuntimeBackendError(
                f"job {self.job.name!r} already has workers on this cluster: use `supervisor launch --attach "
                f"{self.job.name}` or `supervisor stop {self.job.name}` first"
            )
        resume = restart_step(self.checkpoints, self.world_size)
        if resume is not None:
            self.log.info(
                "resuming_from_checkpoint", step=resume, why="newest verified checkpoint in storage"
            )
            self.rewind(resume, f"boot:{resume}", "a new run resumes from the newest verified checkpoint")
        self.set_phase(JobPhase.STARTING, "placing the worker group")
        try:
            self._launch(resume, self.directives.last_seq)
        except SupervisorError as exc:
            self.state.exit_code = exc.exit_code
            self._end_now(JobPhase.FAILED, exc.one_line())
            return
        self._group_started()

    def _launch(self, resume: int | None, after_seq: int) -> None:
        """Start a worker generation. A start Ray did not carry out (``WorkerStartError``) is retried
        after the backoff as a fresh generation with twice the time, within ``restarts.max_restarts``
        and until a stop is asked for (docs/runtime.md, "Machinery faults"); any other failure is raised."""
        s = self.policy.restarts
        at = max(self.current_step, 0)
        window = s.window_steps
        counted = [x for x in self.state.restart_steps if window is None or at - x <= window]
        attempts = 1 + max(0, s.max_restarts - len(counted))
        retrying = Retrying(
            retry=retry_if_exception_type(WorkerStartError),
            stop=lambda rs: rs.attempt_number >= attempts or self.stop_requested is not None,
            wait=wait_exponential(multiplier=s.backoff_s, exp_base=s.backoff_factor, max=s.backoff_max_s),
            before_sleep=lambda rs: self.log.warning(
                "worker_start_failed", attempt=rs.attempt_number, of=attempts, generation=self.state.generation,
                error=str(rs.outcome.exception()) if rs.outcome else "", retry_in_s=rs.upcoming_sleep,
                why=f"retried within restarts.max_restarts={s.max_restarts} (policy)"),
            reraise=True,
        )  # fmt: skip
        tried = 0
        try:
            for attempt in retrying:
                with attempt:
                    tried = attempt.retry_state.attempt_number
                    if tried > 1:  # a fresh generation: the failed one's names may still be registered
                        self.state.generation += 1
                        self.state.restart_steps.append(at)
                        self.persist(force=True)
                    self.workers.launch(self.state.generation, resume, after_seq,
                                        ready_timeout_s=START_TIMEOUT_S * 2 ** (tried - 1),
                                        ranks=self._ranks_for(resume))  # fmt: skip
                    self._adopt_world_size()
        except WorkerStartError as exc:
            budget = f"restarts.max_restarts={s.max_restarts} (policy)"
            if self.stop_requested is not None:
                budget = f"a stop was requested: {self.stop_requested}"
            raise WorkerStartError(
                f"the worker group did not start after {tried} attempt(s) ({budget}): {exc.one_line()}"
            ) from None

    def _manifest(self, step: int | None) -> Manifest | None:
        """Checkpoint ``step``'s manifest; None: no such checkpoint (or none readable)."""
        if step is None or step < 0 or self.checkpoints is None:
            return None
        try:
            return self.checkpoints.find(step)
        except CheckpointError:
            return None

    def _ranks_for(self, resume: int | None) -> int | None:
        """The ranks a group resuming from checkpoint ``resume`` must have: as many as saved it when
        its state cannot be resharded (the ``sharded`` layout); None: as ``resources`` allow."""
        manifest = self._manifest(resume)
        return manifest.world_size if manifest is not None and manifest.layout == "sharded" else None

    def _adopt_world_size(self) -> None:
        """The group's ranks as placed: fewer than ``num_workers`` when the live nodes held fewer
        (``resources.min_workers``); every count of ranks follows it."""
        n = self.workers.world_size
        if n == self.world_size:
            return
        self.log.warning("world_size", old=self.world_size, new=n, num_workers=self.job.resources.num_workers,
                         min_workers=self.job.resources.min_workers)  # fmt: skip
        self.world_size = self.assembler.world_size = self.tending.world_size = n

    def _group_started(self) -> None:
        self.generation_started_at = time.time()
        self.assembler.touch(started=True)
        if self.state.active is not None:
            self.set_phase(JobPhase.INCIDENT, f"incident {self.state.active.incident_id} continues")
        else:
            self.set_phase(JobPhase.RUNNING, f"worker generation {self.state.generation} started")
        self.persist(force=True)

    def _note_resumed(self, workers_found: bool) -> None:
        for incident in self.incidents.active(self.job.name):
            pending = [e.action_id for e in self.incidents.pending_events(incident.id)]
            self.incidents.record(incident.id, EventKind.SUPERVISOR_RESUMED, actor="supervisor",
                                  step=self.current_step,
                                  payload={"pending_actions": pending, "workers_found": workers_found})  # fmt: skip

    # -- records in ---------------------------------------------------------------------------
    def ingest(self) -> bool:
        took = False
        receipts, note, add = self.receipts, self._note, self.assembler.add
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                break
            took = True
            if isinstance(item, Packed):
                self._ingest_packed(item)
                continue
            for rank, batch, seqs, link in item:
                tags = [(link, seq) for seq in seqs] if link is not None and seqs is not None else []
                fresh = []
                for i, rec in enumerate(batch):
                    tag = tags[i] if i < len(tags) else None
                    if tag is not None and not receipts.fresh(*tag):
                        continue  # a resend of a record this supervisor already has
                    fresh.append(rec)
                    note(rank, rec)
                    if tag is not None:  # unconsumed until its step is analysed or it is dropped (on_release)
                        receipts.hold(tag)
                    add(rank, rec, tag)
                if self._trace is not None and fresh:
                    self._trace.write(fresh)
        self._analyse_ready(final=self.workers_gone())
        return took

    def _ingest_packed(self, p: Packed) -> None:
        """A decoded batch (``sdk/wire.py``, ``ingest_frame``) as one frame: the receipts checked per
        link in bulk, the bookkeeping reading only the columns it needs, the records held as one
        unit until every step they feed is analysed."""
        frame, links, counts, seqs = p.frame, p.links, p.counts, p.seqs
        keep = None if seqs is None else self.receipts.fresh_batch(links, counts, seqs)
        if keep is not None and not any(keep):
            return  # every record a resend this supervisor already has
        self._note_frame(frame, keep)
        unit = None
        if seqs is not None:  # a link without an id (None) numbers nothing
            marks: dict[str, int] = {}
            at = 0
            for link, count in zip(links, counts, strict=True):
                if count and link is not None and link not in marks:
                    marks[link] = seqs[at]
                at += count
            unit = self.receipts.hold_unit(marks)  # unconsumed until every step it feeds is analysed
        self.assembler.add_frame(frame, keep, unit)

    def _note_frame(self, frame: StepFrame, keep: list[bool] | None) -> None:
        """``_note`` for a frame's records, reading its columns; the events of the records that carry
        any are noted in record order (no record built). Records whose order the bookkeeping depends
        on (resends among them, or a rank saying it reached the end) are noted one by one."""
        events = frame.all_events()
        if keep is not None or any(e.startswith(f"{END_REACHED}:") for e in events):
            for i, rec in enumerate(frame):
                if keep is None or keep[i]:
                    self._note(rec.rank, rec)
            return
        if events:
            ranks, steps = frame.col("rank"), frame.col("step")
            for i, evs in enumerate(frame.col("events")):
                if evs:
                    self._note_events(ranks[i], steps[i], evs)
        if self.state.held_at:
            for rank in frame.col("rank"):
                self.state.held_at.pop(rank, None)  # a step record: this rank trains (again)
        if not frame.has("attrs"):
            return
        steps, attrs = frame.col("step"), frame.col("attrs")
        # Per step the last record's batch index counts, and the last clip of all: as when noted one by one.
        if min(steps) == max(steps):
            batch = next((b for a in reversed(attrs) if a and isinstance(b := a.get("batch"), int)), None)
            batches = {} if batch is None else {steps[0]: batch}
        else:
            batches = {}
            for step, a in zip(steps, attrs, strict=True):
                if a and isinstance(b := a.get("batch"), int):
                    batches[step] = b
        self.batches.update(batches)
        clips = [a["grad_clip"] for a in attrs if a and "grad_clip" in a]
        clip = next((c for c in reversed(clips) if _clip(c)), None)
        if clip is not None:
            self._note_attrs(steps[-1], {"grad_clip": clip})

    def _analyse_ready(self, *, final: bool) -> None:
        """Analyse every step whose records are all in, in order, each followed by the checkpoint
        marks it settles (``tend``): a supervisor that fell behind a fast run takes the healthy window
        of a checkpoint and the fault after it in one batch, and the plan made after this batch
        chooses its rollback target among the marks the steps before the fault earned -- the same
        marks as when it takes one step per iteration."""
        for step, records in self.assembler.ready(final=final):
            self._analyse(step, records)
            self.tend()

    def _analyse(self, step: int, records: StepFrame) -> None:
        self.history.append(aggregate(step, records))
        self.current_step = step
        self.time_lost.on_step(step, records)
        self.drive(self.flow.observe(step, records, self._now()))
        self.observability.on_step(step, records, self.history[-1])
        self.observability.metrics.on_time_lost(self.time_lost.summary(self.downtime_now()))

    def _note(self, rank: int, rec: dict[str, Any] | Record) -> None:
        if type(rec) is Record:  # decoded from the wire: typed fields, never a control message
            step, rank, events, attrs, control = rec.step, rec.rank, rec.events, rec.attrs, False
            if not (events or attrs or self.state.held_at):
                return  # the common record: nothing in it for the bookkeeping below
        else:
            events = [e for e in rec.get("events") or () if isinstance(e, str)]
            sent = rec.get("step")
            if not isinstance(sent, int):
                return
            step, rank = sent, int(rec.get("rank", rank))
            attrs, control = rec.get("attrs") or {}, bool(rec.get("control"))
        if not control and self.state.held_at:
            self.state.held_at.pop(rank, None)  # a step record: this rank trains (again)
        self._note_attrs(step, attrs)
        self._note_events(rank, step, events)

    def _note_events(self, rank: int, step: int, events: list[str]) -> None:
        if events:
            self.directives.note_events(rank, step, events)
        for ev in events:
            if ev.startswith(f"{END_REACHED}:"):
                self.state.held_at[rank] = step
            elif ev == "checkpoint_saved" or ev.startswith("checkpoint_saved:"):
                tail = ev.split(":")[1] if ":" in ev else ""
                saved = int(tail) if tail.isdigit() else step
                if saved not in self.state.checkpoints_seen:
                    self.state.checkpoints_seen.append(saved)

    def _note_attrs(self, step: int, attrs: dict[str, Any]) -> None:
        batch = attrs.get("batch")
        if isinstance(batch, int):
            self.batches[step] = batch
        clip = attrs.get("grad_clip")
        if _clip(clip):
            self.state.reported_grad_clip = float(clip)  # the job's own clip (JobState.grad_clip)

    def _silent_ranks(self) -> list[int]:
        """Ranks silent for ``telemetry.hang_timeout_s``, whatever the phase: a rank that trains sends
        its records, and a frozen, snapshotting or held rank repeats at each boundary of its wait
        that it is there (``sdk.steering.HOLD_BEAT_S``); a rank stopped or hung while frozen is
        therefore hung too, and the action waiting on it fails with the group's restart."""
        return self.assembler.silent_ranks(
            self.job.telemetry.hang_timeout_s, range(self.world_size), self.settings.startup_timeout_s
        )

    # -- worker-group events ----------------------------------------------------------------------
    def on_group_event(self, event: GroupEvent) -> None:
        """A fault restarts the group. Once every rank returned, whatever is still to analyse is
        analysed, and a pending incident still gets its plan (its worker actions are then recorded
        as skipped, never as done)."""
        if event.kind != "finished":
            self._restart(event)
            return
        self._take_down("every rank returned")
        self._analyse_ready(final=True)
        self._finalize_open()
        self.log.info("workers_finished", step=self.current_step, pending_incident=not self.flow.idle)

    def settle_end(self) -> None:
        """Finish the job once nothing is left to handle; release workers held at their last step."""
        if self.phase.is_terminal:
            return
        match self.lifecycle:
            case Ended(ending) if self.flow.idle and not self._finalize_open():
                self._finish_job(ending)
            case Running():
                self._release_held()

    def _release_held(self) -> None:
        held = self.state.held_at
        if len(held) < self.world_size or not held:
            return
        last = max(held.values())
        if self.assembler.watermark < last or self._finalize_open() or not self.flow.idle:
            return  # steps still to analyse, or an incident to handle while the workers wait
        release = f"finish-g{self.state.generation}-s{last}"
        if isinstance(live := self.lifecycle, Running) and live.released != release:
            self.tend(final=True)
            self.issue(Finish(reason="no incident is left to handle", id=release))
            self.set_lifecycle(replace(live, released=release), "ranks held at their last step released")

    def _finish_job(self, ending: Ending | None) -> None:
        if ending is not None:
            phase, reason = ending.phase, ending.reason
        elif self.flow.unfinished:
            phase, reason = JobPhase.UNFINISHED, self.flow.unfinished
        elif self.stop_requested:
            phase, reason = JobPhase.STOPPED, f"stopped on request: {self.stop_requested}"
        else:
            phase, reason = JobPhase.FINISHED, f"all {self.world_size} ranks finished"
        if phase is JobPhase.FINISHED:
            self.tend(final=True)
        self._end(phase, reason)

    def _end(self, phase: JobPhase, reason: str) -> None:
        # An action in flight never ran to its end: recorded so before the end closes its incident,
        # whose events are not looked at again (a job failed mid-observation left it pending).
        self._abandon_pending_events(f"job ended ({phase.value}: {reason})")
        self.apply_all(self.flow.close_at_end(phase, reason, self._event_step))
        self.time_lost.finish(time.time())
        self.time_lost.note_incidents(self.incidents, self.job.name, max(self.current_step, 0))
        self.set_phase(phase, reason)

    def _take_down(self, why: str) -> None:
        """The workers are gone from here on: no record and no ack will come."""
        self.workers.shutdown()
        self.set_lifecycle(self.lifecycle.taken_down(), why)

    def _end_now(self, phase: JobPhase, reason: str) -> None:
        self._take_down(reason)
        self._end(phase, reason)

    def _send_stop_if_asked(self) -> None:
        """A stop asked for goes out once, as a directive; workers not down in time are killed."""
        live, timeout = self.lifecycle.resumed(), self.settings.directive_timeout_s
        if self.stop_requested and not isinstance(live, Stopping | Ended):
            self.issue(Stop(reason=self.stop_requested, id=f"stop-{int(time.time())}"))
            why = f"stopped on request: {self.stop_requested}"
            self.set_lifecycle(self.lifecycle.stopping(why, time.monotonic()), "the stop directive went out")
        elif isinstance(live, Stopping) and time.monotonic() - live.sent_at > timeout:
            self._end_now(JobPhase.STOPPED, f"stop requested ({self.stop_requested}); workers killed after "
                                            f"directive_timeout_s={timeout:g}s")  # fmt: skip

    # -- restarts ---------------------------------------------------------------------------------
    def _restart(self, event: GroupEvent) -> None:
        """Replace the worker group, as an incident of its own, if the restart policy says so."""
        # The fault struck in the first step the group did not finish; the analysed step
        # (current_step) lags behind it by whatever records were still in flight.
        reached = self.assembler.reached()
        at = max(self.current_step, reached + 1 if reached is not None else self.current_step)
        resumed = self.state.restart_resumed_at
        # The restarted group trained no step; unless its ranks' restore check refused (and quarantined)
        # the checkpoint it resumed from: the next start resumes from another, no start-up error repeats.
        no_step = resumed is not None and at <= resumed + 1 and not self._quarantined(resumed)
        self.state.restarts_without_progress = self.state.restarts_without_progress + 1 if no_step else 0
        decision = decide(event, self.state.restart_steps, at, self.policy.restarts,
                          without_progress=self.state.restarts_without_progress)  # fmt: skip
        rank = event.ranks[0] if event.ranks else None
        incident = self.incidents.open_incident(self.job.name, _machinery_diagnosis(max(at, 0), rank, event.describe()),
                                                actor="supervisor", step=max(self.current_step, 0),
                                                payload={"machinery": event.describe()})  # fmt: skip
        if decision.action == "escalate":
            self.incidents.record(incident.id, EventKind.ESCALATED, actor="supervisor",
                                  payload={"reason": decision.reason})  # fmt: skip
            move(self.incidents, incident.id, IncidentState.ESCALATED, decision.reason, self.current_step)
            self._end_now(JobPhase.FAILED, decision.reason)
            return
        # Record the intent before touching anything; then replace the group.
        began = self.incidents.begin(incident.id, EventKind.WORKER_RESTARTED, actor="supervisor",
                                     step=self.current_step,
                                     payload={"reason": event.describe(), "decision": decision.reason, "rank": rank,
                                              "from_generation": self.state.generation})  # fmt: skip
        self.state.restart_steps.append(at)
        self._replace_group(None, f"restart:g{self.state.generation + 1}", decision.reason,
                            f"worker group restarted ({event.kind})", decision.delay_s, (began.id, incident.id))  # fmt: skip

    def _replace_group(self, to_step: int | None, key: str, why: str, reason: str, delay_s: float = 0.0,
                       machinery: tuple[int, int] | None = None) -> None:  # fmt: skip
        """A new worker generation from ``to_step`` -- for a fault (``machinery``: its event and
        incident; ``to_step`` None: the restart target, chosen once the old group is down) or for a
        rollback carried out as a restart (``config.recovery``)."""
        self.set_phase(JobPhase.RESTARTING, why)
        # 1. Take the old generation down (a hung rank would block the others in collectives).
        self.workers.shutdown()
        if machinery is not None:  # 2. verified now, before the onset (less a margin) of any open incident
            to_step = self._restart_target()
            self.state.restart_resumed_at = -1 if to_step is None else to_step
        self.state.generation += 1
        self.state.held_at.clear()
        # 3. The analysed timeline continues from the resume point.
        self.rewind(-1 if to_step is None else to_step, key, reason)
        # 4. The new generation hears every directive its open incident still needs.
        after_seq = self.directives.last_seq
        self._redeliver()
        self.persist(force=True)
        # 5. Launch after the policy's backoff (the loop keeps serving meanwhile).
        restart = Restarting(time.monotonic() + delay_s, to_step, after_seq, machinery)
        self.set_lifecycle(Relaunching(restart, self.lifecycle.resumed()), why)

    def _relaunch(self, restart: Restarting, then: Running | Ended) -> None:
        self.set_lifecycle(then, f"launching worker generation {self.state.generation}")
        resume, after_seq, machinery = restart.resume_step, restart.after_seq, restart.machinery
        try:
            self._launch(resume, after_seq)
        except SupervisorError as exc:
            self.state.exit_code = exc.exit_code
            if machinery is not None:  # a failure's restart is its own incident
                self.incidents.finish(machinery[0], result={"error": exc.one_line()}, failed=True)
                move(self.incidents, machinery[1], IncidentState.ESCALATED, f"relaunch failed: {exc.one_line()}",
                     self._event_step)  # fmt: skip
            self._end_now(JobPhase.FAILED, f"cannot restart the worker group: {exc.one_line()}")
            return
        if machinery is not None:
            n, full = self.world_size, self.job.resources.num_workers
            self.incidents.finish(
                machinery[0],
                result={"resume_step": resume, "generation": self.state.generation, "world_size": n},
            )
            fewer = f" on {n} of {full} ranks (resources.min_workers)" if n < full else ""
            move(self.incidents, machinery[1], IncidentState.RESOLVED,
                 f"worker group restarted from step {resume}{fewer}", self._event_step)  # fmt: skip
        self._group_started()

    @property
    def _event_step(self) -> int | None:
        """The step an incident event is recorded at: None while the timeline stands before step 0
        (a group restarted from scratch, before its first record)."""
        return self.current_step if self.current_step >= 0 else None

    def _quarantined(self, step: int) -> bool:
        """Checkpoint ``step`` exists and is quarantined (a failed check after it was chosen)."""
        manifest = self._manifest(step)
        return manifest is not None and manifest.health is HealthMark.QUARANTINED

    def _restart_target(self) -> int | None:
        """The newest verified checkpoint; during an incident, the newest at or before its rollback
        bound (or its onset minus RESTART_MARGIN_STEPS). None: start from scratch."""
        limits = []
        active = self.state.active
        for inc in self.incidents.active(self.job.name):
            d = inc.diagnosis
            if d is None or d.top_cause is Cause.DISTRIBUTED:
                continue
            limit = d.onset_step - RESTART_MARGIN_STEPS
            if active is not None and active.incident_id == inc.id:
                rollback = active.plan.action("rollback")
                if rollback is not None and rollback.params.get("max_target_step") is not None:
                    limit = int(rollback.params["max_target_step"])
            limits.append(limit)
        if not limits:
            return restart_step(self.checkpoints, self.world_size)
        try:
            step, _ = pick_rollback_target(self.checkpoints, max_step=min(limits), min_mark="verified",
                                           world_size=self.world_size)  # fmt: skip
        except CheckpointError as exc:
            self.log.warning("restart_from_scratch", why=f"no verified checkpoint at or before {min(limits)}: "
                                                        f"{exc.one_line()}")  # fmt: skip
            return None
        self.log.info("restart_target", step=step, bound=min(limits), why="before the open incident's onset")
        return step

    def _redeliver(self) -> None:
        """Directives of the active plan the dead generation took with it, again for the new one:
        the fixes it had applied and the action in progress, then the freeze it was under (last:
        a rank parks at a freeze, so what came in the same batch must come before it). A pending
        snapshot is moot -- the suspect state died with the old generation -- and is recorded so."""
        active = self.state.active
        if active is None:
            return
        gen = self.state.generation
        ordered: list[tuple[str, str, bool]] = []
        for i, pa in enumerate(active.plan.actions[: active.index + 1]):
            event = self.incidents.event_for_action(active.incident_id, action_id(active, i, pa.name))
            if event is None:
                continue
            pending = event.status is EventStatus.PENDING
            if pa.name == "snapshot" and pending:
                why = f"moot: the state to save died with worker generation {gen - 1}; the restart went back"
                self.incidents.finish(event.id, result={"moot": True, "reason": why}, failed=True)
                continue
            memo = event.payload.get("memo") or {}
            ids = [d["id"] for k in ("directive", "snapshot", "stop") if isinstance(d := memo.get(k), dict)]
            if pa.name == "rollback":  # the target it fell back to, if the ranks refused the planned one
                ids = [rollback_in_force(self.directives, did) for did in ids]
            # Again: what was in flight, every fix, the freeze in force -- not a done rollback (the
            # restart itself went back before the onset).
            if pending or pa.name == "apply" or (pa.name == "freeze" and self.state.frozen):
                ordered += [(did, pa.name, pending) for did in ids]
            if pa.name == "apply" and event.status is EventStatus.DONE:
                # The new generation applies the fix again from its resume point (a re-warm starts
                # over there); the rewind took the detector's note of it back: note it again.
                self.flow.note_overrides(max(self.current_step, 0), event.payload.get("params") or {},
                                         f"fix of incident {active.incident_id}")  # fmt: skip
        ordered.sort(key=lambda x: x[1] == "freeze")
        for did, name, pending in ordered:
            if pending:
                self.directives.forget_acks(did)
            copy = self.directives.redeliver(did, gen)
            self.log.info("directive_redelivered", id=did, copy=copy, generation=gen, action=name)

    # -- checkpoints ------------------------------------------------------------------------------
    def tend(self, *, final: bool = False) -> None:
        quiet = self.state.active is None and not self.state.waiting
        seen = self.state.incident_steps  # onsets, this timeline's: a rollback dropped the abandoned ones
        window = self.settings.healthy_after_steps

        def near(step: int) -> bool:
            return any(step - window <= s <= step + window for s in seen)

        newly = self.tending.tend(self.state, self.current_step, quiet=quiet, near_incident=near, final=final)
        if newly or final:
            if quiet:
                self.tending.catch_up_latest(self.state)
            onsets = [i.onset_step for i in self.incidents.active(self.job.name) if i.onset_step is not None]
            self.tending.retain(self.state, self.tending.protected_for(onsets))

    # -- state out ----------------------------------------------------------------------------------
    def persist(self, force: bool = False) -> None:
        """Write the state, then let the workers forget the records it reflects.

        A state identical to the one last written is not written again (it is what the file
        holds): a supervisor waiting on frozen or held workers no longer rewrites and fsyncs
        its state twice a second. The marks go out only after the state holding them is on disk.
        """
        if not force and time.monotonic() - self._last_persist < PERSIST_INTERVAL_S:
            return
        marks = self.receipts.consumed()
        st = self.state
        st.directives = self.directives.entries
        st.acks, st.failures = self.directives.acks, self.directives.failures
        st.watermark = self.assembler.watermark
        st.hold_analyzer(self.flow.analyzer.state_dict(), self._analyzer_json)
        # Memory holds what a restarted supervisor reads back: a long run's map stays bounded.
        self.batches = {s: b for s, b in self.batches.items() if s > self.current_step - 2 * HISTORY_KEPT}
        st.batches = dict(self.batches)
        st.receipts = marks
        st.hold_history(self.history)
        data = st.dump()
        if data != self._written:
            write_state(self.state_path, data)
            self._written = data
        self.receipts.made_durable(marks)
        self._last_persist = time.monotonic()

    def _abandon_pending_events(self, reason: str = "job ended") -> None:
        for incident in self.incidents.active(self.job.name):
            for ev in self.incidents.pending_events(incident.id):
                self.incidents.finish(ev.id, result={"reason": reason, "skipped": True}, failed=True)

    def _count_downtime(self) -> None:
        """Wall time during which training did not advance: frozen, restarting, or held for an incident."""
        held = len(self.state.held_at) == self.world_size and not self.flow.idle
        stalled = self.state.frozen or self.phase is JobPhase.RESTARTING or held
        now = time.time()
        if stalled and self.state.stalled_since is None:
            self.state.stalled_since = now
        elif not stalled and self.state.stalled_since is not None:
            self.state.downtime_s += now - self.state.stalled_since
            self.state.stalled_since = None

    def downtime_now(self) -> float:
        since = self.state.stalled_since
        return self.state.downtime_s + (time.time() - since if since is not None else 0.0)

    # -- effects: what the plan's actions do to the job, carried out here alone ----------------
    def advance_plan(self) -> bool:
        """The active plan moves on by one action transition: ``flow.begin``, the runner's step(s),
        ``flow.settle`` (docs/architecture.md, "The control loop"). True when an action started or
        finished."""
        active, fx = self.flow.begin(self._now())
        self.apply_all(fx)
        if active is None:
            return False
        runner = self.flow.runner
        before = (active.plan_no, active.index, runner.transitions)
        step = runner.advance(active, self)
        self.apply_all(step.effects)
        while step.again:  # begun: started once its event is on disk; re-started: polled after its start
            step = runner.advance(active, self)
            self.apply_all(step.effects)
        self.apply_all(self.flow.settle(active, step.failed, self._now()))
        now = self.state.active
        return now is None or before != (now.plan_no, now.index, runner.transitions)

    def apply_all(self, fx: Iterable[effects.Effect]) -> None:
        for effect in fx:
            self.apply(effect)

    def drive(self, flow: Generator[effects.Effect, Any, Any]) -> Any:
        """Carry out each effect as the flow yields it, sending back what it asks for (an
        ``OpenIncident``'s id), before the flow goes on; returns what the flow returns."""
        answer = None
        while True:
            try:
                effect = flow.send(answer)
            except StopIteration as end:
                return end.value
            answer = self.apply(effect)

    def apply(self, effect: effects.Effect) -> Any:
        """Carry out one effect an executor returned (``actions.base``); each is keyed or idempotent.
        Returns what the effect made that its maker reads next (an opened incident's id), else None."""
        self.effects_applied.append(effect)
        match effect:
            case effects.OpenIncident(diagnosis, key, step):
                return int(self.incidents.open_incident(self.job.name, diagnosis, key=key, step=step).id)
            case effects.ReopenIncident(incident, diagnosis, reason, attempt, step, key):
                self.incidents.reopen(incident, diagnosis, reason=reason, attempt=attempt, step=step, key=key)
            case effects.Issue(directive):
                self.issue(directive)
            case effects.BlockLatest(incident, reason) if self.checkpoints is not None:
                self.checkpoints.block(reason, incident=incident)
            case effects.Submit(name, fn, args) if name not in self.tasks:  # once per name
                self.tasks[name] = self.pool.submit(fn, *args)
                # Its result is read at the pass it comes in.
                self.tasks[name].add_done_callback(lambda _done: self._wake.set())
            case effects.SubmitReplay(name, step, suspects, numeric) if name not in self.tasks:
                self.tasks[name] = self.workers.replay(step, list(suspects), numeric)
            case effects.Rewind(to_step, key, reason):
                self.rewind(to_step, key, reason)
            case effects.NoteOverrides(step, params, reason):
                # The state holding the detector's note is on disk before the fix is recorded done:
                # a supervisor killed at any moment after never reads its own re-warm as a new fault.
                self.flow.note_overrides(step, params, reason)
                self.persist(force=True)
            case effects.SetFrozen(frozen):
                self.state.frozen = frozen
                self.assembler.touch()
            case effects.ReleaseLatest(incident) if self.checkpoints is not None:
                self.checkpoints.unblock(incident)
            case effects.RestartGroup(to_step, key, reason) if key not in self.state.effects:  # once
                self._replace_group(to_step, key, reason, reason)
            case effects.EndJob(phase, reason):  # it ends once the workers are down
                self.set_lifecycle(self.lifecycle.decided(JobPhase(phase), reason), reason)
            case effects.KillWorkers(reason):  # the job's end is real, not only recorded
                self.log.warning("workers_killed", reason=reason, step=self.current_step)
                self._take_down(reason)
            case effects.BeginAction(incident, kind, step, payload, aid, irreversible):
                self.incidents.begin(
                    incident, kind, actor="supervisor", step=step, payload=payload, action_id=aid
                )
                if (active := self._plan_of(incident, None)) is not None:
                    active.irreversible |= irreversible
            case effects.FinishAction(event_id, result, failed):
                self.incidents.finish(event_id, result=result, failed=failed)
            case effects.NextAction(incident, plan_no, index):
                if (active := self._plan_of(incident, plan_no)) is not None and active.index == index:
                    active.index += 1
            case effects.AmendPlan(incident, plan_no, plan):
                if (active := self._plan_of(incident, plan_no)) is not None:
                    active.plan = plan
            case effects.StartPlan(active):
                self.state.active = active
            case effects.EndPlan():
                self.state.active = None
            case effects.MoveIncident(incident, to, reason, step):
                move(self.incidents, incident, to, reason, step)
            case effects.RecordEvent(incident, kind, step, payload, actor):
                self.incidents.record(incident, kind, actor=actor, step=step, payload=payload)
            case effects.SetPhase(phase, reason, only_from) if only_from in (None, self.phase):
                self.set_phase(phase, reason)
            case effects.Persist():
                self.persist(force=True)

    def issue(self, directive: Directive) -> None:
        """Persist, then publish: a worker can never fetch a directive a restart would not know."""
        if self.directives.has(directive.id):
            return
        probe = DirectiveLog(self.directives.entries)
        probe.append(directive)
        self.state.directives = probe.entries
        self.state.save(self.state_path)
        self._written = None  # the file now holds more than the last persist wrote
        self.directives.append(directive)
        self.log.info("directive_issued", kind=directive.kind, id=directive.id, step=self.current_step)

    def _plan_of(self, incident: int, plan_no: int | None) -> ActivePlan | None:
        """The active plan, if it is incident ``incident``'s (and its plan ``plan_no``)."""
        active = self.state.active
        if active is None or active.incident_id != incident or plan_no not in (None, active.plan_no):
            return None
        return active

    def _now(self) -> Now:
        """What the incident flow reads of the job at this moment (``incidents.Now``)."""
        return Now(self.current_step, self.history, self.downtime_now(), self.stop_requested)

    def _finalize_open(self) -> bool:
        return bool(self.drive(self.flow.finalize_open(self._now())))

    # -- what actions may ask (actions.base.Runtime) ------------------------------------------
    @property
    def incident_id(self) -> int:
        assert self.state.active is not None
        return self.state.active.incident_id

    @property
    def diagnosis(self) -> Diagnosis:
        return self.flow.active_diagnosis

    def rollback_target(self, max_step: int, min_mark: str = "healthy") -> tuple[int, dict[str, Any]]:
        """``checkpoint.lifecycle.pick_rollback_target``, searched by rank 0's process when it can (it has torch and
        DCP loaded for the deep re-verification; this process would import them, ~5 CPU-s), else
        here. Raises CheckpointError when no checkpoint qualifies."""
        found = self.workers.rollback_target(max_step, min_mark) if self.checkpoints is not None else None
        if found is None:
            return pick_rollback_target(self.checkpoints, max_step=max_step, min_mark=min_mark,
                                        world_size=self.world_size)  # fmt: skip
        if "error" in found:
            raise CheckpointError(str(found["error"]))
        return int(found["step"]), dict(found["verification"])

    def rewind(self, to_step: int, key: str, reason: str) -> None:
        """The job continues from checkpoint ``to_step``: steps after it start over. Keyed: the
        same effect (a rollback's directive, a restart's generation) is carried out once, and
        the new position is on disk before the action that caused it is marked done."""
        if key in self.state.effects:
            return
        machinery = key.startswith("restart:g") and key[len("restart:g") :].isdigit()  # ``_restart``'s key
        active = None if machinery else self.state.active
        self.time_lost.on_rewind(to_step, self.current_step, active.incident_id if active else None)
        self.assembler.rewind(to_step)
        self.drive(self.flow.notify_rollback(to_step, reason, self._now()))
        if not key.startswith("restart:"):
            self.state.restart_resumed_at = None  # a rollback: the group had trained past its resume point
        self.current_step = to_step
        self.history.drop_after(to_step)
        self.tending.abandon_after(self.state, to_step)
        self.state.effects.append(key)
        self.persist(force=True)

    def window_after(self, step: int) -> list[StepStats]:
        return [h for h in self.history if h.step > step]

    def baseline(self) -> dict[str, Any] | None:
        return self.state.active.baseline if self.state.active else None

    def batch_range(self, first_step: int, last_step: int) -> tuple[int, int]:
        return self.batches.get(first_step, first_step), self.batches.get(last_step, last_step)

    def result_of(self, name: str) -> tuple[bool, Any] | None:
        task = self.tasks.get(name)
        if task is None:
            return None
        if isinstance(task, Future):
            if not task.done():
                return None
            exc = task.exception()
            return (False, repr(exc)) if exc else (True, task.result())
        return self.workers.ray_result(task)

    def incidents_opened_since(self, step: int) -> int:
        return self.flow.opened_since(step)

    def recurrences_since(self, step: int) -> list[dict[str, Any]]:
        return self.flow.recurrences_since(step)

    def training_ended(self) -> bool:
        """No further training step will come: the workers are gone, or all hold at their last step."""
        held = self.state.held_at.values()
        return self.workers_gone() or (len(held) == self.world_size and self.assembler.watermark >= max(held))

    def workers_gone(self) -> bool:
        """No record and no ack will come any more (``lifecycle.Ended``, or what a restart resumes as)."""
        return isinstance(self.lifecycle.resumed(), Ended)

    # -- called from actor threads ------------------------------------------------------------
    def ingest_groups(self, groups: Sequence[Group]) -> list[dict[str, Any]]:
        """Queue the links' batches of one call (a packed batch, ``sdk/wire.py``: per link its rank,
        id, the range of numbers it still holds, its records' numbers and the records) together as
        one inbox item. Each link's answer says what is durable, and asks for a resend when the link
        holds older records this supervisor never received."""
        replies, taken = [], []
        for rank, link, held, seqs, batch in groups:
            reply: dict[str, Any] = {
                "acked": self.receipts.ack_for(link) if link else 0,
                "incarnation": self.incarnation,
            }
            if link is not None and seqs is not None:
                resend = self.receipts.offer(link, seqs, tuple(held) if held else None)  # type: ignore[arg-type]
                if resend is not None:
                    reply["resend_from"] = resend
                    batch = []
            if batch:
                taken.append((rank, batch, seqs, link))
            replies.append(reply)
        if taken:
            self.inbox.put(taken)
            self._wake.set()
        return replies

    def ingest_wire(self, batch: Any, *, as_dicts: bool = False) -> list[dict[str, Any]]:
        """A packed batch as the actor receives it (``sdk/wire.py``): decoded as one frame when every
        record travelled in the clean columns (``ingest_frame``), else into records (dicts:
        ``as_dicts``) link by link (``ingest_groups``). Raises ``WireError`` for no such batch."""
        packed = None if as_dicts else unpack_frame(batch)
        if packed is None:
            return self.ingest_groups(unpack(batch, as_dicts=as_dicts))
        return self.ingest_frame(packed)

    def ingest_frame(self, p: Packed) -> list[dict[str, Any]]:
        """``ingest_groups`` for a batch decoded as one frame (``sdk/wire.unpack_frame``): each link's
        answer as there; a link asked to resend has its records left out of the frame."""
        links, seqs = p.links, p.seqs
        durable, incarnation = self.receipts.durable, self.incarnation
        replies = [
            {"acked": durable.get(link, 0) if link else 0, "incarnation": incarnation} for link in links
        ]
        if seqs is not None and not self._next_of_each(p):
            refused: set[int] = set()
            at = 0
            for g, (link, count) in enumerate(zip(links, p.counts, strict=True)):
                if link is not None:
                    resend = self.receipts.offer(link, seqs[at : at + count], p.held_of(g))
                    if resend is not None:
                        replies[g]["resend_from"] = resend
                        refused.add(g)
                at += count
            if refused:
                p = _without(p, refused)
        if len(p.frame):
            self.inbox.put(p)
            self._wake.set()
        return replies

    def _next_of_each(self, p: Packed) -> bool:
        """The batch holds one record of each of its links, each the next its link numbers: offered
        in bulk (True). False: offer link by link."""
        links, seqs = p.links, p.seqs
        if seqs is None or len(seqs) != len(links) or p.counts.count(1) != len(links):
            return False
        if None in links or len(set(links)) != len(links):
            return False
        return self.receipts.offer_next(links, seqs)  # type: ignore[arg-type]

    def request_stop(self, reason: str) -> None:
        self.stop_requested = reason
        self._wake.set()

    def status(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else None
        return {
            "job": self.job.name,
            "phase": self.phase.value,
            "terminal": self.phase.is_terminal,
            "exit_code": self.state.ended_with(),
            "reason": self.state.reason,
            "step": max(self.current_step, 0),
            "max_steps": self.job.max_steps,
            **{k: getattr(last, k) if last else None for k in ("loss", "grad_norm", "tokens_per_s", "lr")},
            "frozen": self.state.frozen,
            "generation": self.state.generation,
            "world_size": self.world_size,
            "num_workers": self.job.resources.num_workers,
            "group_restarts": len(self.state.restart_steps),
            "incident": self.flow.summary(),
            "incidents_total": len(set(self.state.incident_keys.values())),  # a reopen: a key, same id
            "mode": self.job.mode,
            "records_missing": self.assembler.missing,
            "records_lost": self.receipts.lost,
            "held_at_end": sorted(set(self.state.held_at.values())),
            "downtime_s": round(self.state.downtime_s, 2),
            "time_lost": self.time_lost.summary(self.downtime_now()),
        }


def _machinery_diagnosis(step: int, rank: int | None, reason: str) -> Diagnosis:
    """Machinery faults are recorded as incidents too; the cause is the distributed system."""
    return Diagnosis(
        onset_step=step,
        peak_step=step,
        end_step=step,
        phenotype=Phenotype.TRANSIENT,
        first_rank=rank,
        causes=[CauseScore(Cause.DISTRIBUTED, 1.0, [reason])],
        severity=Severity.HIGH,
        detected_step=step,
    )


def _clip(v: Any) -> TypeGuard[int | float]:
    """A grad-clip value a rank reports (``attrs.grad_clip``): a number >= 0."""
    return isinstance(v, int | float) and not isinstance(v, bool) and v >= 0


def _without(p: Packed, groups: set[int]) -> Packed:
    """The batch less the records of ``groups`` (links asked to resend)."""
    keep = [g for g in range(len(p.links)) if g not in groups]
    starts = [0, *accumulate(p.counts)]
    rows = [i for g in keep for i in range(starts[g], starts[g + 1])]
    seqs = None if p.seqs is None else [p.seqs[i] for i in rows]
    return Packed([p.ranks[g] for g in keep], [p.links[g] for g in keep],
                  [x for g in keep for x in p.held[2 * g : 2 * g + 2]], [p.counts[g] for g in keep], seqs,
                  p.frame.take(rows))  # fmt: skip

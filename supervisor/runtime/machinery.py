"""The machinery: the worker group's life, its failures, and the checkpoints it leaves.

A worker that dies (its actor is gone), fails (the training function raised) or hangs (no
record from a rank for ``telemetry.hang_timeout_s`` while not frozen) -- or a lost node,
which kills its workers -- is handled the same way: the group is replaced by a new
generation that resumes from the newest *verified* checkpoint, and that is recorded as an
incident of its own.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import RayError

from supervisor.core.model import Cause, CauseScore, Diagnosis, HealthMark, Phenotype, Severity
from supervisor.errors import RuntimeBackendError, SupervisorError
from supervisor.incidents import EventKind, EventStatus, IncidentState
from supervisor.logging import get_logger
from supervisor.runtime.group import WorkerGroup
from supervisor.runtime.plans import move
from supervisor.runtime.state import JobPhase
from supervisor.runtime.stores import restart_step

if TYPE_CHECKING:
    from supervisor.runtime.controller import Controller

log = get_logger("supervisor.runtime.machinery")


class Machinery:
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        self.group: WorkerGroup | None = None
        self.finished = False
        self.ending: tuple[JobPhase, str] | None = None
        self._stop_sent = 0.0

    # -- start / re-attach ----------------------------------------------------------------------
    def boot(self) -> None:
        ctl, state = self.ctl, self.ctl.state
        if ctl.attach:
            self.group = WorkerGroup.find(ctl.job, ctl.settings)
            self._resumed_note()
            if self.group is None and not state.phase.is_terminal:
                self.restart(None, "no workers found when the supervisor re-attached")
            elif self.group is not None:
                self._reacquire_acks()
            return
        if WorkerGroup.find(ctl.job, ctl.settings) is not None:
            raise RuntimeBackendError(
                f"job {ctl.job.name!r} already has workers on this cluster: use `supervisor launch --attach "
                f"{ctl.job.name}` or `supervisor stop {ctl.job.name}` first"
            )
        resume = restart_step(ctl.checkpoints, ctl.world_size)
        if resume is not None:
            log.info("resuming_from_checkpoint", step=resume, why="newest verified checkpoint in storage")
            ctl.rewind(resume)
        self._launch(resume)

    def _launch(self, resume: int | None) -> None:
        ctl = self.ctl
        ctl.state.phase = JobPhase.STARTING
        self.group = WorkerGroup(ctl.job, ctl.settings, ctl.state.generation)
        seq = ctl.directives.entries[-1]["seq"] if ctl.directives.entries else 0
        self.group.launch(resume, after_seq=seq)
        ctl.assembler.touch(started=True)
        ctl.state.phase = JobPhase.INCIDENT if ctl.state.active else JobPhase.RUNNING
        ctl.persist(force=True)

    def _resumed_note(self) -> None:
        ctl = self.ctl
        for incident in ctl.incidents.active(ctl.job.name):
            pending = [e.action_id for e in ctl.incidents.pending_events(incident.id)]
            ctl.incidents.record(incident.id, EventKind.SUPERVISOR_RESUMED, actor="supervisor", step=ctl.current_step,
                                 payload={"pending_actions": pending, "workers_found": self.group is not None})  # fmt: skip

    def _reacquire_acks(self) -> None:
        """Acknowledgements sent while no supervisor listened: ask each worker's link."""
        assert self.group is not None
        for st in self.group.statuses():
            link = st.get("link") or {}
            self.ctl.directives.note_applied(
                int(st["rank"]), link.get("applied") or {}, link.get("last_step")
            )

    # -- watching ---------------------------------------------------------------------------------
    def watch(self) -> None:
        ctl = self.ctl
        if self.group is None:
            return
        if ctl.stop_requested and not self._stop_sent:
            self._send_stop(ctl.stop_requested)
        health = self.group.health()
        if health.state == "finished":
            self.finished = True
            if ctl.state.active is None or self.ending is not None:
                self._end(*(self.ending or self._finished_phase()))
            return
        if self._stop_sent and time.monotonic() - self._stop_sent > ctl.settings.directive_timeout_s:
            self._end(
                JobPhase.STOPPED, f"stop requested ({ctl.stop_requested}); workers killed after timeout"
            )
            return
        if health.state in ("lost", "failed"):
            self.restart(health.rank, f"worker rank {health.rank} {health.state}: {health.reason}")
            return
        if not ctl.state.frozen:
            silent = ctl.assembler.silent_ranks(
                ctl.job.telemetry.hang_timeout_s, range(ctl.world_size), ctl.settings.startup_timeout_s
            )
            if silent:
                self.restart(silent[0], f"no record from rank(s) {silent} for {ctl.job.telemetry.hang_timeout_s:.0f}s "
                                        f"(telemetry.hang_timeout_s): hung")  # fmt: skip

    def _finished_phase(self) -> tuple[JobPhase, str]:
        if self.ctl.stop_requested:
            return JobPhase.STOPPED, f"stopped on request: {self.ctl.stop_requested}"
        return JobPhase.FINISHED, f"all {self.ctl.world_size} ranks finished"

    def _send_stop(self, reason: str) -> None:
        from supervisor.sdk.directives import Stop

        self.ctl.issue(Stop(reason=reason, id=f"stop-{int(time.time())}"))
        self._stop_sent = time.monotonic()

    def _end(self, phase: JobPhase, reason: str) -> None:
        self.ctl.state.phase = phase
        self.ctl.state.reason = reason

    # -- restarts ---------------------------------------------------------------------------------
    def restart(self, rank: int | None, reason: str) -> None:
        """Replace the worker group from the newest verified checkpoint, as an incident of its own."""
        ctl, state = self.ctl, self.ctl.state
        # The fault struck in the first step the group did not finish; the analysed step
        # (current_step) lags behind it by whatever records were still in flight.
        reached = ctl.assembler.reached()
        at = max(ctl.current_step, reached + 1 if reached is not None else ctl.current_step)
        log.warning("worker_group_fault", reason=reason, rank=rank, generation=state.generation, step=at)
        incident = ctl.incidents.open_incident(ctl.job.name, _machinery_diagnosis(at, rank, reason),
                                               actor="supervisor", step=ctl.current_step,
                                               payload={"machinery": reason})  # fmt: skip
        if state.group_restarts >= ctl.settings.max_group_restarts:
            why = f"{state.group_restarts} restarts reached RuntimeSettings.max_group_restarts"
            ctl.incidents.record(
                incident.id, EventKind.ESCALATED, actor="supervisor", payload={"reason": why}
            )
            move(ctl.incidents, incident.id, IncidentState.ESCALATED, why, ctl.current_step)
            self.close()
            self._end(JobPhase.FAILED, f"{reason}; {why}")
            return
        # 1. Record the intent before touching anything.
        event = ctl.incidents.begin(incident.id, EventKind.WORKER_RESTARTED, actor="supervisor",
                                    step=ctl.current_step, payload={"reason": reason, "rank": rank,
                                                                    "from_generation": state.generation})  # fmt: skip
        state.phase = JobPhase.RESTARTING
        # 2. Take the old generation down (a hung rank would block the others in collectives).
        if self.group is not None:
            self.group.shutdown()
        # 3. Resume point: newest checkpoint that is verified *now*; never an unverified `latest`.
        resume = restart_step(ctl.checkpoints, ctl.world_size)
        state.generation += 1
        state.group_restarts += 1
        state.frozen = False
        # 4. The analysed timeline continues from the resume point.
        ctl.rewind(resume if resume is not None else -1)
        try:
            self._launch(resume)
        except SupervisorError as exc:
            ctl.incidents.finish(event.id, result={"error": exc.one_line()}, failed=True)
            self._end(JobPhase.FAILED, f"cannot restart the worker group: {exc.one_line()}")
            return
        ctl.incidents.finish(event.id, result={"resume_step": resume, "generation": state.generation})
        move(
            ctl.incidents,
            incident.id,
            IncidentState.RESOLVED,
            f"worker group restarted from step {resume}",
            ctl.current_step,
        )

    def close(self) -> None:
        """Take the workers down (the job ended); their state is in the checkpoints."""
        if self.group is not None:
            self.group.shutdown()
            self.group = None
        for incident in self.ctl.incidents.active(self.ctl.job.name):
            for ev in self.ctl.incidents.pending_events(incident.id):
                if ev.status is EventStatus.PENDING:
                    self.ctl.incidents.finish(ev.id, result={"reason": "job ended"}, failed=True)

    # -- replay tasks -------------------------------------------------------------------------------
    def replay(self, step: int, suspects: list[str], numeric: bool) -> Any:
        from supervisor.runtime.replay import run_replay

        task = ray.remote(num_cpus=1, max_retries=0)(run_replay)
        return task.remote(self.ctl.job.model_dump(mode="json"), step, suspects, numeric)

    def ray_result(self, ref: Any) -> tuple[bool, Any] | None:
        ready, _ = ray.wait([ref], timeout=0)
        if not ready:
            return None
        try:
            return True, ray.get(ref)
        except RayError as exc:
            return False, str(exc).strip().splitlines()[-1][:500]

    # -- checkpoints ----------------------------------------------------------------------------------
    def tend_checkpoints(self) -> None:
        """Saved -> verified (checksums, completeness) -> healthy (a clean window after it)."""
        ctl, state = self.ctl, self.ctl.state
        store = ctl.checkpoints
        if store is None:
            return
        from supervisor.checkpoint import verify

        for step in list(state.checkpoints_seen):
            if step in state.checkpoints_verified:
                continue
            try:
                result = verify(store, step, expected_world_size=ctl.world_size, by="supervisor")
            except SupervisorError as exc:
                log.warning("checkpoint_verify_failed", step=step, error=exc.one_line())
                state.checkpoints_seen.remove(step)
                continue
            state.checkpoints_verified.append(step)
            if not result.ok:
                state.checkpoints_seen.remove(step)
        window = ctl.settings.healthy_after_steps
        for step in list(state.checkpoints_verified):
            if step in state.checkpoints_healthy or ctl.current_step < step + window:
                continue
            if state.active is not None or self._incident_near(step, window):
                continue
            manifest = store.find(step)
            if manifest is None or manifest.health is not HealthMark.VERIFIED:
                state.checkpoints_healthy.append(step)
                continue
            store.mark(
                step, HealthMark.HEALTHY, f"{window} steps after it without anomaly (healthy_after_steps)"
            )
            state.checkpoints_healthy.append(step)

    def abandon_after(self, step: int) -> None:
        """Checkpoints after a rollback target belong to the abandoned timeline: quarantine them,
        and move `latest` back to the target.

        They must never be a resume point (they may hold the incident's state), and the new
        timeline re-saves the same steps, which the store only allows over a quarantined one.
        Diagnostic snapshots stay as they are: they are the incident's evidence, and a re-save at
        a snapshot's step keeps the snapshot beside it as that step's history.
        """
        state, store = self.ctl.state, self.ctl.checkpoints
        for name in ("checkpoints_seen", "checkpoints_verified", "checkpoints_healthy"):
            setattr(state, name, [s for s in getattr(state, name) if s <= step])
        if store is None:
            return
        keep = (HealthMark.DIAGNOSTIC, HealthMark.QUARANTINED)
        for manifest in store.manifests():
            if manifest.step > step and manifest.health not in keep:
                store.mark(
                    manifest.step,
                    HealthMark.QUARANTINED,
                    f"abandoned timeline: training went back to step {step}",
                )
        store.retreat_latest(step)

    def _incident_near(self, step: int, window: int) -> bool:
        last = self.ctl.state.last_incident_step
        return last is not None and step - window <= last <= step + window


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

"""Checkpoints the run leaves: saved -> verified -> healthy (``tend``), `latest` on the timeline
(``abandon_after``, ``catch_up_latest``), retention (``retain``, ``protected_for``). What each
step means: docs/runtime.md, the paragraph after the action table and Crash consistency.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from supervisor.core.model import HealthMark
from supervisor.errors import SupervisorError
from supervisor.logging import get_logger
from supervisor.runtime.state import RuntimeState

log = get_logger("supervisor.runtime.tending")

_USABLE = (HealthMark.VERIFIED, HealthMark.HEALTHY)
"""A checkpoint's marks that let it count verified, and turn (or stay) healthy."""


class CheckpointTending:
    def __init__(self, store: Any, world_size: int, healthy_after_steps: int, keep: int) -> None:
        self.store = store
        self.world_size = world_size
        self.window = healthy_after_steps
        self.keep = keep

    def tend(self, state: RuntimeState, current_step: int, *, quiet: bool, near_incident: Callable[[int], bool],
             final: bool = False) -> list[int]:  # fmt: skip
        """Verify what was saved and mark healthy what earned it; returns the newly healthy steps.
        ``quiet``: no incident is being acted on. ``final``: training ended with nothing open, so a
        verified checkpoint needs no further steps after it to count as healthy."""
        if self.store is None:
            return []
        if final:
            self._discover(state, current_step)
        self._verify(state)
        healthy: list[int] = []
        if not quiet:
            return healthy
        settled = set(state.checkpoints_healthy)  # a set: this runs after every analysed step
        for step in list(state.checkpoints_verified):
            if step in settled or near_incident(step):
                continue
            if current_step < step + self.window and not (final and current_step >= step):
                continue
            manifest = self.store.find(step)
            if manifest is None or manifest.health not in _USABLE:
                # Gone (retention) or quarantined since: never healthy, never `latest`.
                state.checkpoints_verified.remove(step)
                continue
            if manifest.health is HealthMark.VERIFIED:
                why = "training ended cleanly after it" if current_step < step + self.window else (
                    f"{self.window} steps after it without anomaly (healthy_after_steps)")  # fmt: skip
                self.store.mark(step, HealthMark.HEALTHY, why)
                healthy.append(step)
            state.checkpoints_healthy.append(step)
        return healthy

    def _discover(self, state: RuntimeState, current_step: int) -> None:
        """Training ended: a checkpoint committed after the last one reported -- a framework's final
        save, written after the last step's record went out (an HF ``Trainer`` saves once training
        has ended), so its ``checkpoint_saved`` event never reached the supervisor -- is this
        timeline's newest and is verified and marked like any other."""
        newest = max(state.checkpoints_seen, default=-1)
        since = float(state.time_lost.get("started_at") or 0.0)  # this run's: never a save of an older run
        try:
            manifests = self.store.manifests()
        except SupervisorError as exc:
            log.warning("checkpoint_discovery_failed", error=exc.one_line())
            return
        for m in manifests:
            if (
                newest < m.step <= current_step
                and m.health is HealthMark.UNVERIFIED
                and m.created_at >= since
            ):
                log.info(
                    "checkpoint_found_at_end",
                    step=m.step,
                    why="committed after the last record it could ride on",
                )
                state.checkpoints_seen.append(m.step)

    def _verify(self, state: RuntimeState) -> None:
        from supervisor.checkpoint import verify

        done = set(state.checkpoints_verified)
        for step in list(state.checkpoints_seen):
            if step in done:
                continue
            try:
                result = verify(self.store, step, expected_world_size=self.world_size, by="supervisor")
            except SupervisorError as exc:
                log.warning("checkpoint_verify_failed", step=step, error=exc.one_line())
                state.checkpoints_seen.remove(step)
                continue
            usable = result.manifest is not None and result.manifest.health in _USABLE
            if result.ok and usable:
                state.checkpoints_verified.append(step)
            else:  # failed, or quarantined before (an abandoned timeline's save a late record named):
                # never counted verified, so a later save of the same step (a re-run) is verified afresh
                state.checkpoints_seen.remove(step)

    def abandon_after(self, state: RuntimeState, step: int) -> None:
        """Checkpoints after ``step`` belong to the abandoned timeline: quarantined (never a resume
        point: they may hold the incident's state; and the new timeline re-saves the same steps, which
        the store allows only over a quarantined one), `latest` moved back. Diagnostic snapshots stay:
        they are the incident's evidence."""
        for name in ("checkpoints_seen", "checkpoints_verified", "checkpoints_healthy", "incident_steps"):
            setattr(state, name, [s for s in getattr(state, name) if s <= step])
        if self.store is None:
            return
        keep = (HealthMark.DIAGNOSTIC, HealthMark.QUARANTINED)
        why = f"abandoned timeline: training went back to step {step}"
        for manifest in self.store.manifests():
            if manifest.step > step and manifest.health not in keep:
                self.store.mark(manifest.step, HealthMark.QUARANTINED, why)
        self.store.retreat_latest(step)

    def catch_up_latest(self, state: RuntimeState) -> int | None:
        """`latest` forward to this timeline's newest healthy checkpoint, never past a block another
        incident holds; returns where `latest` is (None: nowhere to move it). A step counted healthy
        may be gone since (retention, a restore check, an abandoned timeline): it is skipped, logged
        and no longer counted. A storage error never stops the job: it is left for the next call."""
        if self.store is None:
            return None
        try:
            if self.store.block_state() is not None:
                return None
            current = self.store.latest()
        except SupervisorError as exc:
            log.warning("latest_not_moved", error=exc.one_line(), why="the store did not answer")
            return None
        for step in sorted(set(state.checkpoints_healthy), reverse=True):
            if current is not None and current >= step:
                return current
            why = self._not_healthy(step)
            if why is None:
                try:
                    self.store.advance_latest(step)
                except SupervisorError as exc:  # gone between the look and the move
                    why = exc.one_line()
                else:
                    log.info("latest_moved_forward", from_step=current, to_step=step)
                    return step
            log.warning("latest_candidate_skipped", step=step, why=why)
            for name in ("checkpoints_seen", "checkpoints_verified", "checkpoints_healthy"):
                setattr(state, name, [s for s in getattr(state, name) if s != step])
        return current

    def _not_healthy(self, step: int) -> str | None:
        """Why checkpoint ``step`` cannot be `latest` now (None: it is committed and healthy)."""
        try:
            manifest = self.store.find(step)
        except SupervisorError as exc:
            return exc.one_line()
        if manifest is None:
            return f"no checkpoint at step {step} (removed since)"
        if manifest.health is not HealthMark.HEALTHY:
            return f"checkpoint is {manifest.health.value} now"
        return None

    def retain(self, state: RuntimeState, protected: Iterable[int]) -> None:
        """Apply retention; the steps it deleted leave the state's checkpoint lists, which so hold
        what the store holds (bounded by ``checkpoint.keep``) rather than every save of the run."""
        if self.store is None:
            return
        from supervisor.checkpoint import collect_garbage

        try:
            report = collect_garbage(self.store, self.keep, set(protected))
        except SupervisorError as exc:  # retention must never stop supervision: retried at the next call
            log.warning("retention_failed", error=exc.one_line())
            return
        if report.deleted:
            gone = set(report.deleted)
            for name in ("checkpoints_seen", "checkpoints_verified", "checkpoints_healthy"):
                setattr(state, name, [s for s in getattr(state, name) if s not in gone])

    def protected_for(self, onsets: Iterable[int]) -> set[int]:
        """Steps incidents may still need: the two newest healthy checkpoints before each open
        incident's onset (its rollback or restart target, and the one behind it should that fail
        re-verification), and every diagnostic snapshot (an incident's evidence, kept for review)."""
        if self.store is None:
            return set()
        manifests = self.store.manifests()
        out = {m.step for m in manifests if m.health is HealthMark.DIAGNOSTIC}
        for onset in onsets:
            before = sorted(m.step for m in manifests if m.step < onset and m.health is HealthMark.HEALTHY)
            out |= set(before[-2:])
        return out

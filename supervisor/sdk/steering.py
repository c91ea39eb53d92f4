"""Directives at step boundaries: freeze, snapshot, rollback in place, overrides, stop.

Every rank runs ``boundary()`` between the same two steps; rank 0's directives reach all
ranks through the control channel (``control.py``), which has every rank apply them at the same
boundary -- usually the one after rank 0 received them -- so all ranks act alike and no rank is
left waiting in a collective. Each directive is acknowledged in the record of the step at whose
boundary it took effect (``directive_applied:<id>:<kind>``); while frozen there is no step,
so acknowledgements go out as *control messages*: ``{"step", "rank", "world_size", "time",
"control": true, "events": [...]}`` — no ``loss``, so trace readers skip them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from supervisor.core.model import HealthMark
from supervisor.errors import SupervisorError
from supervisor.observability import hooks
from supervisor.sdk.control import Channel
from supervisor.sdk.directives import (
    END_REACHED,
    ApplyOverrides,
    Continue,
    Directive,
    Finish,
    Freeze,
    Replay,
    RollbackInPlace,
    Snapshot,
    Stop,
    ack_event,
)
from supervisor.sdk.guard import GUARD_ID, Guard, Watched

HOLD_BEAT_S = 2.0  # while frozen or held at the last step, each rank repeats that it is there this often
FROZEN = "frozen"  # the beat's event while frozen (``frozen:<step>``): a heartbeat, nothing to acknowledge

if TYPE_CHECKING:
    from supervisor.checkpoint.saver import Checkpointer, SaveHandle
    from supervisor.sdk.probe import Probe


class Steering:
    def __init__(self, probe: Probe, control: Channel) -> None:
        self.probe = probe
        self.control = control
        self.stopped = False
        self.frozen = False
        self.holding = False
        """The ranks hold at the last step (``_hold_at_end``), where a ``Finish`` means something."""
        self.finished = False
        """A ``Finish`` was applied there: the supervisor is done with the ranks holding."""
        self.lr_scale = 1.0
        self.warmup_steps: int | None = None
        self.warmup_from = 0
        self.grad_clip: float | None = None
        self.last_saved: int | None = None
        self.saver: Checkpointer | None = None
        """Created at the first save (every rank saves at the same boundary: it makes a gloo group)."""
        self._after_freeze: list[Directive] = []
        self.guard = _guard_for(probe)
        """The ranks' own hold while no supervisor answers (None: off, or no supervisor at the other end)."""
        if self.guard is not None:
            probe.transport = Watched(probe.transport, self.guard)
        self._handlers: dict[type[Directive], Callable[[Any], None]] = {
            Continue: lambda d: None,
            Freeze: self._freeze,
            Snapshot: lambda d: self.save(HealthMark.DIAGNOSTIC),
            RollbackInPlace: self._rollback,
            ApplyOverrides: self._apply,
            Stop: self._stop,
            Finish: self._finish,
            Replay: self._replay,
        }

    # -- the boundary --------------------------------------------------------------------------
    def boundary(self) -> None:
        p = self.probe
        if self.saver is not None:
            self._report(self.saver.poll())  # an asynchronous save that finished since the last boundary
        self.control.arrive()
        self._handle_batch(self.control.due())  # agreed for this boundary (a freeze parks here)
        self._offer()  # rank 0: what came since, for the next boundary
        while ds := self.control.depart():  # a rank leaves only once nothing more is due here
            self._handle_batch(ds)
        every = p.settings.checkpoint_every
        due = every and p.checkpoint is not None and p.step_count and p.step_count % every == 0
        if due and self.last_saved != p.step_count:
            self.save(HealthMark.UNVERIFIED, blocking=False)
        at_end = bool(p.settings.max_steps and p.step_count >= p.settings.max_steps)
        if at_end or self.stopped:
            self.finish_saves()  # the supervisor hears of the last save before the ranks hold or end
        holds = float(getattr(p.transport, "hold_at_end_s", 0.0)) > 0
        if at_end and not self.stopped and holds and self._hold_at_end():
            return  # the supervisor rolled training back: the loop goes on from there
        if self.stopped or at_end:
            self.stopped = True
            p.flush()
            raise StopIteration

    def _offer(self, extra: list[Directive] | None = None, *, parked: bool = False) -> None:
        """Rank 0 proposes what its transport received (and ``extra``: the guard's hold or release)
        to every rank; the other ranks drain their queues (rank 0's is what counts)."""
        mine = self.probe.transport.poll()
        if self.control.rank != 0:
            return
        mine += extra or []
        if self.guard is not None and not self.frozen:
            why = self.guard.at_boundary(bool(mine))
            if why is not None and not any(isinstance(d, Freeze) for d in mine):
                mine.append(Freeze(reason=f"guard: {why}", id=f"{GUARD_ID}{self.probe.step_count}"))
        self.control.propose(mine, parked=parked)
        for d in self.control.failed():  # the ranks could not agree on a boundary for it
            self.probe.log.error("directive not agreed by the ranks", directive=d.id, kind=d.kind)
            self._ack(ack_event(d, ok=False))

    def handle(self, d: Directive) -> None:
        log = self.probe.log.bind(directive=d.id, kind=d.kind, step=self.probe.step_count)
        try:
            self._handlers[type(d)](d)
        except SupervisorError as exc:
            log.error("directive failed", error=exc.one_line())
            self._ack(ack_event(d, ok=False))
            return
        log.info("directive applied")
        if not isinstance(d, Freeze):  # a freeze acknowledges itself before it parks
            self._ack(ack_event(d))

    def _ack(self, event: str) -> None:
        p = self.probe
        if self.frozen or p.pending is None:
            # No step to carry it now: tell the supervisor at once, and repeat it in the next record.
            p.transport.send([self._control_message([event])])
            p.next_events.append(event)
            return
        p.event(event)
        p.flush()

    def _control_message(self, events: list[str]) -> dict[str, Any]:
        p = self.probe
        return {"step": p.step_count, "rank": p.rank, "world_size": p.world_size, "time": time.time(),
                "control": True, "events": events}  # fmt: skip

    # -- directives ----------------------------------------------------------------------------
    def _handle_batch(self, ds: list[Directive]) -> None:
        """Apply one broadcast batch in order. A freeze parks the rank: what came after it in the
        same batch is handed to the freeze, which applies it first (same on every rank)."""
        for i, d in enumerate(ds):
            if isinstance(d, Freeze):
                self._after_freeze = list(ds[i + 1 :])
                self.handle(d)
                return
            self.handle(d)

    def _freeze(self, d: Freeze) -> None:
        own = d.id.startswith(GUARD_ID)  # the ranks' own hold: the supervisor never issued it
        self._ack(f"guard_held:{self.probe.step_count}" if own else ack_event(d))
        self.frozen = True
        self.probe.log.warning("frozen at boundary", step=self.probe.step_count, reason=d.reason)
        queued, self._after_freeze = self._after_freeze, []
        beat = time.monotonic()
        try:
            while not self.stopped and not self.finished:
                # The beat comes from this loop (the training thread), never from a side thread: a
                # rank stopped or hung while frozen goes silent, and the supervisor treats it as hung.
                if time.monotonic() - beat >= HOLD_BEAT_S:
                    self.probe.transport.send([self._control_message([f"{FROZEN}:{self.probe.step_count}"])])
                    beat = time.monotonic()
                if queued:
                    ds, queued = queued, []
                else:
                    release: list[Directive] = []
                    rank0_guard = self.guard if own and self.control.rank == 0 else None
                    why = rank0_guard.release_due() if rank0_guard is not None else None
                    if why is not None:
                        self.probe.log.warning("guard released", step=self.probe.step_count, why=why)
                        release = [Continue(id=f"{GUARD_ID}release-{self.probe.step_count}")]
                    self._offer(release, parked=True)
                    ds = self.control.due(self.probe.settings.freeze_poll_s)  # what every rank applies here
                if own and any(not x.id.startswith(GUARD_ID) for x in ds):
                    own = False  # the supervisor is back and acts: its own Continue releases the ranks
                for i, x in enumerate(ds):
                    if isinstance(x, Continue):
                        self._ack(
                            f"guard_released:{self.probe.step_count}"
                            if x.id.startswith(GUARD_ID)
                            else ack_event(x)
                        )
                        for rest in ds[i + 1 :]:  # what came with the release still applies
                            self.handle(rest) if not isinstance(rest, Freeze) else self._ack(ack_event(rest))
                        return
                    self.handle(x) if not isinstance(x, Freeze) else self._ack(ack_event(x))
        finally:
            self.frozen = False
            self.probe.log.info("released", step=self.probe.step_count)

    def _hold_at_end(self) -> bool:
        """Wait at the last step until the supervisor is done with it (runtime transports only).

        A spike in the last steps must not outlive the workers: the ranks stay here, state in
        memory, and apply what the supervisor sends (snapshot, rollback, overrides) until it sends
        ``Finish`` or ``Stop``. True when a rollback moved training back (the loop continues).
        Rank 0 alone decides when the hold times out (it proposes a ``Finish``), so every rank
        leaves at the same boundary and none is left in a collective. The hold is a boundary of
        its own (``control.arrive``): what is agreed while the ranks hold takes effect there.
        """
        p = self.probe
        p.flush()
        limit = float(getattr(p.transport, "hold_at_end_s", 0))
        started, beat, last = time.monotonic(), 0.0, p.step_count
        p.log.info("holding at the last step for the supervisor", step=last, limit_s=limit)
        self.frozen = True  # acknowledgements go out as control messages: there is no step to carry them
        self.holding, self.finished = True, False
        self.control.arrive()
        try:
            while True:
                if time.monotonic() - beat >= HOLD_BEAT_S:
                    p.transport.send([self._control_message([f"{END_REACHED}:{last}"])])
                    beat = time.monotonic()
                timeout: list[Directive] = []
                if self.control.rank == 0 and time.monotonic() - started > limit:
                    timeout = [Finish(reason=f"held {limit:g}s at the last step", id=f"hold-timeout-{last}")]
                self._offer(timeout, parked=True)
                ds = self.control.due(p.settings.freeze_poll_s)
                for i, d in enumerate(ds):
                    if isinstance(d, Finish | Stop):
                        self._ack(ack_event(d))
                        return False
                    if isinstance(d, Freeze):
                        self._handle_batch(ds[i:])
                    else:
                        self.handle(d)
                    if self.finished or self.stopped:  # received while parked in a freeze here
                        return False
                    if p.step_count != last:  # rolled back: train again, from this boundary
                        while more := self.control.depart():
                            self._handle_batch(more)
                        return True
                    if isinstance(d, Freeze):
                        break
        finally:
            self.frozen = self.holding = False

    def _stop(self, d: Stop) -> None:
        self.stopped = True

    def _finish(self, d: Finish) -> None:
        # Meaningful only while the ranks hold at the last step; one that reaches them parked in a
        # freeze there (an incident at the last steps) ends the freeze and the hold with it.
        self.finished = self.holding

    def _apply(self, d: ApplyOverrides) -> None:
        p = self.probe
        if d.lr_scale is not None:
            self.lr_scale = float(d.lr_scale)
            p.event("lr_override")
        if d.warmup_steps is not None:
            self.warmup_steps, self.warmup_from = int(d.warmup_steps), p.step_count
            p.event("lr_override")
        if d.grad_clip is not None:
            self.grad_clip = float(d.grad_clip)
            p.event("grad_clip_override")
        if d.exclusions or d.skip_batches:
            if p.loader is None:
                raise SupervisorError("exclusions and skips need the supervised loader", field="apply")
            p.loader.exclude(d.exclusions)
            p.loader.skip(d.skip_batches)
            p.event("data_override")

    def _replay(self, d: Replay) -> None:
        from supervisor.sdk.replay import replay_on_ranks

        self.finish_saves()  # the replay borrows the live model; a save in flight must not see it
        replay_on_ranks(self.probe, d)

    def _rollback(self, d: RollbackInPlace) -> None:
        p = self.probe
        before = p.step_count
        self.restore(d.step)
        if p.loader is not None and d.exclusions:
            p.loader.exclude(d.exclusions)
        p.next_events.append(f"rolled_back:{before}:{d.step}")
        hooks.notify_rollback(before, d.step)  # the user's logger, before training resumes

    def restore(self, step: int) -> None:
        """Load every piece of training state from checkpoint ``step`` into the live objects."""
        from supervisor.checkpoint.store import RESTORE_CHECK_FAILED
        from supervisor.checkpoint.training_state import load_training_state
        from supervisor.checkpoint.verify import RestoreCheckError

        p = self.probe
        if p.checkpoint is None:
            raise SupervisorError(
                "restoring needs a checkpoint store (sdk.init(checkpoint=...))", field="rollback"
            )
        p.flush()
        self.finish_saves()  # a save in flight commits first: it is then part of the abandoned timeline
        try:
            loaded = load_training_state(
                p.checkpoint, step, rank=p.rank, world_size=p.world_size, model=p.model,
                optimizer=p.optimizer, scheduler=p.scheduler, scaler=p.scaler, expect=_geometry(p.loader),
            )  # fmt: skip
        except RestoreCheckError as exc:
            # It passed verification, so only this check can keep it from being loaded again: a
            # quarantined checkpoint is never a rollback or restart target, and `latest` leaves it.
            # The live state is now partly the forged one; the supervisor's next rollback replaces it.
            p.checkpoint.quarantine(step, f"{RESTORE_CHECK_FAILED} on rank {p.rank}: {exc.one_line()}")
            raise
        if p.loader is not None and loaded.data_state is not None:
            p.loader.load_state_dict(loaded.data_state)
        self.load_state_dict((loaded.extra or {}).get("probe", {}))
        p.step_count = self.last_saved = step
        p.sampler.reset()
        p.next_events.append("resumed")
        p.next_events += [f"resume_incomplete:{c}" for c in loaded.incomplete]  # a fact, for any optimizer
        if loaded.shard_checksum is not None:  # checked equal to this rank's saved state
            p.next_events.append(f"shard_restored:{step}:{loaded.shard_checksum}")
        if loaded.report:
            p.log.warning("resume check", step=step, differences=loaded.report)

    # -- checkpoints ---------------------------------------------------------------------------
    def save(self, mark: HealthMark, *, blocking: bool = True) -> None:
        """Save this step (every rank). A save still in flight finishes first (at most one per job).
        An asynchronous one returns at once: parameters and optimizer state are copied to host
        memory during the next forward and backward, and that step's optimizer step waits for it."""
        from supervisor.checkpoint.saver import Checkpointer

        p = self.probe
        if p.checkpoint is None:
            raise SupervisorError(
                "no checkpoint store to save to (sdk.init(checkpoint=...))", field="snapshot"
            )
        if self.saver is None:
            self.saver = Checkpointer(p.checkpoint, rank=p.rank, world_size=p.world_size)
        self._report(self.saver.wait())
        loader = p.loader
        last = (p.pending.record if p.pending is not None else {}) or {}
        handle = self.saver.save(
            p.step_count, model=p.model, optimizer=p.optimizer, scheduler=p.scheduler, scaler=p.scaler,
            data_state=loader.state_dict() if loader is not None else None,
            extra={"probe": self.state_dict(), **_geometry(loader)},
            metrics={k: last.get(k) for k in ("loss", "grad_norm")}, mark=mark, blocking=blocking,
        )  # fmt: skip
        self.last_saved = p.step_count
        if blocking:
            self._report(handle, raise_failure=True)

    def finish_saves(self) -> None:
        """Wait for the save in flight, if any, and report it."""
        if self.saver is not None:
            self._report(self.saver.wait())

    def close(self) -> None:
        self.finish_saves()
        if self.saver is not None:
            self.saver.close()
        self.control.close()

    def _report(self, handle: SaveHandle | None, *, raise_failure: bool = False) -> None:
        """``checkpoint_saved`` / ``snapshot_saved`` in the record of the saved step, or with the step
        (``checkpoint_saved:<step>``) in a later one; ``checkpoint_failed:<step>`` if it failed."""
        if handle is None:
            return
        p = self.probe
        event = "snapshot_saved" if handle.mark == HealthMark.DIAGNOSTIC else "checkpoint_saved"
        try:
            handle.result()
        except SupervisorError as exc:
            p.log.error("checkpoint save failed", step=handle.step, error=exc.one_line())
            self._emit(f"checkpoint_failed:{handle.step}")
            if raise_failure:
                raise
            return
        self._emit(
            event if handle.step == p.step_count and p.pending is not None else f"{event}:{handle.step}"
        )

    def _emit(self, event: str) -> None:
        p = self.probe
        if p.pending is None:  # no step to carry it (ended, or nothing trained yet): a control message
            p.transport.send([self._control_message([event])])
        else:
            p.event(event)

    # -- overrides -----------------------------------------------------------------------------
    def lr_multiplier(self, step: int) -> float:
        mult = self.lr_scale
        if self.warmup_steps:
            mult *= min(1.0, (step - self.warmup_from) / self.warmup_steps)
        return mult

    @contextmanager
    def lr_override(self, step: int) -> Iterator[None]:
        """Scale the LRs around ``optimizer.step`` only, so the scheduler never sees the override."""
        mult = self.lr_multiplier(step)
        groups = self.probe.optimizer.param_groups
        saved = [g["lr"] for g in groups]
        if mult != 1.0:
            for g in groups:
                g["lr"] = g["lr"] * mult
        try:
            yield
        finally:
            for g, lr in zip(groups, saved, strict=True):
                g["lr"] = lr

    def state_dict(self) -> dict[str, Any]:
        return {"lr_scale": self.lr_scale, "warmup_steps": self.warmup_steps, "warmup_from": self.warmup_from,
                "grad_clip": self.grad_clip}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.warmup_steps = state.get("warmup_steps")
        self.warmup_from = int(state.get("warmup_from", 0))
        self.grad_clip = state.get("grad_clip")


def _guard_for(probe: Any) -> Guard | None:
    """The guard, when it is on and a supervisor is at the other end of the transport."""
    s = probe.settings
    transport = probe.transport  # the one that talks to the supervisor (a drill may wrap it later)
    if not getattr(s, "guard", False) or getattr(transport, "supervisor_answers", None) is None:
        return None
    return Guard(lambda: transport.supervisor_answers, after_steps=s.guard_after_steps,
                 after_s=s.guard_after_s, z=s.guard_z, hold_s=s.guard_hold_s)  # fmt: skip


def _geometry(loader: Any) -> dict[str, Any]:
    if loader is None or not hasattr(loader, "batch_size"):
        return {}
    return {"micro_batch_size": loader.batch_size, "global_batch_size": loader.batch_size * loader.world_size}

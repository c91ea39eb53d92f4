"""The probe: per-rank telemetry of every step, and directives applied at step boundaries.

    probe = sdk.init(model, optimizer, scheduler=sched, loader=loader, loss_fn=lm_loss)
    for batch in loader:                       # the boundary runs inside the loader
        with probe.step(batch) as s:
            s.backward(lm_loss(model, batch))
            s.optimizer_step()
    probe.close()

Directive handling lives in ``supervisor.sdk.steering``; the step itself in
``supervisor.sdk.step``; the device-side metrics in ``supervisor.sdk.metrics``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from supervisor.errors import SupervisorError
from supervisor.logging import get_logger
from supervisor.sdk.control import control_channel
from supervisor.sdk.losses import StepLoss
from supervisor.sdk.metrics import (
    NormSampler,
    Pack,
    exact_param_norm,
    fingerprint,
    fingerprint_parts,
    grad_norm,
    is_sharded,
)
from supervisor.sdk.nonfinite import localize_nonfinite, unwrap
from supervisor.sdk.settings import ProbeSettings
from supervisor.sdk.steering import Steering
from supervisor.sdk.step import Pending, StepScope, UserStep, loss_fields
from supervisor.sdk.transport import Transport

LossFn = Callable[[nn.Module, Any], StepLoss]


class Probe:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        transport: Transport,
        scheduler: Any = None,
        scaler: Any = None,
        loader: Any = None,
        loss_fn: LossFn | None = None,
        canary_batch: Any = None,
        checkpoint: Any = None,
        rank: int = 0,
        world_size: int = 1,
        settings: ProbeSettings | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler, self.scaler = model, optimizer, scheduler, scaler
        if scaler is not None and not scaler.is_enabled():
            self.scaler = None  # a disabled GradScaler is a no-op: treat the run as full precision
        self.loader, self.loss_fn, self.transport, self.checkpoint = loader, loss_fn, transport, checkpoint
        self.rank, self.world_size = rank, world_size
        self.settings = settings or ProbeSettings()
        self.step_count = 0
        """Optimizer steps completed (the ``step`` of the last record)."""
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.sampler = NormSampler(self.params, self.settings.sample_stride, self.settings.exact_below)
        self.sharded = is_sharded(self.params)
        """FSDP2 / DTensor parameters: norms are all-reduced, the fingerprint is per shard."""
        self.canary_batch = canary_batch
        self.log = get_logger("supervisor.sdk", rank=rank)
        self.pending: Pending | None = None
        self.next_events: list[str] = []
        self.steering = Steering(self, control_channel(rank, world_size))
        if loader is not None and hasattr(loader, "boundary"):
            loader.boundary = self.boundary
        self.user_step: UserStep | None = None
        """Set by ``watch_optimizer``: the user's loop owns the optimizer step (``sdk.watch``)."""

    # -- the user loop -------------------------------------------------------------------------
    def step(self, batch: Any, *, micro_batches: int | None = None) -> StepScope:
        """One optimizer step; ``micro_batches=N``: N ``s.backward`` calls accumulate into it."""
        if self.user_step is not None:
            raise SupervisorError("this probe watches the user's own optimizer step: call probe.record(...)")
        if self.should_stop:
            raise SupervisorError("training was stopped (Stop directive or max_steps): end the loop")
        return StepScope(self, batch, micro_batches)

    def proceed(self) -> bool:
        """The step boundary for a loop without a ``SupervisedLoader``: ``if not probe.proceed(): break``."""
        try:
            self.boundary()
        except StopIteration:
            return False
        return True

    def boundary(self) -> None:
        """Between two steps, identically on every rank: directives, periodic checkpoint, stop."""
        self.steering.boundary()

    @property
    def should_stop(self) -> bool:
        return self.steering.stopped

    def close(self) -> None:
        self.steering.close()  # a checkpoint save still in flight commits (and is reported) first
        self.flush()
        self.transport.close()

    # -- a loop that owns its optimizer step (sdk.watch) ----------------------------------------
    def watch_optimizer(self) -> None:
        """Hook the optimizer: the step's LR / clip overrides and its grad norm, around the user's
        own ``optimizer.step()``; the step is then reported with ``record``."""
        if self.user_step is None:
            self.user_step = UserStep(self)

    def record(
        self,
        loss: Any = None,
        *,
        loss_sum: Any = None,
        tokens: Any = None,
        grad_norm: Any = None,
        batch: Any = None,
    ) -> None:
        """Report the optimizer step that just ran in the user's loop (one device->host sync).

        ``loss``: the step's mean loss (token-weighted when ``tokens`` is given), or ``loss_sum``
        and ``tokens``; ``grad_norm``: what the user's ``clip_grad_norm_`` returned (else the
        norm the probe measured just before ``optimizer.step()``, after any clipping).
        """
        if self.user_step is None:
            raise SupervisorError("probe.record() needs sdk.watch(...) (the probe owns this loop's step)")
        self.user_step.record(loss, loss_sum, tokens, grad_norm, batch)

    def localize_nonfinite(self, run: Callable[[nn.Module], torch.Tensor]) -> str | None:
        """Replay ``run(module) -> loss`` with checks armed; names where NaN/Inf first appeared."""
        return localize_nonfinite(self.model, run)

    # -- the step ------------------------------------------------------------------------------
    def _optimizer_step(self, scope: StepScope) -> torch.Tensor:
        """The order and why: ``supervisor.sdk.step``'s docstring. No host read of this step's values."""
        s = self.settings
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        scope.rescale_accumulated(self.params)
        clip = self.steering.grad_clip if self.steering.grad_clip is not None else s.grad_clip
        gn = grad_norm(self.params, clip)
        pack = Pack()
        pack.add("grad_norm", gn)
        names = scope.pack_loss(pack)
        if self.scaler is not None:
            pack.add("scale", self.scaler._scale, snapshot=True)  # scaler.update() changes it in place
            found = self.scaler._per_optimizer_states[id(self.optimizer)].get("found_inf_per_device", {})
            bad = torch.stack(list(found.values())).sum() > 0 if found else None
            pack.add("found_inf", bad)
        else:  # NaN/Inf anywhere in the gradients makes their norm non-finite: two scalar checks
            bad = ~(torch.isfinite(scope.loss().loss_sum) & torch.isfinite(gn))
        self._send_pending(scope.started)  # the previous step's copy, launched a step ago
        rec = self._record_head(names, scope)
        self._baseline()
        applied = self._apply_update(bad, rec, scope)
        self.step_count += 1
        rec["step"] = self.step_count
        self._pack_state(pack)
        finish = lambda r, vals: self._finish(r, vals, names, scope)  # noqa: E731
        self.pending = Pending(rec, scope.started, 0.0, None, self.next_events, pack.start(), finish)
        self.next_events = []
        return applied

    def _record_head(self, names: list[str], scope: StepScope) -> dict[str, Any]:
        """The record's fields the host already knows (the rest arrive with the pack)."""
        rec: dict[str, Any] = {"step": self.step_count + 1, "rank": self.rank, "world_size": self.world_size}
        rec["time"] = time.time()
        rec["lr"] = float(self.optimizer.param_groups[0]["lr"]) * self.steering.lr_multiplier(
            self.step_count + 1
        )
        return rec

    def _finish(
        self, rec: dict[str, Any], vals: dict[str, list[float]], names: list[str], scope: StepScope
    ) -> None:
        """Complete a record from its host copy (at the next step, or at a boundary that flushes)."""
        head = dict(rec)
        rec.clear()
        rec.update({k: head[k] for k in ("step", "rank", "world_size", "time")})
        rec.update(loss_fields(vals, names, scope.meta_batch(), self.settings.max_samples))
        self._loader_ids(rec, scope.batch)
        if "mb_loss_sum" in vals:
            rec.setdefault("attrs", {})["micro_batches"] = scope.micro_fields(vals, self.settings.max_samples)
        rec["grad_norm"] = vals["grad_norm"][0]
        rec["lr"] = head["lr"]
        if "scale" in vals:
            rec["loss_scale"] = vals["scale"][0]
            rec["overflow"] = bool(vals.get("found_inf", [0.0])[0] > 0)
        grads_bad = not math.isfinite(rec["grad_norm"]) and self.scaler is None
        rec["nonfinite"] = not math.isfinite(rec["loss_sum"]) or grads_bad
        if "nonfinite_at" in head:
            rec["nonfinite_at"] = head["nonfinite_at"]
        elif rec["nonfinite"]:
            self._localize(rec, scope)
        if rec["nonfinite"] and self.settings.skip_nonfinite_step and self.scaler is None:
            rec.setdefault("events", []).append("step_skipped_nonfinite")
        self._state_fields(rec, vals)

    def _localize(self, rec: dict[str, Any], scope: StepScope) -> None:
        """Replay the step's batch with checks armed. Run before any later update: a skipped step left
        the parameters as they were, so the replay sees the state that failed."""
        if not self.settings.localize_nonfinite or self.loss_fn is None:
            return
        fn = self.loss_fn
        batches = [scope.batch] if scope.batch is not None else [b for b in scope._batches if b is not None]
        found = None
        for batch in batches:

            def run(m: nn.Module, b: Any = batch) -> torch.Tensor:
                return fn(m, b).loss

            found = localize_nonfinite(self.model, run, sharded=self.sharded)
            if found:
                break
        rec["nonfinite_at"] = found or "unknown"

    def _loader_ids(self, rec: dict[str, Any], batch: Any) -> None:
        """A tuple / list / tensor batch carries no IDs itself: the loader that yielded it knows them."""
        if "samples" in rec or not hasattr(self.loader, "batch_meta"):
            return
        meta = self.loader.batch_meta(batch)
        if meta is not None:
            rec["samples"] = list(meta.sample_ids[: self.settings.max_samples])
            rec.setdefault("attrs", {})["batch"] = int(meta.batch_index)

    def _apply_update(self, bad: torch.Tensor | None, rec: dict[str, Any], scope: StepScope) -> torch.Tensor:
        """The optimizer step, skipped on the device when ``bad``; returns the device flag "applied"."""
        skip = self.settings.skip_nonfinite_step and self.scaler is None
        fused = bool(getattr(self.optimizer, "_step_supports_amp_scaling", False))
        applied = ~bad if bad is not None else torch.ones((), dtype=torch.bool)
        with self.steering.lr_override(self.step_count + 1):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)  # a fused optimizer skips on the device; else torch reads
            elif skip and fused and bad is not None:
                self.optimizer.found_inf = bad.float()  # type: ignore[attr-defined]  # as GradScaler does
                self.optimizer.grad_scale = None  # type: ignore[attr-defined]
                try:
                    self.optimizer.step()
                finally:
                    del self.optimizer.found_inf, self.optimizer.grad_scale  # type: ignore[attr-defined]
            elif bad is not None and (skip or self.settings.localize_nonfinite):
                # This optimizer cannot skip on the device: the one host read of the step (its flag).
                if bool(bad):
                    if self.settings.localize_nonfinite:
                        self._localize(rec, scope)  # before the update, which may write NaN into the state
                    if not skip:
                        self.optimizer.step()
                else:
                    self.optimizer.step()
            else:
                self.optimizer.step()
        if self.scaler is not None:
            self.scaler.update()
        if self.scheduler is not None:
            with warnings.catch_warnings():  # a skipped step still advances the schedule, like AMP's skips
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
                self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return applied

    # -- state metrics of this step, measured after its update -----------------------------------
    def _pack_state(self, pack: Pack) -> None:
        s = self.settings
        if s.norms:
            param_sq, update_sq = self.sampler.measure()
            if self.sharded:  # shards -> global: one tiny all-reduce, enqueued without a host sync
                both = torch.stack(
                    [param_sq, update_sq if update_sq is not None else torch.zeros_like(param_sq)]
                )
                dist.all_reduce(both)
                param_sq, update_sq = both[0], (both[1] if update_sq is not None else None)
            pack.add("param_sq", param_sq)
            pack.add("update_sq", update_sq)
        if s.fingerprint_every and self.step_count % s.fingerprint_every == 0:
            pack.add("fingerprint", fingerprint_parts(self.params))
        pack.add("canary", self._canary())

    def _baseline(self) -> None:
        """The update-norm sample before a step's update, when none is kept (first step, rollback)."""
        if self.settings.norms and not self.sampler.has_baseline:
            self.sampler.measure()  # every rank at the same step (first step, or after a rollback)

    def _state_fields(self, rec: dict[str, Any], vals: dict[str, list[float]]) -> None:
        if "param_sq" in vals:
            rec["param_norm"] = math.sqrt(vals["param_sq"][0])
        if "update_sq" in vals:
            rec["update_norm"] = math.sqrt(vals["update_sq"][0])
        attrs = rec.setdefault("attrs", {})
        if "fingerprint" in vals and self.sharded:
            attrs["shard_checksum"] = fingerprint(vals["fingerprint"])  # shards differ by design
        elif "fingerprint" in vals:
            rec["param_checksum"] = fingerprint(vals["fingerprint"])
            attrs["param_norm_exact"] = exact_param_norm(vals["fingerprint"])
        if "canary" in vals:
            attrs["canary_loss"] = vals["canary"][0]

    def _send_pending(self, now_started: float | None) -> None:
        """Send the last step's record (its values read from the host copy) with the boundary's events."""
        p = self.pending
        if p is None:
            return
        rec = p.record
        self.pending = None
        attrs = rec.setdefault("attrs", {})
        dropped = int(
            getattr(getattr(self.transport, "stats", None), "dropped", getattr(self.transport, "dropped", 0))
        )
        if dropped:
            attrs["dropped_records"] = dropped
        if not attrs:
            del rec["attrs"]
        rec["step_time"] = (now_started or time.monotonic()) - p.started
        if rec["step_time"] > 0 and p.tokens:
            rec["tokens_per_s"] = p.tokens / rec["step_time"]
        events = rec.get("events", []) + p.events
        if events:
            rec["events"] = events
        self.transport.send([rec])

    def flush(self) -> None:
        """Emit the pending record now (its copy is awaited: used at boundaries that act, and at close)."""
        if self.user_step is not None:
            self.user_step.flush()
            return
        self._send_pending(None)

    def event(self, name: str) -> None:
        """An event of the step just finished (or of the next one if none is pending)."""
        (self.pending.events if self.pending is not None else self.next_events).append(name)

    def _canary(self) -> torch.Tensor | None:
        """The canary batch's loss after this step's update, every ``canary_every`` steps."""
        every = self.settings.canary_every
        if not every or self.loss_fn is None or self.canary_batch is None or self.step_count % every:
            return None
        module = unwrap(self.model)
        was_training = module.training
        module.eval()
        try:
            with torch.no_grad():
                return self.loss_fn(module, self.canary_batch).loss.detach()
        finally:
            module.train(was_training)

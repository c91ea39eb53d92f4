"""One training step under the probe: report the loss, backward, optimizer step, one sync.

``StepScope`` is what ``probe.step(batch)`` yields. The optimizer step runs in this order,
because each metric is exact only at one point:

1. ``scaler.unscale_`` (AMP), then the global grad norm **before** clipping, then clipping;
2. the previous step's state metrics (‖θ‖, ‖Δθ‖ sample, fingerprint, canary) are queued;
3. everything goes to the host in **one** packed copy (the step's only sync);
4. a non-finite step is localized (replay with hooks) and, without a scaler, skipped;
5. ``optimizer.step`` under the LR overrides, ``scaler.update``, ``scheduler.step``, zero grads.

The record of step ``s`` leaves at the sync of step ``s + 1`` (or at the next boundary that
flushes): its update norm can only be measured after its optimizer step, and waiting one
step costs no extra sync.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch

from supervisor.errors import SupervisorError
from supervisor.sdk.losses import StepLoss
from supervisor.sdk.metrics import Pack

if TYPE_CHECKING:
    from supervisor.sdk.probe import Probe


@dataclass
class Pending:
    """A record waiting for the state metrics that only the next step can measure."""

    record: dict[str, Any]
    started: float
    tokens: float
    canary: torch.Tensor | None = None
    events: list[str] = field(default_factory=list)


class StepScope:
    def __init__(self, probe: Probe, batch: Any) -> None:
        self.probe = probe
        self.batch = batch
        self.started = time.monotonic()
        self.stepped = False
        self._parts: list[StepLoss] = []

    def __enter__(self) -> StepScope:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None and not self.stepped:
            raise SupervisorError(
                "the step ended without s.optimizer_step(): the probe owns the optimizer step"
            )

    def report(self, out: StepLoss) -> None:
        """Add this (micro-)batch's loss sums to the step's record (no sync)."""
        self._parts.append(out)

    def backward(self, out: StepLoss) -> None:
        """``report(out)`` then backward of the token-weighted loss, scaled when a GradScaler is used."""
        self.report(out)
        loss = out.loss
        scaler = self.probe.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def optimizer_step(self) -> bool:
        """Measure, clip, step; returns False when the step was skipped (non-finite or AMP overflow)."""
        if self.stepped:
            raise SupervisorError("optimizer_step() called twice in one step")
        self.stepped = True
        return self.probe._optimizer_step(self)

    # -- packing -------------------------------------------------------------------------------
    def loss(self) -> StepLoss:
        if not self._parts:
            raise SupervisorError("no loss reported in this step: call s.backward(out) or s.report(out)")
        if len(self._parts) == 1:
            return self._parts[0]
        cat = lambda xs: None if any(x is None for x in xs) else torch.cat([x.reshape(-1) for x in xs])  # noqa: E731
        return StepLoss(
            torch.stack([p.loss_sum for p in self._parts]).sum(),
            torch.stack([p.tokens for p in self._parts]).sum(),
            cat([p.sample_loss_sum for p in self._parts]),
            cat([p.sample_tokens for p in self._parts]),
        )

    def pack_loss(self, pack: Pack) -> list[str]:
        """Queue the loss quantities; returns the source names in index order."""
        out = self.loss()
        pack.add("loss_sum", out.loss_sum)
        pack.add("tokens", out.tokens)
        if out.sample_loss_sum is None or out.sample_tokens is None:
            return []
        pack.add("sample_loss_sum", out.sample_loss_sum)
        pack.add("sample_tokens", out.sample_tokens)
        sources = self.batch.get("sources") if isinstance(self.batch, dict) else None
        if not sources or len(sources) != out.sample_loss_sum.numel():
            return []
        names = sorted(set(sources))
        idx = _to_device(torch.tensor([names.index(s) for s in sources]), out.sample_loss_sum.device)
        zeros = torch.zeros(len(names), dtype=torch.float64, device=idx.device)
        pack.add("src_loss", zeros.index_add(0, idx, out.sample_loss_sum.detach().double()))
        pack.add("src_tokens", zeros.index_add(0, idx, out.sample_tokens.double()))
        return names


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without a stream sync: a pageable copy to CUDA would wait for queued work."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def loss_fields(
    vals: dict[str, list[float]], names: list[str], batch: Any, max_samples: int
) -> dict[str, Any]:
    """The loss / data part of a record from the host copy of the pack."""
    loss_sum, tokens = vals["loss_sum"][0], vals["tokens"][0]
    rec: dict[str, Any] = {
        "loss": loss_sum / tokens if tokens > 0 else math.nan,
        "loss_sum": loss_sum,
        "tokens": int(tokens),
    }
    if "sample_loss_sum" in vals:
        means = [s / t for s, t in zip(vals["sample_loss_sum"], vals["sample_tokens"], strict=True) if t > 0]
        if means:
            rec["batch_mean_loss"] = sum(means) / len(means)
    if names:
        rec["sources"] = {
            n: {"tokens": int(t), "loss_sum": s}
            for n, s, t in zip(names, vals["src_loss"], vals["src_tokens"], strict=True)
        }
    if isinstance(batch, dict):
        if batch.get("sample_ids"):
            rec["samples"] = list(batch["sample_ids"][:max_samples])
        if "batch_index" in batch:
            rec["attrs"] = {"batch": int(batch["batch_index"])}
    lengths = batch.get("lengths") if isinstance(batch, dict) else None
    lengths = lengths or [int(t) for t in vals.get("sample_tokens", [])]
    if lengths:
        rec["seq_len_max"] = int(max(lengths))
        rec["seq_len_mean"] = sum(lengths) / len(lengths)
    return rec


class UserStep:
    """A step the user's loop owns: ``clip_grad_norm_``, ``optimizer.step()`` and the scheduler are theirs.

    Optimizer step hooks do what ``s.optimizer_step()`` does around the user's call: the
    steering's LR multiplier (scaled before, restored after, so the scheduler never sees it),
    the steering's grad-clip override, and a grad norm measured just before the step (used
    when the user does not pass the one their clip returned). ``record`` then measures the
    update of that step (sampled ‖Δθ‖, ‖θ‖), packs it with the loss and sends the record.
    """

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.optimizer = probe.optimizer
        self.grad_norm: torch.Tensor | None = None
        self.lr: float | None = None
        self.stepped = 0
        self._saved: list[float] = []
        self._around: list[tuple[Any, Any]] = []
        self._last = time.monotonic()
        self._handles = [
            self.optimizer.register_step_pre_hook(self._pre),
            self.optimizer.register_step_post_hook(self._post),
        ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def wrap(self, pre: Any, post: Any) -> None:
        """Run ``pre(step, optimizer)`` before this step's measurements and ``post(step, optimizer)``
        after its LR restore (nested: outer hooks see the LRs they set; drills use it)."""
        self._around.append((pre, post))

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        from supervisor.sdk.metrics import grad_norm

        p = self.probe
        for pre, _ in self._around:
            pre(p.step_count + 1, opt)
        step = p.step_count + 1
        # Clips only under an override, or when the probe was given grad_clip= (an adapter that
        # takes over the framework's clipping to see the norm before it).
        clip = p.steering.grad_clip if p.steering.grad_clip is not None else p.settings.grad_clip
        self.grad_norm = grad_norm(p.params, clip)
        mult = p.steering.lr_multiplier(step)
        self._saved = [g["lr"] for g in opt.param_groups]
        if mult != 1.0:
            for g in opt.param_groups:
                g["lr"] = g["lr"] * mult
        self.lr = float(opt.param_groups[0]["lr"])
        self.stepped += 1

    def _post(self, opt: Any, args: Any, kwargs: Any) -> None:
        for g, lr in zip(opt.param_groups, self._saved, strict=False):
            g["lr"] = lr
        for _, post in reversed(self._around):
            post(self.probe.step_count + 1, opt)

    def record(self, loss: Any, loss_sum: Any, tokens: Any, grad_norm: Any, batch: Any) -> None:
        from supervisor.sdk.metrics import fingerprint, fingerprint_parts

        p = self.probe
        if loss_sum is None and loss is None:
            raise SupervisorError("probe.record() needs the step's loss (or loss_sum and tokens)")
        pack = Pack()
        if loss_sum is None:
            loss_sum = _detached(loss) * (_detached(tokens) if tokens is not None else 1.0)
        pack.add("loss_sum", _detached(loss_sum))
        if tokens is not None:
            pack.add("tokens", _detached(tokens))
        gn = grad_norm if grad_norm is not None else self.grad_norm
        if gn is not None:
            pack.add("grad_norm", _detached(gn))
        if p.settings.norms:
            param_sq, update_sq = p.sampler.measure()
            if p.sharded:
                both = torch.stack(
                    [param_sq, update_sq if update_sq is not None else torch.zeros_like(param_sq)]
                )
                torch.distributed.all_reduce(both)
                param_sq, update_sq = both[0], (both[1] if update_sq is not None else None)
            pack.add("param_sq", param_sq)
            pack.add("update_sq", update_sq)
        step = p.step_count + 1
        every = p.settings.fingerprint_every
        if every and step % every == 0:
            pack.add("fingerprint", fingerprint_parts(p.params))
        vals = pack.fetch()  # the one device->host sync of this step
        rec: dict[str, Any] = {"step": step, "rank": p.rank, "world_size": p.world_size, "time": time.time()}
        n = vals["tokens"][0] if "tokens" in vals else None
        rec["loss"] = vals["loss_sum"][0] / n if n else vals["loss_sum"][0]
        if n is not None:
            rec["loss_sum"], rec["tokens"] = vals["loss_sum"][0], int(n)
        if "grad_norm" in vals:
            rec["grad_norm"] = vals["grad_norm"][0]
        lr = self.lr if self.stepped else float(self.optimizer.param_groups[0]["lr"])
        rec["lr"] = lr
        if "param_sq" in vals:
            rec["param_norm"] = math.sqrt(vals["param_sq"][0])
        if "update_sq" in vals:
            rec["update_norm"] = math.sqrt(vals["update_sq"][0])
        if "fingerprint" in vals and not p.sharded:
            rec["param_checksum"] = fingerprint(vals["fingerprint"])
        rec["nonfinite"] = not all(math.isfinite(rec.get(k, 0.0)) for k in ("loss", "grad_norm"))
        if not self.stepped:
            rec.setdefault("events", []).append("optimizer_step_not_seen")
        now = time.monotonic()
        rec["step_time"], self._last = now - self._last, now
        if n and rec["step_time"] > 0:
            rec["tokens_per_s"] = n / rec["step_time"]
        if isinstance(batch, dict) and batch.get("sample_ids"):
            rec["samples"] = list(batch["sample_ids"][: p.settings.max_samples])
            if batch.get("batch_index") is not None:  # a SupervisedLoader's global batch (exclude_batches)
                rec["attrs"] = {"batch": int(batch["batch_index"])}
        else:
            p._loader_ids(rec, batch)  # a tuple / tensor batch: the loader that yielded it knows its IDs
        self.stepped = 0
        self.flush()
        # Held until the boundary after this step: events of that boundary (checkpoint saved,
        # directive acknowledged) belong to this step's record, as in the probe-owned step.
        p.pending = Pending(rec, 0.0, 0.0, None, p.next_events)
        p.next_events = []
        p.step_count = step

    def flush(self) -> None:
        """Send the held record as it is (its metrics were all measured in ``record``)."""
        p = self.probe
        pending, p.pending = p.pending, None
        if pending is None:
            return
        rec = pending.record
        events = rec.get("events", []) + pending.events
        if events:
            rec["events"] = events
        p.transport.send([rec])


def _detached(x: Any) -> torch.Tensor:
    return (
        x.detach().reshape(()).double()
        if isinstance(x, torch.Tensor)
        else torch.tensor(float(x), dtype=torch.float64)
    )

"""One training step under the probe: report the loss, backward, optimizer step, no host sync.

``StepScope`` is what ``probe.step(batch)`` yields. The optimizer step runs in this order,
because each metric is exact only at one point:

1. ``scaler.unscale_`` (AMP); with several micro-batches, the accumulated gradient is scaled
   to the token-weighted mean of the whole step; the global grad norm **before** clipping,
   then clipping; the non-finite flag, on the device;
2. the previous step's record is read from the host copy launched one step ago (long done by
   now: no wait), localized if it was non-finite, and sent;
3. ``optimizer.step`` under the LR overrides — a non-finite step is skipped on the device
   (``found_inf`` of a fused optimizer, or the GradScaler's own path) — ``scaler.update``,
   ``scheduler.step``, zero grads;
4. this step's state metrics (‖θ‖, ‖Δθ‖ sample, fingerprint, canary) are queued after the
   update, and every scalar of the step goes to the host in **one** non-blocking copy
   (``metrics.Pack.start``: pinned memory and an event on CUDA).

The record of step ``s`` leaves during step ``s + 1`` (or at the next boundary that flushes),
when its copy has long arrived: the host never waits for the device inside a step. The only
exception is an optimizer that cannot skip a step on the device (not fused) while
``skip_nonfinite_step`` is on: the probe then reads the one non-finite flag before the update,
as ``GradScaler`` does for such optimizers.

Gradient accumulation: ``s.backward(out)`` once per micro-batch. Each backward uses
``loss_sum / c`` (``c``: the first micro-batch's tokens), so gradients keep their usual size;
the optimizer step then multiplies the sum by ``c / total tokens`` — the gradient of the
token-weighted mean loss of the whole step, whatever the micro-batch sizes. With several
ranks, declare it (``probe.step(batch, micro_batches=N)``): ``c`` and the total are then
all-reduced, so every replica scales alike (the step's global token-weighted mean).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from supervisor.errors import SupervisorError
from supervisor.sdk.losses import StepLoss
from supervisor.sdk.metrics import Inflight, Pack, local

if TYPE_CHECKING:
    from supervisor.sdk.probe import Probe


class Pending:
    """The record of the last step, until it is sent: its values arrive on the host with ``inflight``.

    ``record`` reads them on first access (``finish(record, values)`` completes it); a step
    later the copy is done, so that read does not wait.
    """

    def __init__(
        self,
        record: dict[str, Any],
        started: float,
        tokens: float,
        canary: torch.Tensor | None = None,
        events: list[str] | None = None,
        inflight: Inflight | None = None,
        finish: Callable[[dict[str, Any], dict[str, list[float]]], None] | None = None,
    ) -> None:
        self._record, self.started, self.tokens, self.canary = record, started, tokens, canary
        self.events = events if events is not None else []
        self._inflight, self._finish = inflight, finish

    @property
    def record(self) -> dict[str, Any]:
        if self._inflight is not None:
            inflight, self._inflight = self._inflight, None
            if self._finish is not None:
                self._finish(self._record, inflight.values())
            self.tokens = float(self._record.get("tokens") or 0)
        return self._record


class StepScope:
    def __init__(self, probe: Probe, batch: Any, micro_batches: int | None = None) -> None:
        if micro_batches is not None and micro_batches < 1:
            raise SupervisorError(f"probe.step(micro_batches={micro_batches}): must be >= 1")
        self.probe = probe
        self.batch = batch
        self.declared = micro_batches
        self.started = time.monotonic()
        self.stepped = False
        self._parts: list[StepLoss] = []
        self._batches: list[Any] = []
        self._current: Any = None
        self._backwards = 0
        self._c: torch.Tensor | None = None
        self._shared = False  # c was all-reduced (declared accumulation over several ranks)
        self._loss: StepLoss | None = None

    def __enter__(self) -> StepScope:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None and not self.stepped:
            raise SupervisorError(
                "the step ended without s.optimizer_step(): the probe owns the optimizer step"
            )

    def micro_batches(self) -> Iterator[Any]:
        """The step's batch in ``micro_batches`` slices (tensors, sample IDs and sources alike)."""
        if self.declared is None:
            raise SupervisorError("s.micro_batches() needs probe.step(batch, micro_batches=N)")
        for mb in split_batch(self.batch, self.declared):
            self._current = mb
            yield mb
        self._current = None

    def report(self, out: StepLoss, *, batch: Any = None) -> None:
        """Add this (micro-)batch's loss sums to the step's record (no sync)."""
        self._parts.append(out)
        self._batches.append(batch if batch is not None else self._current)
        self._loss = None  # the joined StepLoss, made again after a new part

    def backward(self, out: StepLoss, *, batch: Any = None) -> None:
        """``report(out)`` then backward; once per micro-batch (see the module docstring)."""
        distributed = self.probe.world_size > 1 and dist.is_available() and dist.is_initialized()
        if self._backwards and distributed and self.declared is None:
            raise SupervisorError(
                "a second s.backward() in one step with several ranks: declare the micro-batches, "
                "probe.step(batch, micro_batches=N), so every rank scales the gradient alike"
            )
        self.report(out, batch=batch)
        if self._c is None:
            c = out.tokens.detach().clamp_min(1).to(torch.float32)
            if distributed and (self.declared or 1) > 1:
                dist.all_reduce(c)  # the same divisor on every rank (a device scalar, no host read)
                c, self._shared = c / self.probe.world_size, True
            self._c = c
        self._backwards += 1
        # The first (or only) micro-batch backpropagates its mean loss, exactly as a plain loop would.
        loss = out.loss if self._backwards == 1 and not self._shared else out.loss_sum / self._c
        scaler = self.probe.scaler
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def rescale_accumulated(self, params: Sequence[torch.Tensor]) -> None:
        """Sum of micro-batch gradients (each of ``loss_sum / c``) -> gradient of the step's mean loss."""
        if self.declared is not None and self._backwards != self.declared:
            raise SupervisorError(
                f"probe.step(micro_batches={self.declared}) ran {self._backwards} s.backward() calls"
            )
        if self._c is None or (self._backwards < 2 and not self._shared):
            return
        total = torch.stack([p.tokens for p in self._parts[: self._backwards]]).sum().to(torch.float32)
        factor = self._c / total.clamp_min(1)
        if self.probe.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(total)  # DDP / FSDP averaged the ranks' sums: scale by c * W / global tokens
            factor = self._c * self.probe.world_size / total.clamp_min(1)
        grads = [local(p.grad) for p in params if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, factor)

    def optimizer_step(self) -> torch.Tensor:
        """Measure, clip, step. Returns a 0-dim bool tensor, False when the step was skipped
        (non-finite or AMP overflow); ``bool()`` of it reads the device (the probe never does)."""
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
        if self._loss is not None:
            return self._loss
        cat = lambda xs: None if any(x is None for x in xs) else torch.cat([x.reshape(-1) for x in xs])  # noqa: E731
        self._loss = StepLoss(
            torch.stack([p.loss_sum.detach().double() for p in self._parts]).sum(),
            torch.stack([p.tokens for p in self._parts]).sum(),
            cat([p.sample_loss_sum for p in self._parts]),
            cat([p.sample_tokens for p in self._parts]),
        )
        return self._loss

    def meta_batch(self) -> Any:
        """What names the step's samples: the step's batch, else its micro-batches' IDs joined."""
        if isinstance(self.batch, dict) and self.batch.get("sample_ids") or len(self._parts) < 2:
            return self.batch
        mbs = [b for b in self._batches if isinstance(b, dict)]
        if len(mbs) != len(self._parts):
            return self.batch
        keys = ("sample_ids", "sources", "lengths")
        out: dict[str, Any] = {k: [x for b in mbs for x in (b.get(k) or [])] for k in keys}
        if "batch_index" in mbs[0]:
            out["batch_index"] = mbs[0]["batch_index"]
        return {k: v for k, v in out.items() if v or k == "batch_index"}

    def pack_loss(self, pack: Pack) -> list[str]:
        """Queue the loss quantities; returns the source names in index order."""
        out = self.loss()
        pack.add("loss_sum", out.loss_sum)
        pack.add("tokens", out.tokens)
        if len(self._parts) > 1:
            pack.add("mb_loss_sum", torch.stack([p.loss_sum.detach().double() for p in self._parts]))
            pack.add("mb_tokens", torch.stack([p.tokens for p in self._parts]))
        if out.sample_loss_sum is None or out.sample_tokens is None:
            return []
        pack.add("sample_loss_sum", out.sample_loss_sum)
        pack.add("sample_tokens", out.sample_tokens)
        batch = self.meta_batch()
        sources = batch.get("sources") if isinstance(batch, dict) else None
        if not sources or len(sources) != out.sample_loss_sum.numel():
            return []
        names = sorted(set(sources))
        idx = _to_device(torch.tensor([names.index(s) for s in sources]), out.sample_loss_sum.device)
        zeros = torch.zeros(len(names), dtype=torch.float64, device=idx.device)
        pack.add("src_loss", zeros.index_add(0, idx, out.sample_loss_sum.detach().double()))
        pack.add("src_tokens", zeros.index_add(0, idx, out.sample_tokens.double()))
        return names

    def micro_fields(self, vals: dict[str, list[float]], max_samples: int) -> list[dict[str, Any]]:
        """``attrs.micro_batches`` of an accumulated step: tokens, loss sum and sample IDs of each."""
        out = []
        for i, (ls, n) in enumerate(zip(vals["mb_loss_sum"], vals["mb_tokens"], strict=True)):
            mb: dict[str, Any] = {"loss_sum": ls, "tokens": int(n)}
            b = self._batches[i]
            if isinstance(b, dict) and b.get("sample_ids"):
                mb["samples"] = list(b["sample_ids"][:max_samples])
            out.append(mb)
        return out


def split_batch(batch: Any, n: int) -> list[Any]:
    """``batch`` in ``n`` slices along its first dimension: tensors, and lists as long as the batch."""
    size = _batch_size(batch)
    if size is None or size < n:
        raise SupervisorError(f"micro_batches={n}: the batch has {size or 'no'} samples to split")
    bounds = [size * i // n for i in range(n + 1)]

    def cut(v: Any, i: int) -> Any:
        if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == size:
            return v[bounds[i] : bounds[i + 1]]
        if isinstance(v, list) and len(v) == size:
            return v[bounds[i] : bounds[i + 1]]
        return v

    if isinstance(batch, dict):
        return [{k: cut(v, i) for k, v in batch.items()} for i in range(n)]
    if isinstance(batch, tuple | list):
        return [type(batch)(cut(v, i) for v in batch) for i in range(n)]
    return [cut(batch, i) for i in range(n)]


def _batch_size(batch: Any) -> int | None:
    values = (
        batch.values() if isinstance(batch, dict) else batch if isinstance(batch, tuple | list) else [batch]
    )
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim():
            return int(v.shape[0])
    return None


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

    With a ``SupervisedLoader`` (``sdk.watch(loader=...)``) the step boundary runs inside the
    loader, before the first batch drawn after a record (so the micro-batches of one step are
    never split by a directive), and a record names every sample drawn for its step.
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
        loader = probe.loader
        if loader is not None and hasattr(loader, "track_draws"):
            loader.track_draws()
            loader.boundary = self._loader_boundary

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def _loader_boundary(self) -> None:
        """The boundary the loader runs before each draw: only between steps (nothing drawn since the
        last record), never between the micro-batches of one step."""
        loader = self.probe.loader
        if loader is not None and loader.drawn_count:
            return
        self.probe.boundary()

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
        sums, counts = _step_sums(loss, loss_sum, tokens)
        gn = _number("grad_norm", grad_norm) if grad_norm is not None else self.grad_norm
        ids, sources, index = self._samples(batch)
        per_sample = sums.dim() == 1
        named = ids if ids is not None else sources
        if per_sample and named is not None and len(named) != sums.numel():
            raise _refused(
                "loss_sum",
                f"{sums.numel()} per-sample sums, but the step's batches hold {len(named)} samples (every "
                "micro-batch drawn since the last record, in draw order)",
            )
        pack = Pack()
        pack.add("loss_sum", sums.sum() if per_sample else sums)
        if counts is not None:
            pack.add("tokens", counts.sum() if per_sample else counts)
        names: list[str] = []
        if per_sample and counts is not None:
            pack.add("sample_loss_sum", sums)
            pack.add("sample_tokens", counts)
            if sources is not None and len(sources) == sums.numel():
                names = sorted(set(sources))
                idx = _to_device(torch.tensor([names.index(s) for s in sources]), sums.device)
                zeros = torch.zeros(len(names), dtype=torch.float64, device=sums.device)
                pack.add("src_loss", zeros.index_add(0, idx, sums))
                pack.add("src_tokens", zeros.index_add(0, idx, counts.to(torch.float64)))
        if gn is not None:
            pack.add("grad_norm", gn.detach().reshape(()).double())
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
        if "sample_loss_sum" in vals:
            means = [
                s / t for s, t in zip(vals["sample_loss_sum"], vals["sample_tokens"], strict=True) if t > 0
            ]
            if means:
                rec["batch_mean_loss"] = sum(means) / len(means)
            lengths = [int(t) for t in vals["sample_tokens"]]
            rec["seq_len_max"], rec["seq_len_mean"] = max(lengths), sum(lengths) / len(lengths)
        if names:
            rec["sources"] = {
                s: {"tokens": int(t), "loss_sum": v}
                for s, v, t in zip(names, vals["src_loss"], vals["src_tokens"], strict=True)
            }
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
        if ids:
            rec["samples"] = list(ids[: p.settings.max_samples])
            if index is not None:  # a SupervisedLoader's global batch (exclude_batches)
                rec["attrs"] = {"batch": index}
        self.stepped = 0
        self.flush()
        # Held until the boundary after this step: events of that boundary (checkpoint saved,
        # directive acknowledged) belong to this step's record, as in the probe-owned step.
        p.pending = Pending(rec, 0.0, 0.0, None, p.next_events)
        p.next_events = []
        p.step_count = step

    def _samples(self, batch: Any) -> tuple[list[str] | None, list[str] | None, int | None]:
        """The step's sample IDs, their sources and its first global batch index: from ``batch`` when it
        carries them, else from what the loader handed out since the last record (all micro-batches)."""
        loader = self.probe.loader
        drawn = loader.take_drawn() if loader is not None and hasattr(loader, "take_drawn") else []
        if isinstance(batch, dict) and (batch.get("sample_ids") or batch.get("sources")):
            ids = [str(x) for x in batch["sample_ids"]] if batch.get("sample_ids") else None
            sources = [str(x) for x in batch["sources"]] if batch.get("sources") else None
            index = batch.get("batch_index")
            return ids, sources, (int(index) if index is not None else None)
        if batch is not None and hasattr(loader, "batch_meta"):
            meta = loader.batch_meta(
                batch
            )  # a tuple / tensor batch: the loader that yielded it knows its IDs
            if meta is not None:
                return list(meta.sample_ids), list(meta.sources), int(meta.batch_index)
        if drawn:
            ids = [s for m in drawn for s in m.sample_ids]
            return ids, [s for m in drawn for s in m.sources], int(drawn[0].batch_index)
        return None, None, None

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


def _refused(argument: str, why: str) -> SupervisorError:
    return SupervisorError(f"probe.record({argument}=...): {why}")


def _tensor(argument: str, x: Any) -> torch.Tensor:
    """``x`` detached as float64, for a tensor or a number (no host sync); anything else is refused."""
    if isinstance(x, torch.Tensor):
        return x.detach().double()
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise _refused(argument, f"a tensor or a number, got {type(x).__name__}")
    return torch.tensor(float(x), dtype=torch.float64)


def _number(argument: str, x: Any) -> torch.Tensor:
    t = _tensor(argument, x)
    if t.numel() != 1:
        raise _refused(argument, f"one number, got a tensor of shape {list(t.shape)}")
    return t.reshape(())


def _step_sums(loss: Any, loss_sum: Any, tokens: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The step's loss sum and token count, each a scalar, or one per sample (1-D, same length).

    Accepted: ``loss`` (the step's mean; times ``tokens`` when given), ``loss_sum`` with ``tokens``
    (scalars, or per-sample vectors), or a ``StepLoss`` / a list of them (one per micro-batch).
    """
    parts = [loss] if isinstance(loss, StepLoss) else loss if isinstance(loss, list | tuple) else None
    if parts is not None:
        if not parts or not all(isinstance(x, StepLoss) for x in parts):
            raise _refused("loss", "a list here must hold one sdk.StepLoss per micro-batch")
        if loss_sum is not None or tokens is not None:
            raise _refused("loss", "a StepLoss carries its sums and tokens: leave loss_sum= and tokens= out")
        if all(x.sample_loss_sum is not None and x.sample_tokens is not None for x in parts):
            cat = lambda xs: torch.cat([x.detach().reshape(-1).double() for x in xs])  # noqa: E731
            return cat([x.sample_loss_sum for x in parts]), cat([x.sample_tokens for x in parts])
        total = torch.stack([x.loss_sum.detach().reshape(()).double() for x in parts]).sum()
        return total, torch.stack([x.tokens.detach().reshape(()).double() for x in parts]).sum()
    if loss is not None and loss_sum is not None:
        raise _refused("loss", "pass the step's mean loss= or its loss_sum= with tokens=, not both")
    if loss is None and loss_sum is None:
        raise _refused(
            "loss", "the step's loss is missing: loss= (its mean), loss_sum= with tokens=, or an sdk.StepLoss"
        )
    if loss is not None:
        mean = _tensor("loss", loss)
        if mean.numel() != 1:
            raise _refused(
                "loss",
                f"a tensor of shape {list(mean.shape)}: loss= is the step's mean loss, one number; pass "
                "per-sample sums as loss_sum= with per-sample tokens=",
            )
        n = _number("tokens", tokens) if tokens is not None else None
        return (mean.reshape(()) * n if n is not None else mean.reshape(())), n
    sums = _tensor("loss_sum", loss_sum)
    if sums.dim() > 1:
        raise _refused("loss_sum", f"shape {list(sums.shape)}: one number, or one sum per sample")
    if tokens is None:
        raise _refused("tokens", "loss_sum= needs tokens=, the number of tokens the sums are over")
    counts = _tensor("tokens", tokens)
    if sums.dim() == 0 or (sums.numel() == 1 and counts.numel() == 1):
        return sums.reshape(()), _number("tokens", tokens)
    if counts.shape != sums.shape:
        raise _refused(
            "tokens",
            f"loss_sum= holds {sums.numel()} per-sample sums, so tokens= must be the {sums.numel()} per-sample "
            f"token counts (got shape {list(counts.shape)})",
        )
    return sums, counts

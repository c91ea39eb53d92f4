"""Per-step metrics computed on the device, without host syncs (the probe packs them into one).

Update norm method (``NormSampler``): a fixed strided sample of each parameter tensor is
copied at every measurement; ‖Δθ‖ of the last step is the norm of (sample now − sample
before), scaled by ``sqrt(numel / sampled)`` per tensor; ‖θ‖ is estimated the same way from
the same sample. Tensors with at most ``exact_below`` elements (biases, norms) are copied
whole, so their part is exact; with ``stride=1`` everything is exact. The stride is prime
(31 by default: ~3.2 % of the parameter memory) so it walks through all columns of a weight
matrix instead of hitting the same few; the sample positions are fixed, so the estimate is a
smooth series over time. Tests bound its error against an explicit parameter copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

Tensor = torch.Tensor


def local(t: Tensor) -> Tensor:
    """The rank-local part of a parameter (a DTensor's shard under FSDP2), detached."""
    to_local = getattr(t, "to_local", None)
    return (to_local() if to_local is not None else t).detach()


def is_sharded(params: Sequence[Tensor]) -> bool:
    return any(hasattr(p, "to_local") for p in params)


def grad_norm(params: Sequence[Tensor], max_norm: float | None) -> Tensor:
    """Global L2 norm of the gradients before clipping; clips in place when ``max_norm > 0``."""
    with_grad = [p for p in params if p.grad is not None]
    if not with_grad:
        return torch.zeros((), device=params[0].device if params else None)
    # Tensor parallelism leaves some parameters plain (norms) beside DTensor ones, and torch's
    # norm and clip kernels refuse a list that mixes the two: each kind is reduced and clipped alone.
    groups = [g for g in (
        [p for p in with_grad if hasattr(p.grad, "full_tensor")],
        [p for p in with_grad if not hasattr(p.grad, "full_tensor")],
    ) if g]  # fmt: skip
    parts = [_total_norm([p.grad for p in g if p.grad is not None]) for g in groups]
    total = parts[0] if len(parts) == 1 else torch.linalg.vector_norm(torch.stack(parts))
    if max_norm is not None and max_norm > 0:
        for g in groups:
            torch.nn.utils.clip_grads_with_norm_(g, max_norm, total, True)
    return total


def _total_norm(grads: list[Tensor]) -> Tensor:
    total = torch.nn.utils.get_total_norm(grads, 2.0, False, True)
    full = getattr(total, "full_tensor", None)  # DTensor grads (FSDP2, TP): reduce to the global norm
    return full() if full is not None else total


class NormSampler:
    """Keeps a small strided copy of the parameters to estimate ‖θ‖ and ‖Δθ‖ between calls.

    The sample of a tensor is one block of ``BLOCK`` contiguous elements out of every
    ``stride`` blocks (tensors of at most ``exact_below`` elements whole): the same fraction as
    every ``stride``-th element, but a block is one or two cache lines where each strided element
    read a line of its own, so gathering the sample reads 1/``stride`` of the parameter memory,
    not most of it. One measurement is a handful of kernels whatever the number of tensors: the
    sampled elements are gathered into one flat vector, squared, weighted (``numel / sampled``
    of the element's tensor, built once) and summed (float32, torch's blocked reduction). No kernel reads
    a value back to the host (``segment_reduce`` checks its lengths with a device->host read: a
    sync per call on CUDA).
    """

    BLOCK = 16

    def __init__(self, params: Sequence[Tensor], stride: int = 31, exact_below: int = 1024) -> None:
        self.params = list(params)
        self.stride = max(1, stride)
        self.exact_below = exact_below
        self._prev: Tensor | None = None
        self._make_views()
        self.numel = sum(local(p).numel() for p in self.params)
        self.sampled = sum(n for _, n in self._lengths)
        dev = self._views[0].device if self._views else torch.device("cpu")
        sizes = {i: local(p).numel() for i, p in enumerate(self.params)}
        scale = torch.tensor([sizes[i] / max(1, n) for i, n in self._lengths], dtype=torch.float32)
        counts = torch.tensor([n for _, n in self._lengths], dtype=torch.int64)
        self._weight = torch.repeat_interleave(scale, counts).to(dev)

    @property
    def memory_fraction(self) -> float:
        """Elements kept between steps / parameter elements."""
        return self.sampled / max(1, self.numel)

    def _make_views(self) -> None:
        # Views into the parameters' storage: optimizers and load_state_dict update in place.
        # Blocked views ([blocks, BLOCK], gathered with one cat) first, then the 1-D ones (whole
        # small tensors; a tensor too short for one group of blocks: every stride-th element).
        blocked: list[tuple[int, Tensor]] = []
        flat_views: list[tuple[int, Tensor]] = []
        group = self.BLOCK * self.stride
        for i, p in enumerate(self.params):
            flat = local(p).reshape(-1)
            if flat.numel() <= self.exact_below or self.stride == 1:
                flat_views.append((i, flat))
            elif flat.numel() < group:
                flat_views.append((i, flat[self.stride // 2 :: self.stride]))
            else:
                n = flat.numel() // group
                view = flat[: n * group].view(n, self.stride, self.BLOCK)[:, self.stride // 2, :]
                blocked.append((i, view))
        self._blocks = [v for _, v in blocked]
        self._flat = [v for _, v in flat_views]
        self._views = self._blocks + self._flat
        self._lengths = [(i, v.numel()) for i, v in blocked + flat_views]

    @property
    def has_baseline(self) -> bool:
        """A sample is kept: the next ``measure`` yields ‖Δθ‖."""
        return self._prev is not None or not self._views

    def reset(self) -> None:
        """Forget the last sample (after a rollback the next delta would be meaningless)."""
        self._prev = None
        self._make_views()

    def _weighted(self, squared: Tensor) -> Tensor:
        # A float32 sum: torch reduces in blocks (cascade / tree sums), ~1e-7 relative at 10^6
        # elements, where a float64 accumulator made this reduction 3x slower on CPU (bench/README.md).
        return torch.sum(squared.mul_(self._weight)).double()

    def measure(self) -> tuple[Tensor, Tensor | None]:
        """(‖θ‖² estimate, ‖Δθ‖² estimate since the last call or None), as float64 device scalars."""
        if not self._views:
            return torch.zeros((), dtype=torch.float64), None
        parts = [torch.cat(self._blocks).reshape(-1)] if self._blocks else []
        if self._flat:
            parts.append(torch.cat(self._flat))
        flat = (parts[0] if len(parts) == 1 else torch.cat(parts)).float()  # fresh: the next baseline
        param_sq = self._weighted(flat.square())
        update_sq = self._weighted((flat - self._prev).square_()) if self._prev is not None else None
        self._prev = flat
        return param_sq, update_sq


def fingerprint_parts(params: Sequence[Tensor]) -> Tensor:
    """Per-tensor (sum, L2 norm) in float64 over every element: a full pass, run every K steps."""
    if not params:
        return torch.zeros(0, dtype=torch.float64)
    locs = [local(p) for p in params]
    norms = torch.stack(torch._foreach_norm([t.float() for t in locs])).double()
    sums = torch.stack([t.sum(dtype=torch.float64) for t in locs])
    return torch.stack([sums, norms], dim=1).reshape(-1)


def fingerprint(values: Sequence[float]) -> str:
    """Hash of the host copy of ``fingerprint_parts``: equal on data-parallel replicas when healthy."""
    text = ",".join(f"{v:.17g}" for v in values)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def exact_param_norm(values: Sequence[float]) -> float:
    return float(sum(v * v for v in values[1::2]) ** 0.5)


class Pack:
    """Device tensors collected during a step and copied to the host in one transfer.

    ``start()`` launches that copy without waiting (pinned host memory and an event on CUDA)
    and returns an ``Inflight`` read at a later boundary; ``fetch()`` copies and reads at once
    (a host sync, for the paths that need the value now).
    """

    def __init__(self) -> None:
        self._parts: list[tuple[str, Tensor]] = []

    def add(self, name: str, t: Tensor | None, *, snapshot: bool = False) -> None:
        """Queue ``t``; ``snapshot``: its value now (a tensor changed in place before the copy starts)."""
        if t is not None:
            flat = local(t).reshape(-1)
            self._parts.append((name, flat.detach().clone() if snapshot else flat))

    def __bool__(self) -> bool:
        return bool(self._parts)

    def start(self) -> Inflight:
        """Launch the step's one device->host copy; nothing waits for it here."""
        names = [(name, t.numel()) for name, t in self._parts]
        if not self._parts:
            return Inflight(names, None, None)
        dev = self._parts[0][1].device
        flat = torch.cat([t.to(device=dev, dtype=torch.float64) for _, t in self._parts])
        self._parts.clear()
        if dev.type != "cuda":
            return Inflight(names, flat, None)  # already host memory: reading it later is no sync
        host = torch.empty(flat.shape, dtype=torch.float64, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return Inflight(names, host, event)

    def fetch(self) -> dict[str, list[float]]:
        """Copy and read now: a device->host synchronization."""
        return self.start().values()


class Inflight:
    """A pack on its way to the host: ``values()`` waits for its event (long done a step later)."""

    def __init__(self, names: list[tuple[str, int]], host: Tensor | None, event: object) -> None:
        self._names, self._host, self._event = names, host, event
        self._values: dict[str, list[float]] | None = None

    def values(self) -> dict[str, list[float]]:
        if self._values is None:
            if self._event is not None and not self._event.query():  # type: ignore[attr-defined]
                self._event.synchronize()  # type: ignore[attr-defined]  # only at a flush, in practice
            flat = self._host.tolist() if self._host is not None else []
            out, i = {}, 0
            for name, n in self._names:
                out[name] = flat[i : i + n]
                i += n
            self._values, self._host = out, None
        return self._values

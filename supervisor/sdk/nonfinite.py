"""Name where a NaN/Inf first appeared, by replaying one step with checks armed.

The hooks cost time, so they are armed only for a replay of the failing step (the idea of
metaseq's NanDetector), never on every step. Order of the checks, first hit wins:

1. ``param:<name>``    — a parameter is already non-finite (corrupt state, bad restore);
2. ``forward:<module>`` — the first module, in execution order, whose output is non-finite;
3. ``loss``            — the model's outputs are finite but the loss is not;
4. ``grad:<name>``     — the first parameter, in backward order, whose gradient is non-finite.

The backward pass uses ``torch.autograd.grad``: it leaves ``.grad`` untouched and does not
trigger DDP's gradient all-reduce, so one rank can replay alone. Under FSDP2 (``sharded``)
the forward all-gathers parameters, so every rank must run exactly the same passes: the
replay is then forward-only with no early exit (steps 2 and 3), and all ranks take part —
they do, because the global grad norm that triggers it is the same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from supervisor.sdk.metrics import local


def _nonfinite(x: Any) -> bool:
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and not bool(torch.isfinite(local(x)).all())
    if isinstance(x, tuple | list):
        return any(_nonfinite(v) for v in x)
    if isinstance(x, dict):
        return any(_nonfinite(v) for v in x.values())
    return False


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP (or similar ``.module``) wrapper."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, nn.Module) else model


def localize_nonfinite(
    model: nn.Module, run: Callable[[nn.Module], torch.Tensor], *, sharded: bool = False
) -> str | None:
    """Replay ``run(module) -> loss`` on the unwrapped model with checks armed; the first culprit or None."""
    module = unwrap(model)
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    for name, p in named if not sharded else ():
        if _nonfinite(p):
            return f"param:{name}"
    hits: list[str] = []
    handles = [
        m.register_forward_hook(
            lambda _m, _i, out, name=name: hits.append(name) if not hits and _nonfinite(out) else None
        )
        for name, m in module.named_modules()
        if name
    ]
    try:
        with torch.enable_grad():
            loss = run(module)
    finally:
        for h in handles:
            h.remove()
    if hits:
        return f"forward:{hits[0]}"
    if _nonfinite(loss):
        return "loss"
    return None if sharded else _first_bad_grad(loss, named)


def _first_bad_grad(loss: torch.Tensor, named: list[tuple[str, nn.Parameter]]) -> str | None:
    hits: list[str] = []
    handles = [
        p.register_hook(lambda g, name=name: hits.append(name) if not hits and _nonfinite(g) else None)
        for name, p in named
    ]
    try:
        torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    return f"grad:{hits[0]}" if hits else None

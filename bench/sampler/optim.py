"""Optimizers and LR schedules of the sampler's jobs.

``Lion`` is hand-written (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"):
the update is ``lr * sign(beta1 * m + (1 - beta1) * g)`` plus decoupled weight decay, then
``m = beta2 * m + (1 - beta2) * g``. Its state (``exp_avg``) is created lazily, as torch's own
optimizers do, so a resume that loses it starts again from zero momentum.

Schedules are LambdaLR factors of the peak LR, counted in optimizer steps from 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

LR = {"adamw": 3e-3, "sgd": 0.3, "lion": 3e-3}
"""Peak LR per optimizer. Lion's paper advises 3-10x below Adam's; at these sizes and 150 steps
that leaves it far from a plateau (final loss 4.6-5.2 at 3e-4, 3.4-3.9 at 1e-3, against 3.0-3.3 for
AdamW at 3e-3), and a run still falling steeply makes any loss comparison meaningless: at 3e-3
it reaches AdamW's level (2.9-3.2)."""


class Lion(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr}")
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * beta1 + p.grad * (1 - beta1)), alpha=-group["lr"])
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
        return loss


def make_optimizer(name: str, params: Iterable[Any], lr: float | None = None) -> torch.optim.Optimizer:
    peak = float(lr or LR[name])
    if name == "adamw":
        return torch.optim.AdamW(params, lr=peak, weight_decay=0.01)
    if name == "sgd":
        return torch.optim.SGD(params, lr=peak, momentum=0.9)
    if name == "lion":
        return Lion(params, lr=peak, weight_decay=0.1)
    raise ValueError(f"config.optimizer: {name!r} (valid: adamw, sgd, lion)")


#: The LR schedules ``schedule`` knows (the sampler draws among them, ``space.SCHEDULES``).
SCHEDULE_NAMES = ("warmup_cosine", "wsd", "constant", "inv_sqrt", "step_decay", "cosine_restarts")


def schedule(
    name: str, total: int, warmup: int, lr_bug: dict[str, Any] | None = None
) -> Callable[[int], float]:
    """The LambdaLR factor for ``name``; ``lr_bug`` (``{step, factor}``) multiplies it from that
    optimizer step on, in every timeline (a bug in the job's own schedule)."""
    floor = 0.1

    def base(s: int) -> float:
        if name == "constant":
            return 1.0
        if name == "inv_sqrt":
            return (s + 1) / warmup if s < warmup else math.sqrt(warmup / (s + 1))
        if name == "step_decay":  # a vision recipe's milestones: x0.1 at half the run, again at 3/4
            return 0.1 ** sum(s >= m for m in (total // 2, total * 3 // 4))
        if s < warmup:
            return (s + 1) / warmup
        if name == "warmup_cosine":
            progress = min(1.0, (s - warmup) / max(1, total - warmup))
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        if name == "wsd":  # warmup, stable, then a linear decay over the last 20%
            decay_from = total - total // 5
            if s < decay_from:
                return 1.0
            return 1.0 - (1 - floor) * min(1.0, (s - decay_from) / max(1, total - decay_from))
        if name == "cosine_restarts":  # SGDR: cosine cycles of a third of the run, each back at the peak
            cycle = max(1, -(-(total - warmup) // 3))  # three whole cycles
            progress = ((s - warmup) % cycle) / cycle
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
        raise ValueError(f"config.schedule: {name!r} (valid: {', '.join(SCHEDULE_NAMES)})")

    def factor(s: int) -> float:
        f = base(s)
        # LambdaLR counts scheduler steps from 0; optimizer step k uses factor(k - 1).
        if lr_bug and s + 1 >= int(lr_bug["step"]):
            f *= float(lr_bug["factor"])
        return f

    return factor

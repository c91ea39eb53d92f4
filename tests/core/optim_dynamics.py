"""Records of tiny real training runs (torch, CPU), so the supervisor's own interventions are
tested against what AdamW, SGD with momentum and a sign-based optimizer (Lion) really do to the
signals the detector reads. Test helper only: the core never imports torch."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from supervisor.core.records import Record

torch.set_num_threads(1)


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023): ``lr * sign(beta1 m + (1 - beta1) g)``, decoupled weight decay."""

    def __init__(self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "m" not in st:
                    st["m"] = torch.zeros_like(p)
                m = st["m"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(torch.sign(m * b1 + p.grad * (1 - b1)), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


OPTIMIZERS: dict[str, tuple[Callable[..., torch.optim.Optimizer], float]] = {
    "adamw": (lambda ps, lr: torch.optim.AdamW(ps, lr=lr, weight_decay=0.01), 3e-3),
    "sgd": (lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9, nesterov=True), 5e-2),
    "lion": (lambda ps, lr: Lion(ps, lr=lr, weight_decay=0.01), 3e-4),
}


@dataclass
class Run:
    """A tiny regression MLP trained data-parallel over ``ranks`` batches per step."""

    optimizer: str
    ranks: int = 2
    seed: int = 0
    warmup: int = 20
    checkpoints: dict[int, dict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        self.gen = g
        self.teacher = torch.nn.Linear(16, 1)
        torch.nn.init.normal_(self.teacher.weight, generator=g)
        self.model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        for prm in self.model.parameters():
            with torch.no_grad():
                prm.copy_(torch.randn(prm.shape, generator=g) * 0.3)
        make, self.base_lr = OPTIMIZERS[self.optimizer]
        self.opt = make(self.model.parameters(), self.base_lr)
        self.step = 0

    def lr_at(self, step: int) -> float:
        return self.base_lr * min(1.0, step / self.warmup)

    def save(self) -> None:
        self.checkpoints[self.step] = {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "opt": _clone(self.opt.state_dict()),
        }

    def restore(self, step: int, *, optimizer_state: bool = True) -> None:
        ck = self.checkpoints[step]
        self.model.load_state_dict(ck["model"])
        if optimizer_state:
            self.opt.load_state_dict(_clone(ck["opt"]))
        else:  # the script's own resume that forgets the optimizer
            make, _ = OPTIMIZERS[self.optimizer]
            self.opt = make(self.model.parameters(), self.base_lr)
        self.step = step

    def train(self, lr_factor: float = 1.0, loss_factor: dict[int, float] | None = None) -> list[Record]:
        """One step; ``loss_factor`` scales one rank's targets' noise (a garbage batch)."""
        self.step += 1
        lr = self.lr_at(self.step) * lr_factor
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.zero_grad()
        losses = []
        for rank in range(self.ranks):
            x = torch.randn(128, 16, generator=self.gen)
            y = self.teacher(x).detach() + 0.3 * torch.randn(128, 1, generator=self.gen)
            if loss_factor and rank in loss_factor:
                y = y + loss_factor[rank] * torch.randn(128, 1, generator=self.gen)
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            (loss / self.ranks).backward()
            losses.append(float(loss.detach()))
        grad = math.sqrt(sum(float(p.grad.detach().pow(2).sum()) for p in self.model.parameters()))
        before = [p.detach().clone() for p in self.model.parameters()]
        self.opt.step()
        upd = math.sqrt(
            sum(
                float((p.detach() - b).pow(2).sum())
                for p, b in zip(self.model.parameters(), before, strict=True)
            )
        )
        pn = math.sqrt(sum(float(p.detach().pow(2).sum()) for p in self.model.parameters()))
        return [
            Record(step=self.step, rank=r, world_size=self.ranks, loss=lo, loss_sum=lo * 128, tokens=128,
                   lr=lr, grad_norm=grad, update_norm=upd, param_norm=pn, samples=[f"s{self.step}r{r}"])
            for r, lo in enumerate(losses)
        ]  # fmt: skip


def _clone(obj):
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clone(v) for v in obj]
    return obj

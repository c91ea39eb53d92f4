"""What the framework adapters share: the probe over live framework objects and the loss tap.

A framework owns the loop, the optimizer step and the scheduler; the adapter sees them at
its callbacks. ``FrameworkProbe`` builds a ``sdk.watch`` probe over the *inner* torch
optimizer and scheduler (accelerate and Lightning wrap them), so checkpoints, in-place
rollbacks and LR / clip overrides act on exactly the objects that train.
"""

from __future__ import annotations

from typing import Any

import torch

from supervisor import sdk
from supervisor.integrations.drills import inject_faults


def inner_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside framework wrappers (accelerate's AcceleratedOptimizer, LightningOptimizer)."""
    seen = 0
    while not type(optimizer).__module__.startswith("torch.optim") and hasattr(optimizer, "optimizer"):
        optimizer, seen = optimizer.optimizer, seen + 1
        if seen > 4:
            break
    return optimizer


def inner_scheduler(scheduler: Any) -> Any:
    """The torch LR scheduler inside accelerate's AcceleratedScheduler (its ``state_dict`` is the inner one's)."""
    inner = getattr(scheduler, "scheduler", None)
    return inner if inner is not None and hasattr(inner, "state_dict") else scheduler


class LossTap:
    """Token-weighted loss of each optimizer step, read from the model's forward outputs.

    A forward hook on the model sees every training micro-batch: Hugging Face models return
    ``loss`` and take ``labels`` (and ``num_items_in_batch`` when the Trainer normalizes over
    the whole accumulated batch). Sums stay on the device until the step's one sync.
    """

    def __init__(self, model: torch.nn.Module, *, shifted: bool = True) -> None:
        self.model = model
        self.shifted = shifted
        self.loss_sum: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None
        self.handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if loss is None and isinstance(output, tuple) and output and "labels" in kwargs:
            loss = output[0]  # return_dict=False: the Trainer takes the loss from the first element
        if not module.training or not isinstance(loss, torch.Tensor):
            return
        labels = kwargs.get("labels")
        if isinstance(labels, torch.Tensor):
            target = labels[..., 1:] if self.shifted and labels.dim() >= 2 else labels
            tokens = (target != -100).sum()
        else:
            tokens = torch.ones((), dtype=torch.long, device=loss.device)
        total = kwargs.get("num_items_in_batch")
        scale = total if total is not None else tokens
        self.add(
            loss.detach().double() * (scale.to(loss.device) if isinstance(scale, torch.Tensor) else scale),
            tokens,
        )

    def add(self, loss_sum: torch.Tensor, tokens: torch.Tensor) -> None:
        self.loss_sum = loss_sum if self.loss_sum is None else self.loss_sum + loss_sum
        self.tokens = tokens if self.tokens is None else self.tokens + tokens

    def take(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        out = self.loss_sum, self.tokens
        self.loss_sum = self.tokens = None
        return out

    def remove(self) -> None:
        self.handle.remove()


class FrameworkProbe:
    """One rank's probe inside a framework's loop: ``step_end`` reports the step and runs the boundary."""

    def __init__(self, model: torch.nn.Module, optimizer: Any, scheduler: Any, **settings: Any) -> None:
        self.probe = sdk.watch(
            model, inner_optimizer(optimizer), scheduler=inner_scheduler(scheduler), **settings
        )
        self.plan = inject_faults(self.probe)

    @property
    def step(self) -> int:
        return int(self.probe.step_count)

    def step_end(self, loss_sum: Any, tokens: Any, loss: Any = None) -> bool:
        """Report the step just finished, then the boundary; True when training must stop."""
        if loss_sum is not None and tokens is not None:
            self.probe.record(loss_sum=loss_sum, tokens=tokens)
        elif loss is not None:
            self.probe.record(loss)
        return not self.probe.proceed()

    def close(self) -> None:
        self.probe.close()

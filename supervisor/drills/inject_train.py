"""Optimizer, numeric and distributed faults: they act on the LR, the gradients, the forward pass.

All of them use ``OnceWindow``: they model an event, not a property of the data, so a
replay after a rollback runs clean. ``lr_spike`` is a bad schedule state (a hot-reloaded
config, a corrupted scheduler): it lasts from its step on until training is rolled back to a
checkpoint from before it, whose scheduler state is sound.
"""

from __future__ import annotations

from typing import Any

import torch

from supervisor.drills import batchio
from supervisor.drills.base import Injector, PlanContext
from supervisor.drills.specs import (
    FaultParams,
    LrSpike,
    Overflow,
    OversizedUpdate,
    RankGradCorruption,
    ResumeWithoutOptimizer,
)
from supervisor.errors import ConfigError

FP16_MAX = 65504.0
FOREVER = 1 << 62


class _Windowed(Injector):
    def __init__(self, spec: FaultParams, index: int, ctx: PlanContext) -> None:
        super().__init__(spec, index, ctx)
        steps = getattr(spec, "steps", 1)  # lr_spike: None = until a rollback
        self.window = self.once_window(FOREVER if steps is None else steps)
        self.on = False

    def observe_step(self, step: int) -> None:
        self.on = self.window.active(step)


class _ScaledLr(_Windowed):
    """LR x ``factor`` while the window is on; the logged LR of those steps says so too."""

    spec: LrSpike | OversizedUpdate

    def __init__(self, spec: FaultParams, index: int, ctx: PlanContext) -> None:
        super().__init__(spec, index, ctx)
        self.used: set[int] = set()

    def observe_step(self, step: int) -> None:
        super().observe_step(step)
        self.used = {u for u in self.used if u < step}  # after a rollback, replayed steps run clean

    def lr_scale(self, step: int) -> float:
        if not self.on:
            return 1.0
        if not self.used:
            self.fired(step, factor=self.spec.factor)
        self.used.add(step)
        return self.spec.factor

    def record(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        # The probe reads the scheduled LR; log the one the optimizer actually used.
        if step in self.used and isinstance(record.get("lr"), float | int):
            record = {**record, "lr": record["lr"] * self.spec.factor}
        return record


class LrSpikeInjector(_ScaledLr):
    spec: LrSpike


class OversizedUpdateInjector(_ScaledLr):
    spec: OversizedUpdate


class OverflowInjector(_Windowed):
    """A forward hook scales one module's output and casts it through fp16: values past 65504 become Inf."""

    spec: Overflow

    def install(self, model: torch.nn.Module) -> None:
        name, module = self.pick(model)
        self.module_name = name
        module.register_forward_hook(self.hook)

    def pick(self, model: torch.nn.Module) -> tuple[str, torch.nn.Module]:
        modules = dict(model.named_modules())
        if self.spec.module is not None:
            if self.spec.module not in modules:
                valid = ", ".join(n for n in modules if n) or "(none)"
                raise ConfigError(
                    f"no module {self.spec.module!r} in the model; valid: {valid}", field="faults.module"
                )
            return self.spec.module, modules[self.spec.module]
        linears = [(n, m) for n, m in modules.items() if isinstance(m, torch.nn.Linear)]
        if not linears:
            raise ConfigError("the model has no nn.Linear to overflow; set `module`", field="faults.module")
        return linears[len(linears) // 2]

    def hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> Any:
        if not (self.on and module.training and isinstance(output, torch.Tensor)):
            return None
        self.fired(self.window.last, module=self.module_name)
        scaled = output * self.spec.scale
        return scaled.to(torch.float16).to(output.dtype) if scaled.abs().max() > FP16_MAX else scaled


class RankGradCorruptionInjector(_Windowed):
    """This rank's synchronized gradients are corrupted: its replica drifts from the others."""

    spec: RankGradCorruption

    def before_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        if not self.on:
            return
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not grads:
            return
        with torch.no_grad():
            if self.spec.mode == "flip":
                for g in grads:
                    g.neg_()  # every sign bit flipped: this replica climbs while the others descend
            else:
                self._add_noise(grads, step)
        self.fired(step, mode=self.spec.mode)

    def _add_noise(self, grads: list[torch.Tensor], step: int) -> None:
        gen = torch.Generator().manual_seed(batchio.stable_seed(self.key, step))
        noise = [torch.randn(g.shape, generator=gen, dtype=torch.float32) for g in grads]
        grad_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
        )
        noise_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(n) for n in noise]))
        factor = self.spec.scale * grad_norm / (noise_norm + 1e-12)
        for g, n in zip(grads, noise, strict=True):
            g.add_((n * factor).to(device=g.device, dtype=g.dtype))


class ResumeWithoutOptimizerInjector(_Windowed):
    """At ``step`` the optimizer state is dropped, as after a resume from a model-only checkpoint."""

    spec: ResumeWithoutOptimizer
    resumed_at: int | None = None

    def before_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        if not self.on:
            return
        # AdamW re-initializes moments and its step count lazily when a parameter's state is empty.
        optimizer.state.clear()
        self.resumed_at = step
        self.fired(step, params=sum(len(g["params"]) for g in optimizer.param_groups))

    def record(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        # A real resume emits `resumed` with the first record after the restore.
        if step == self.resumed_at and "resumed" not in record.get("events", []):
            record = {**record, "events": [*record.get("events", []), "resumed"]}
        return record

"""What the supervisor itself did to the run, so the detector never mistakes it for a fault.

A rollback, an LR scale or re-warm, a new clip, excluded batches: each moves a metric the detector
watches. ``Interventions`` keeps them in timeline order and answers ``lr_multiplier(step)``, the
factor the detector divides out of the logged LR and update ratio, so an intended ramp is never an
LR jump. It mirrors the SDK's ``Steering.lr_multiplier``: ``lr_scale * min(1, (step - from_step) /
warmup_steps)``, the latest scale and warmup each replacing the one before. A rollback to step T
takes back every override after T: the workers restore those saved with checkpoint T.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

InterventionKind = Literal["rollback", "override"]

#: Interventions kept (oldest dropped first): a runaway loop must not grow the saved state.
MAX_KEPT = 256


@dataclass(frozen=True, slots=True)
class Intervention:
    """One change the supervisor made, effective for steps after ``step``.

    ``step`` is the last step completed when it took effect (for a rollback: the target).
    """

    kind: InterventionKind
    step: int
    lr_scale: float | None = None
    warmup_steps: int | None = None
    grad_clip: float | None = None
    data: bool = False  # exclusions or skipped batches changed what data the run sees
    from_step: int | None = None  # "rollback": the step training was at
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        # ``is`` for False: a step 0 (a restart from scratch) equals False and must be kept
        return {k: v for k, v in asdict(self).items() if v is not None and v is not False and v != ""}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Intervention:
        return cls(**d)


class Interventions:
    """The supervisor's own changes to the run, as the detector needs them."""

    def __init__(self) -> None:
        self.log: list[Intervention] = []

    def add(self, iv: Intervention) -> None:
        if iv.kind == "rollback":
            # Overrides applied at or after the target are gone: the workers restore the overrides
            # saved with the target checkpoint, and a plan re-applies its fix after the rollback.
            self.log = [x for x in self.log if x.kind != "override" or x.step < iv.step]
        self.log.append(iv)
        if len(self.log) > MAX_KEPT:
            del self.log[: len(self.log) - MAX_KEPT]

    def lr_multiplier(self, step: int) -> float:
        scale, warm = 1.0, None
        for x in self.log:
            if x.kind != "override" or x.step >= step:
                continue
            if x.lr_scale is not None:
                scale = x.lr_scale
            if x.warmup_steps is not None:
                warm = (x.step, x.warmup_steps)
        if warm is not None and warm[1] > 0:
            scale *= min(1.0, (step - warm[0]) / warm[1])
        return scale

    def ramp_left(self, step: int) -> int:
        """Steps of a re-warm still to run after ``step`` (0 when none is ramping)."""
        for x in reversed(self.log):
            if x.kind == "override" and x.warmup_steps and x.step <= step:
                return max(0, x.step + x.warmup_steps - step)
        return 0

    def state_dict(self) -> list[dict[str, Any]]:
        return [x.to_json() for x in self.log]

    def load_state_dict(self, state: list[dict[str, Any]]) -> None:
        # A state saved by an older supervisor may hold a "skip" entry (a kind since retired: a
        # loader skip is an override with ``data``); it says nothing the detector still reads.
        self.log = [Intervention.from_json(d) for d in state if d.get("kind") != "skip"]

"""Fault parameters: one pydantic model per fault kind, validated where a job is loaded.

This module does not import torch, so the supervisor, the CLI (``supervisor drill --list``)
and scenario validation can check a ``faults:`` list without the training stack. The
torch-side injectors live in ``supervisor.drills.faults`` and are keyed by the same names.

Every fault is deterministic given its spec: a seed, when it needs randomness, is derived
from the spec itself (kind, step, rank, ``seed``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from supervisor.config.loader import format_validation_error
from supervisor.errors import ConfigError


class FaultParams(BaseModel):
    """Fields every fault shares. ``rank: null`` means every rank."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    step: int = Field(ge=0, description="Step at which the fault starts.")
    rank: int | None = Field(None, ge=0, description="Rank it affects (null: every rank).")
    seed: int = Field(0, description="Extra seed for the fault's own randomness.")

    def applies_to(self, rank: int) -> bool:
        return self.rank is None or self.rank == rank


class GarbageBatch(FaultParams):
    """Uniformly random tokens replace one rank's batch at one step (and wherever those samples recur)."""

    rank: int | None = Field(0, ge=0)
    fraction: float = Field(1.0, gt=0, le=1, description="Share of the batch's rows replaced.")


class LrSpike(FaultParams):
    """The learning rate is multiplied by ``factor`` from ``step`` on, until a rollback to before it."""

    factor: float = Field(10.0, gt=1, description="LR multiplier from `step` on.")
    steps: int | None = Field(None, ge=1, description="Steps it lasts (null: until the run is rolled back).")


class OversizedUpdate(FaultParams):
    """One optimizer step taken with the LR multiplied by ``factor`` (happens once, not on replay)."""

    factor: float = Field(50.0, gt=1, description="LR multiplier for that single step.")


class Overflow(FaultParams):
    """fp16-style overflow: one module's output is scaled past the fp16 range and becomes Inf."""

    module: str | None = Field(None, description="Qualified module name; default: the middle nn.Linear.")
    steps: int = Field(1, ge=1, description="Consecutive steps it overflows (once, not on replay).")
    scale: float = Field(1e6, gt=1, description="Output multiplier before the fp16 cast.")


class CorruptShard(FaultParams):
    """A corrupt data shard: one rank's batches are garbage for ``steps`` steps (keyed by sample)."""

    rank: int | None = Field(0, ge=0)
    steps: int = Field(8, ge=1, description="Number of steps the shard feeds the rank.")
    fraction: float = Field(1.0, gt=0, le=1, description="Share of each batch's rows from the shard.")


class PeriodicGarbage(FaultParams):
    """A data source that emits garbage every ``period`` steps from ``step`` on."""

    period: int = Field(20, ge=2, description="Steps between garbage batches.")
    count: int | None = Field(None, ge=1, description="Number of occurrences (null: until the end).")
    source: str | None = Field(None, description="Source whose rows turn to garbage (null: whole batch).")
    fraction: float = Field(1.0, gt=0, le=1, description="Share of rows replaced when `source` is null.")


class RankGradCorruption(FaultParams):
    """Gradients of one rank are corrupted after the all-reduce: that replica drifts from the others."""

    rank: int | None = Field(1, ge=0)
    steps: int = Field(10, ge=1, description="Consecutive steps corrupted (once, not on replay).")
    mode: Literal["flip", "noise"] = Field(
        "flip", description="`flip`: sign bits flipped (the rank ascends); `noise`: Gaussian noise added."
    )
    scale: float = Field(5.0, gt=0, description="noise: noise norm as a multiple of the gradient norm.")


class ResumeWithoutOptimizer(FaultParams):
    """A resume that lost the optimizer state: AdamW moments and step counts are dropped at ``step``."""


class LoggingBug(FaultParams):
    """The logged loss is wrong while training is fine: a misreduction or a padding-dominated mean."""

    steps: int = Field(5, ge=1, description="Steps the bug is visible.")
    mode: Literal["misreduced", "padding"] = Field(
        "misreduced",
        description="`misreduced`: summed over ranks, not averaged; `padding`: pad tokens counted.",
    )
    factor: float | None = Field(
        None, gt=1, description="misreduced: multiplier (default: world size, min 2)."
    )
    pad_fraction: float = Field(0.6, gt=0, lt=1, description="padding: share of positions that are padding.")
    pad_loss: float = Field(12.0, gt=0, description="padding: loss of each padding position.")


class MixtureShift(FaultParams):
    """A benign mixture switch: from ``step`` on, the loader samples with these source weights."""

    weights: dict[str, float] = Field(description="Source name -> sampling weight (need not sum to 1).")

    @model_validator(mode="after")
    def _weights(self) -> MixtureShift:
        if not self.weights or any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
            raise ValueError("weights must be non-negative with a positive sum")
        return self


class WorkerKill(FaultParams):
    """SIGKILL of the worker process at ``step``, once per job (a marker file remembers it fired)."""

    rank: int | None = Field(0, ge=0)


class CorruptCheckpoint(FaultParams):
    """One byte flipped in this rank's shard of the first checkpoint saved at or after ``step``."""

    rank: int | None = Field(0, ge=0)


@dataclass(frozen=True, slots=True)
class FaultKind:
    name: str
    params: type[FaultParams]
    summary: str


def _kinds(*pairs: tuple[str, type[FaultParams]]) -> dict[str, FaultKind]:
    return {
        name: FaultKind(name, model, (model.__doc__ or "").strip().splitlines()[0].replace("``", "`"))
        for name, model in pairs
    }


#: The registry of fault kinds (docs/architecture.md, Registries). ``faults.INJECTORS`` has the same keys.
FAULT_KINDS: dict[str, FaultKind] = _kinds(
    ("garbage_batch", GarbageBatch),
    ("lr_spike", LrSpike),
    ("oversized_update", OversizedUpdate),
    ("overflow", Overflow),
    ("corrupt_shard", CorruptShard),
    ("periodic_garbage", PeriodicGarbage),
    ("rank_grad_corruption", RankGradCorruption),
    ("resume_without_optimizer", ResumeWithoutOptimizer),
    ("logging_bug", LoggingBug),
    ("mixture_shift", MixtureShift),
    ("worker_kill", WorkerKill),
    ("corrupt_checkpoint", CorruptCheckpoint),
)


def fault_kind(name: str) -> FaultKind:
    """The registered kind; an unknown name fails with the list of valid ones."""
    try:
        return FAULT_KINDS[name]
    except KeyError:
        raise ConfigError(f"unknown fault kind {name!r}; valid: {', '.join(FAULT_KINDS)}") from None


def parse_fault(spec: Any, *, source: str = "job", where: str = "faults[0]") -> FaultParams:
    """Validate one fault spec (a ``config.job.Fault`` or a plain mapping) into its params model."""
    data = _as_dict(spec)
    kind = data.get("kind")
    if not isinstance(kind, str):
        raise ConfigError("required field `kind` is missing", source=source, field=f"{where}.kind")
    try:
        model = fault_kind(kind).params
    except ConfigError as exc:
        raise ConfigError(exc.message, source=source, field=f"{where}.kind") from None
    data = {
        k: v for k, v in data.items() if not (k in ("step", "rank") and v is None and k in _defaulted(model))
    }
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, msg = format_validation_error(exc)
        raise ConfigError(msg, source=source, field=f"{where}.{field}") from None


def parse_faults(specs: Iterable[Any], *, source: str = "job") -> list[FaultParams]:
    return [parse_fault(s, source=source, where=f"faults[{i}]") for i, s in enumerate(specs)]


def _as_dict(spec: Any) -> dict[str, Any]:
    if isinstance(spec, BaseModel):
        out = spec.model_dump()
        out.update(spec.model_extra or {})
        return out
    if isinstance(spec, Mapping):
        return dict(spec)
    raise ConfigError(f"a fault must be a mapping, got {type(spec).__name__}")


def _defaulted(model: type[FaultParams]) -> set[str]:
    """Shared fields whose ``None`` from ``config.job.Fault`` should fall back to the kind's default."""
    return {name for name in ("rank",) if model.model_fields[name].default is not None} | {"step"}

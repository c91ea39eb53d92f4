"""Resolved arguments of planned actions: typed, frozen, nothing symbolic left.

The engine resolves a policy's general parameters (``rollback: {margin_steps: 100}``) against one
incident and job into these values (``target_step=200``), which the runtime reads as attributes;
``PlannedAction.params`` is their JSON, which the incident store records. Each action's model is
its row's ``args`` in the action table (``actions.py``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field


class Args(BaseModel):
    # extra="ignore": a plan recorded by an older supervisor must still load after an upgrade
    # (a restarted supervisor resumes the plan it recorded); the engine never writes unknown keys.
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    omit_none: ClassVar[bool] = False
    """Leave unset (None) fields out of the JSON: an apply lists only what it changes."""

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=self.omit_none)


class MessageArgs(Args):
    """alert / escalate / stop."""

    message: str | None = Field(None, description="The policy author's words (or the engine's reason).")
    page: bool = Field(True, description="alert: POST to the webhook; false: log and record only (a note).")


class NoArgs(Args):
    """freeze / block_latest / resume."""


class SnapshotArgs(Args):
    include_optimizer: bool = Field(True, description="Also save optimizer moments.")
    mark: Literal["diagnostic"] = Field(
        "diagnostic", description="Always diagnostic: never a rollback target."
    )


class ReplayArgs(Args):
    batches: int = Field(1, description="Suspect batches to replay, from `from_step`.")
    control: bool = Field(True, description="Also replay a control batch from before the onset.")
    other_rank: bool = Field(False, description="Replay on another rank than `suspect_rank`.")
    from_step: int = Field(description="The incident's onset step.")
    suspect_rank: int | None = Field(None, description="The rank that deviated first (None: not rank-local).")


class RollbackArgs(Args):
    margin_steps: int = Field(description="Steps between the target checkpoint and the onset.")
    require_verified: Literal[True] = Field(
        True, description="Always: the target is re-verified before loading."
    )
    min_mark: Literal["healthy", "verified"] = Field("healthy", description="Weakest health mark accepted.")
    check_completeness: bool = Field(False, description="Require every state component in the target.")
    max_target_step: int = Field(description="Newest step a target may have (onset - margin).")
    target_step: int | None = Field(None, description="The chosen checkpoint (None: chosen at run time).")
    from_start: bool = Field(True, description="The run's start may be the target (policy `from_start`).")
    to_start: bool = Field(
        False, description="The target is the run's start: the group restarts from the job's initial state."
    )


class ExcludeArgs(Args):
    omit_none: ClassVar[bool] = True
    samples: list[str] | None = Field(None, description="Sample IDs to quarantine.")
    sources: list[str] | None = Field(None, description="Data sources to quarantine.")
    batch_range: tuple[int, int] | None = Field(
        None, description="[first, last] steps whose batches are skipped."
    )


class ApplyArgs(Args):
    omit_none: ClassVar[bool] = True
    lr_scale: float | None = Field(
        None,
        description="Absolute LR multiplier from now on (already multiplied with the job's current scale).",
    )
    warmup_steps: int | None = Field(None, description="Re-warm the LR over this many steps.")
    grad_clip: float | None = Field(None, description="Absolute max global grad norm from now on.")
    precision: Literal["fp32", "bf16", "fp16"] | None = Field(None, description="Compute precision.")
    exclude: ExcludeArgs | None = Field(None, description="Data to quarantine.")
    skip_batches: int | None = Field(None, description="Batches to skip after the resume point.")


class PassArgs(Args):
    loss_within_mads: float = Field(3.0, description="Loss median <= baseline median + N x 1.4826 MAD.")
    grad_norm_ratio_max: float = Field(2.0, description="Grad norm median <= N x baseline.")
    update_ratio_max: float = Field(2.0, description="Update ratio median <= N x baseline.")
    throughput: bool = Field(True, description="Whether throughput is judged at all.")
    throughput_min_ratio: float = Field(0.5, description="Sustained tokens/s >= N x the run's own baseline.")


class ObserveArgs(Args):
    steps: int = Field(description="Minimum length of the window.")
    pass_: PassArgs = Field(default_factory=PassArgs, alias="pass")  # type: ignore[arg-type]
    baseline_until_step: int = Field(description="The baseline is taken from steps before this (the onset).")
    cover_until_step: int | None = Field(
        None,
        description="The window runs at least until this step (original onset + observation.onset_margin_steps).",
    )

    def window_steps(self, from_step: int) -> int:
        """Steps to watch when the window starts after ``from_step``: at least ``steps``, and past the onset."""
        cover = self.cover_until_step if self.cover_until_step is not None else from_step
        return max(self.steps, cover - from_step)

"""The probe's settings: what runs every step and what is sampled every K steps."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ProbeSettings(BaseModel):
    """Cost discipline lives here: every step costs one non-blocking packed device->host copy, nothing more."""

    model_config = ConfigDict(extra="forbid")

    grad_clip: float | None = Field(
        default=None, description="Max global grad norm (None / <= 0: no clipping)."
    )
    norms: bool = Field(
        default=True, description="Sampled param / update norm every step (see metrics.NormSampler)."
    )
    sample_stride: int = Field(
        default=31, ge=1, description="Update-norm sample: every Nth element (1: exact, full copy)."
    )
    exact_below: int = Field(
        default=1024, ge=0, description="Tensors with at most this many elements are copied whole."
    )
    fingerprint_every: int = Field(
        default=50, ge=0, description="Exact param fingerprint (full pass) every K steps (0: off)."
    )
    canary_every: int = Field(
        default=0, ge=0, description="Forward-only canary batch every K steps (0: off)."
    )
    checkpoint_every: int | None = Field(
        default=None, ge=1, description="Save a checkpoint every N steps at the boundary."
    )
    max_steps: int | None = Field(
        default=None, ge=1, description="The loader stops yielding at this step count."
    )
    skip_nonfinite_step: bool = Field(
        default=True,
        description="Without a GradScaler, skip the optimizer step when grads are NaN/Inf (state stays clean).",
    )
    localize_nonfinite: bool = Field(
        default=True, description="Replay a non-finite step with hooks to name where it began."
    )
    max_samples: int = Field(default=1024, ge=0, description="Sample IDs kept per record.")
    freeze_poll_s: float = Field(
        default=0.1, gt=0, description="How often a frozen rank 0 polls for the release."
    )
    guard: bool = Field(
        default=True,
        description="While no supervisor answers, hold at the step boundary on a severe anomaly rank 0 "
        "sees itself (non-finite loss; loss or update ratio far above its own band): sdk/guard.py.",
    )
    guard_after_steps: int = Field(
        default=10,
        ge=1,
        description="The guard arms after this many steps without an answer from the supervisor ...",
    )
    guard_after_s: float = Field(default=15.0, ge=0, description="... and this many seconds.")
    guard_z: float = Field(
        default=12.0, gt=0, description="Robust deviations above the rank's own band that make a step severe."
    )
    guard_hold_s: float = Field(
        default=1800.0, gt=0, description="The longest hold without an answer; training then goes on."
    )

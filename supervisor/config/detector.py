"""The detector settings a job.yaml may set: one definition (default, bounds, meaning) of each.

``telemetry:`` in job.yaml (``config.job.Telemetry``) and the detector's own settings
(``core.detect.DetectorSettings``) both inherit these fields, so the bounds a user is held to
are the ones the detector accepts (docs/architecture.md, "One definition of each setting").
"""

from __future__ import annotations

from pydantic import BaseModel, Field

#: Larger windows or histories are a typo (``window: 1e9``): the state would not fit in memory.
MAX_WINDOW = 1_000_000


class DetectorKnobs(BaseModel):
    """Detector thresholds. Robust-z means |x - level| / (1.4826 MAD of residuals)."""

    window: int = Field(
        default=1000,
        ge=8,
        le=MAX_WINDOW,
        description="Rolling window (steps) of the residual noise statistics.",
    )
    min_history: int = Field(
        default=50,
        ge=2,
        le=MAX_WINDOW,
        description="Steps of history before any alarm except non-finite values (a MAD needs two residuals).",
    )
    z_threshold: float = Field(
        default=6.0, gt=0, le=1e6, description="Robust-z of the loss that opens an incident."
    )
    grad_z_threshold: float = Field(
        default=6.0, gt=0, le=1e6, description="Robust-z of grad norm / update ratio that co-moves."
    )
    rank_z_threshold: float = Field(
        default=8.0, gt=0, le=1e6, description="Robust-z of one rank against the other ranks' median."
    )

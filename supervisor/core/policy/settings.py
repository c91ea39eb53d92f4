"""Policy-wide settings beside the rules: restarts, observation windows, recurrences, rank offenders.

Each section is a frozen model with a description per field (`supervisor schema policy`,
docs/policies.md) and a default for each, so a policy that leaves a section out keeps working.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Section(BaseModel):
    """A section of a policy file: unknown keys are errors, loaded values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Restarts(Section):
    """How the runtime restarts a worker group that died, hung or lost its node."""

    max_restarts: int = Field(
        3, ge=0, le=100, description="Group restarts within `window_steps` before the job is failed."
    )
    window_steps: int | None = Field(
        None,
        ge=1,
        description="Restarts older than this many steps of progress no longer count (null: whole run).",
    )
    backoff_s: float = Field(2.0, ge=0, le=600, description="Wait before the first restart, in seconds.")
    backoff_factor: float = Field(
        2.0, ge=1, le=10, description="Each further restart waits this times longer."
    )
    backoff_max_s: float = Field(60.0, ge=0, le=3600, description="Upper bound of the wait, in seconds.")
    max_without_progress: int = Field(
        1,
        ge=1,
        le=100,
        description="Restarted groups in a row that fail before training a step, after which the job "
        "fails (a failure that repeats before the first step is not fixed by restarting).",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Restarts:
        if self.backoff_max_s < self.backoff_s:
            raise ValueError(
                f"backoff_max_s ({self.backoff_max_s:g}) is below backoff_s ({self.backoff_s:g})"
            )
        return self

    def backoff(self, restart: int) -> float:
        """Seconds to wait before restart number ``restart`` (1 = the first)."""
        return min(self.backoff_max_s, self.backoff_s * self.backoff_factor ** max(0, restart - 1))


class Observation(Section):
    """What every `observe` action inherits unless its own `pass:` says otherwise."""

    onset_margin_steps: int = Field(
        20,
        ge=0,
        le=10_000,
        description=(
            "The window runs at least until the incident's original onset step plus this margin, "
            "so a fault that comes back at its own step is seen inside the window."
        ),
    )
    throughput: bool | Literal["auto"] = Field(
        "auto",
        description=(
            "Whether throughput is a pass criterion: true, false, or `auto`: only when the plan's fix can "
            "change how fast a step runs (a precision change). LR, clipping and data fixes do not; a "
            "window judged on speed then fails on a busy neighbour, not on the fix."
        ),
    )
    throughput_min_ratio: float = Field(
        0.5,
        gt=0,
        le=1,
        description=(
            "Pass when the window's sustained tokens/s (90th percentile) is at least this share of the "
            "same run's sustained tokens/s before the onset; a noisy neighbour slows only some steps."
        ),
    )


class Recurrence(Section):
    """When a new incident is the old one coming back, and how often that may happen."""

    reopen_within_steps: int = Field(
        300,
        ge=0,
        description=(
            "A new incident whose onset is within this many steps of a resolved incident's onset (or of "
            "the end of its observation window) reopens that incident (same id, next attempt); 0: never."
        ),
    )
    max_attempts: int = Field(
        3, ge=1, le=20, description="Recovery attempts of one incident, reopens included, before escalating."
    )


class RankOffenders(Section):
    """When rank-local incidents on one rank stop being transients and make it a hardware suspect."""

    count: int = Field(
        3,
        ge=1,
        le=100,
        description="Rank-local incidents on the same rank (this one included) that escalate.",
    )
    window_steps: int = Field(
        2000, ge=1, description="Only incidents whose onsets lie within this many steps count."
    )

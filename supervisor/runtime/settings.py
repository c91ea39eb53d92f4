"""Runtime knobs that are not part of job.yaml (they describe the supervisor, not the job).

Each has a default that suits a real run; tests shrink the deadlines. The values travel to
the supervisor actor as a plain dict.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from supervisor.logging import current_level


class RuntimeSettings(BaseModel):
    """How the supervisor drives the worker group."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    loop_interval_s: float = Field(0.05, gt=0, description="Sleep of one idle loop iteration.")
    export_interval_s: float = Field(
        2.0, gt=0, description="At most this often, changed incidents are exported as JSON to storage."
    )
    step_deadline_s: float = Field(
        10.0, gt=0, description="A step missing some ranks for this long is analysed with the ranks present."
    )
    directive_timeout_s: float = Field(
        120.0,
        gt=0,
        description="An action waiting for every rank to acknowledge a directive fails after this.",
    )
    healthy_after_steps: int = Field(
        20, ge=1, description="A verified checkpoint becomes healthy after this many anomaly-free steps."
    )
    buffer_records: int = Field(
        100_000, ge=100, description="Records a worker buffers while the supervisor is away (oldest dropped)."
    )
    flush_interval_s: float = Field(0.2, gt=0, description="How often a worker flushes its record batch.")
    poll_interval_s: float = Field(0.1, gt=0, description="How often a worker polls for directives.")
    startup_timeout_s: float = Field(
        600.0, gt=0, description="A rank with no record this long after its group started counts as hung."
    )
    max_group_restarts: int = Field(3, ge=0, description="Worker-group restarts before the job is failed.")
    trace_path: str | None = Field(
        None, description="Append every record the supervisor receives to this JSONL trace (for `analyze`)."
    )
    dist_timeout_s: float = Field(300.0, gt=0, description="torch.distributed collective timeout.")
    replay_timeout_s: float = Field(300.0, gt=0, description="A replay task running longer fails.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default_factory=current_level,  # type: ignore[arg-type]
        description="Level of the supervisor's and workers' own log lines (default: the launching CLI's).",
    )

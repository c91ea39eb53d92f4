"""job.yaml's ``runtime:`` section: how the supervisor drives the worker group.

``RuntimeSettings`` (below) is every knob of it plus the two job.yaml spells elsewhere
(``telemetry.trace`` is the trace path; ``log_level`` defaults to the launching command's
``--log-level``). Defaults suit a real run; tests and drills shrink the deadlines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from supervisor.logging import current_level

if TYPE_CHECKING:
    from supervisor.config.job import JobSpec

_DAY_S = 86_400.0
_WEEK_S = 7 * _DAY_S


class RuntimeSection(BaseModel):
    """How the supervisor drives the worker group (job.yaml ``runtime:``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    loop_interval_s: float = Field(
        0.2,
        gt=0,
        le=60,
        description="The longest an idle supervisor loop waits: records, acks, a stop request or a finished "
        "task wake it at once; deadlines and the worker group's health are checked at least this often.",
    )
    export_interval_s: float = Field(
        2.0,
        gt=0,
        le=_DAY_S,
        description="At most this often, changed incidents are exported as JSON to storage.",
    )
    step_deadline_s: float = Field(
        10.0,
        gt=0,
        le=_DAY_S,
        description="A step missing some ranks for this long is analysed with the ranks present.",
    )
    directive_timeout_s: float = Field(
        120.0,
        gt=0,
        le=_WEEK_S,
        description="An action waiting for every rank to acknowledge a directive fails after this.",
    )
    healthy_after_steps: int = Field(
        20,
        ge=1,
        le=10**9,
        description="A verified checkpoint becomes healthy after this many anomaly-free steps.",
    )
    buffer_records: int = Field(
        100_000,
        ge=100,
        le=10**8,
        description="Records a worker buffers while the supervisor is away (oldest dropped).",
    )
    flush_interval_s: float = Field(
        0.05,
        gt=0,
        le=3600,
        description="How often a command entrypoint's process (torchrun, a framework script) sends its "
        "buffered records to its rank's worker; an in-process rank sends each record as it is made.",
    )
    poll_interval_s: float = Field(0.1, gt=0, le=3600, description="How often a worker polls for directives.")
    relay_from_ranks: int = Field(
        16,
        ge=0,
        le=10**7,
        description="A job of this many ranks or more sends its records through one relay actor per node, "
        "so the supervisor takes one call per node instead of one per rank; 0: never.",
    )
    startup_timeout_s: float = Field(
        600.0,
        gt=0,
        le=_WEEK_S,
        description="A rank with no record this long after its group started counts as hung.",
    )
    max_group_restarts: int = Field(
        3, ge=0, le=10_000, description="Worker-group restarts before the job is failed."
    )
    dist_timeout_s: float = Field(
        300.0, gt=0, le=_WEEK_S, description="torch.distributed collective timeout."
    )
    replay_timeout_s: float = Field(
        300.0, gt=0, le=_WEEK_S, description="A replay task running longer fails."
    )
    niceness: int = Field(
        0,
        ge=0,
        le=19,
        description="Priority of the ranks, replay tasks and supervisor, added to the Ray node's own "
        "(that of `ray start`, or of `supervisor launch` for a local Ray). 0: training is the job's "
        "main work and runs as the launching user's processes do, as Ray Jobs runs a job's entrypoint; "
        "Ray's default for actors, +15, leaves the ranks a few percent of a core whenever any other "
        "process on the node is busy.",
    )
    log_level: Literal["debug", "info", "warning", "error"] | None = Field(
        None,
        description="Level of the supervisor's and workers' own log lines (default: `launch --log-level`).",
    )


class RuntimeSettings(RuntimeSection):
    """The supervisor's runtime knobs, built by ``settings_for(job)`` (tests pass their own); they
    travel to the actors as a plain dict."""

    model_config = ConfigDict(strict=False)

    trace_path: str | None = Field(
        None,
        description="Write every record the supervisor receives to per-rank JSONL traces "
        "(job.yaml `telemetry.trace`; `{rank}` in the name is filled in, else `.rankN` is added).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default_factory=current_level,  # type: ignore[arg-type]
        description="Level of the supervisor's and workers' own log lines (default: the launching CLI's).",
    )


def settings_for(job: JobSpec) -> RuntimeSettings:
    """The settings job.yaml asks for: its ``runtime:`` section and ``telemetry.trace``."""
    chosen = job.runtime.model_dump(exclude_unset=True, exclude_none=True)
    if job.telemetry.trace is not None:
        chosen["trace_path"] = job.telemetry.trace
    return RuntimeSettings.model_validate(chosen)

"""The ``observability:`` section of job.yaml: where the supervisor publishes what it sees."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class MetricsSettings(_Section):
    """A Prometheus endpoint (``/metrics``) served by the supervisor's process."""

    port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve Prometheus metrics on this port (0: any free port); absent: off.",
    )
    host: str = Field("0.0.0.0", description="Address to listen on (`127.0.0.1`: this machine only).")  # noqa: S104
    checkpoint_refresh_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Seconds between reads of the checkpoint manifests (S3 listings cost).",
    )


class TensorBoardSettings(_Section):
    """TensorBoard event files mirroring the supervisor's view, with incident markers."""

    logdir: str | None = Field(
        None,
        description="Write event files here (one run per training timeline: `timeline-0`, `timeline-1` "
        "after the first rollback, ...); absent: off. Needs the `tensorboard` extra.",
    )


class ObservabilitySettings(_Section):
    """Metrics and training-log sinks of the supervisor (all off unless set)."""

    metrics: MetricsSettings = Field(default_factory=MetricsSettings)  # type: ignore[arg-type]
    tensorboard: TensorBoardSettings = Field(default_factory=TensorBoardSettings)  # type: ignore[arg-type]

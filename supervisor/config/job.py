"""job.yaml: what to train, where, and how the supervisor watches it.

Each section is its own pydantic model with a docstring per field; unknown keys are errors.
``supervisor schema job`` prints the JSON schema generated from these models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from supervisor.config.detector import DetectorKnobs
from supervisor.config.loader import check_model, load_model
from supervisor.config.observability import ObservabilitySettings
from supervisor.config.runtime import RuntimeSection
from supervisor.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENTRY_FUNC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
MAX_WORKERS = 65_536
"""No real job has more ranks; a bigger number is a typo (``num_workers: 1e12``)."""
MAX_STEPS = 10**12


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Resources(Section):
    """The worker group: one Ray worker per data-parallel rank."""

    num_workers: int = Field(
        1, ge=1, le=MAX_WORKERS, description="Number of training workers (data-parallel ranks)."
    )
    cpus_per_worker: float = Field(1.0, gt=0, le=4096, description="Logical CPUs Ray reserves per worker.")
    gpus_per_worker: float = Field(
        0.0, ge=0, le=64, description="GPUs per worker; > 0 selects NCCL, else gloo."
    )
    wait_for_nodes_s: float = Field(
        0.0,
        ge=0,
        le=7 * 86_400,
        description="How long a worker group that the cluster's live nodes cannot hold (a node was "
        "lost) waits for nodes to join, e.g. an autoscaler replacing the lost one, before the job "
        "fails (or, with `min_workers`, restarts on fewer ranks). 0: at once.",
    )
    min_workers: int | None = Field(
        None,
        ge=1,
        le=MAX_WORKERS,
        description="Fewest data-parallel ranks the group may run with when the cluster's live nodes "
        "cannot hold `num_workers` (a node was lost): it then starts with as many ranks as fit, at "
        "least this many, each with the same batch (the global batch shrinks), from the same data "
        "position, the checkpoint resharded on load. Every restart tries `num_workers` first. "
        "Absent: `num_workers` (the job fails when the full group does not fit).",
    )

    @model_validator(mode="after")
    def _min_workers(self) -> Resources:
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must be <= num_workers ({self.num_workers})")
        return self

    @property
    def fewest_workers(self) -> int:
        """The fewest ranks the group may run with (``min_workers``, else ``num_workers``)."""
        return self.num_workers if self.min_workers is None else self.min_workers


class RaySection(Section):
    """Where Ray runs."""

    address: str | None = Field(
        None,
        description="Absent or `local`: start a fresh local Ray for this job, even when another "
        "cluster runs on the machine. `auto`: join the cluster started on this machine with "
        "`ray start` (or named by $RAY_ADDRESS). `host:port` or `ray://host:port`: join that cluster.",
    )
    runtime_env: dict[str, Any] = Field(default_factory=dict, description="Ray runtime_env for the workers.")
    num_cpus: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="Logical CPUs of a local Ray started by the supervisor (default: enough for the job).",
    )

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        if v is None or v in ("auto", "local") or re.match(r"^(ray://)?[\w.-]+:\d{1,5}$", v):
            return v
        raise ValueError(f"must be `local`, `auto`, `host:port` or `ray://host:port` (got {v!r})")


class Storage(Section):
    """Where checkpoints and incident exports live."""

    path: str = Field(description="A local directory or `s3://bucket/prefix`.")
    endpoint_url: str | None = Field(None, description="S3 endpoint for MinIO/Ceph-style servers.")
    region: str | None = Field(None, description="S3 region.")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be empty")
        if v.startswith("s3://") and not re.match(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$", v):
            raise ValueError(f"not a valid `s3://bucket/prefix` (got {v!r})")
        return v

    @property
    def is_s3(self) -> bool:
        return self.path.startswith("s3://")


class CheckpointSection(Section):
    """How often to checkpoint and how many healthy checkpoints to keep."""

    every_steps: int = Field(
        100, ge=1, le=MAX_STEPS, description="Save a checkpoint every N optimizer steps."
    )
    keep: int = Field(
        3, ge=1, le=1_000_000, description="Keep the newest K healthy checkpoints (plus incident references)."
    )


class Telemetry(Section, DetectorKnobs):
    """Detector settings (window, min_history and the thresholds: ``config.detector``, the one
    definition the detector also uses) and what the ranks send."""

    hang_timeout_s: float = Field(
        120.0, gt=0, le=7 * 86_400, description="No record from a rank for this long: a hung worker."
    )
    fingerprint_every: int = Field(50, ge=1, le=MAX_STEPS, description="Parameter fingerprint every K steps.")
    canary_every: int = Field(
        0, ge=0, le=MAX_STEPS, description="Canary forward pass every K steps (0: off)."
    )
    trace: str | None = Field(
        None,
        description="Write the supervised run's telemetry as per-rank JSONL traces here (for `analyze` "
        "and `policy explain`): `{rank}` in the name is filled in, else `.rankN` is added for "
        "more than one rank. Relative paths are relative to where `launch` runs.",
    )

    @field_validator("trace")
    @classmethod
    def _trace(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty (leave it out for no trace)")
        return v


class Alert(Section):
    """Where `alert` actions go besides the log (payloads: supervisor/observability/alerts.py)."""

    webhook_url: str | None = Field(
        None,
        description="POSTed the incident summary, retried; `env:NAME` reads the URL from $NAME when sending. "
        "Headers come from SUPERVISOR_ALERT_HEADER_<NAME> variables (e.g. ..._AUTHORIZATION).",
    )
    format: Literal["json", "slack"] = Field(
        "json",
        description="`json`: a generic document (with `text`); `slack`: `text` + `blocks` (Block Kit).",
    )


class Incidents(Section):
    """The incident store."""

    db: str | None = Field(
        None,
        description="SQLite file. Default: <storage>/incidents.sqlite for local storage, "
        "~/.local/state/spike-supervisor/incidents.sqlite for S3.",
    )


class Fault(BaseModel):
    """A fault injected for a drill (off unless listed). `kind` picks it; other keys are its parameters."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, allow_inf_nan=False)

    kind: str = Field(description="Fault name; see `supervisor drill --list`.")
    step: int | None = Field(None, ge=0, le=MAX_STEPS, description="Step at which it starts.")
    rank: int | None = Field(
        None, ge=0, lt=MAX_WORKERS, description="Rank it affects, where it is rank-local."
    )


class JobSpec(Section):
    """A supervised training job."""

    name: str = Field(description="Job name: letters, digits, `_`, `-`, `.`; names its storage folder.")
    entrypoint: str = Field(
        description="`package.module:function`, a path to a Python script defining `main(config, ctx)`, "
        "or a command run once per rank in its own process (`python train.py --lr 3e-4`; torchrun-style)."
    )
    args: list[str] | None = Field(
        None,
        description="Command-line arguments: with `args:` (even `[]`) a `.py` entrypoint is run as a "
        "torchrun-style command (`python <script> <args>`) instead of calling its `main(config, ctx)`.",
    )
    config: dict[str, Any] = Field(
        default_factory=dict, description="Passed to the entrypoint as its config."
    )
    resources: Resources = Field(default_factory=Resources)  # type: ignore[arg-type]
    ray: RaySection = Field(default_factory=RaySection)  # type: ignore[arg-type]
    storage: Storage
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)  # type: ignore[arg-type]
    telemetry: Telemetry = Field(default_factory=Telemetry)  # type: ignore[arg-type]
    policy: str = Field(
        "default", description="A shipped policy name (see policies/) or a path to a YAML file."
    )
    max_steps: int = Field(ge=1, le=MAX_STEPS, description="Optimizer steps to train.")
    alert: Alert = Field(default_factory=Alert)  # type: ignore[arg-type]
    observability: ObservabilitySettings = Field(default_factory=ObservabilitySettings)
    incidents: Incidents = Field(default_factory=Incidents)  # type: ignore[arg-type]
    faults: list[Fault] = Field(default_factory=list, description="Drill faults (see examples/drills).")
    runtime: RuntimeSection = Field(default_factory=RuntimeSection)  # type: ignore[arg-type]
    mode: Literal["supervised", "observe_only"] = Field(
        "supervised",
        description="`supervised`: the policy acts on incidents. `observe_only`: detect, diagnose and "
        "record incidents but run no policy action (no alert, freeze, rollback or fix); a crashed "
        "worker group is still restarted from a verified checkpoint.",
    )
    recovery: Literal["auto", "restart"] = Field(
        "auto",
        description="How a rollback is carried out. `auto`: in place (every rank loads the target into its "
        "live model and optimizer) when the target is the supervisor's own checkpoint, a restart of the "
        "worker group when it is a framework's (HF `checkpoint-N/`, Lightning `.ckpt`), which the framework "
        "loads through its own resume path. `restart`: every rollback restarts the worker group "
        "(docs/integrations.md).",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"must match {_NAME.pattern} (got {v!r})")
        return v

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: str) -> str:
        if _ENTRY_FUNC.match(v) or v.endswith(".py") or len(v.split()) > 1:
            return v
        raise ValueError(
            f"must be `module:function`, a `.py` script path or a command like `python train.py` (got {v!r})"
        )

    @property
    def is_command(self) -> bool:
        """Run as its own process per rank (torchrun-style) rather than called inside the worker actor."""
        return self.args is not None or len(self.entrypoint.split()) > 1

    @model_validator(mode="after")
    def _window(self) -> JobSpec:
        if self.telemetry.min_history > self.telemetry.window:
            raise ValueError("telemetry.min_history must be <= telemetry.window")
        if self.args is not None and _ENTRY_FUNC.match(self.entrypoint):
            raise ValueError("args: only with a script or command entrypoint, not `module:function`")
        return self


def load_job(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    """Load and validate a job.yaml (with ``--set key=value`` overrides); ConfigError names file and field."""
    return load_model(JobSpec, path, overrides=overrides)


def check_job_file(
    path: str | Path, overrides: Sequence[str] = (), *, data: Any = None
) -> tuple[JobSpec | None, list[ConfigError]]:
    """(job, []) or (None, every schema error), each a one-line ConfigError naming file and field."""
    job, problems = check_model(JobSpec, path, overrides=overrides, data=data)
    return job, [
        p if isinstance(p, ConfigError) else ConfigError(p.message, source=p.source, field=p.field)
        for p in problems
    ]


def job_schema() -> dict[str, Any]:
    return JobSpec.model_json_schema()

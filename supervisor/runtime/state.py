"""The job's phase (explicit, with ``is_terminal``) and the supervisor state that survives restarts.

::

    starting ──► running ◄──► incident ──► escalated
                   │  ▲            │
                   │  └─ restarting ◄── (worker died / hung / node lost)
                   ├──► finished
                   ├──► failed      (group restarts exhausted, or the job itself raised)
                   └──► stopped     (`supervisor stop`)

The incident's own states live in the incident store (supervisor.incidents.states); the
phase says what the *job* is doing.
"""

from __future__ import annotations

import json
import os
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class JobPhase(str, Enum):
    STARTING = "starting"
    """Ray connected; the worker group is being placed."""
    RUNNING = "running"
    """Training; records flow; no incident is being acted on."""
    INCIDENT = "incident"
    """A plan is being carried out (training may be frozen)."""
    RESTARTING = "restarting"
    """The worker group is being replaced from the newest verified checkpoint."""
    FINISHED = "finished"
    """Every rank finished its steps."""
    ESCALATED = "escalated"
    """Stopped with state saved; a person must decide."""
    FAILED = "failed"
    """The job cannot go on (restarts exhausted, the training function raised, bad input)."""
    STOPPED = "stopped"
    """Stopped on request."""

    @property
    def is_terminal(self) -> bool:
        return self in (JobPhase.FINISHED, JobPhase.ESCALATED, JobPhase.FAILED, JobPhase.STOPPED)

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for a job that ended in this phase (0 only when finished healthy)."""
        return 0 if self is JobPhase.FINISHED else 1


class ActivePlan(BaseModel):
    """The plan being carried out for one incident, and how far it got."""

    model_config = ConfigDict(extra="forbid")

    incident_id: int
    plan_no: int
    plan: dict[str, Any]
    index: int = 0
    baseline: dict[str, Any] | None = None
    observation_failures: int = 0


class RuntimeState(BaseModel):
    """Everything a restarted supervisor needs besides the incident store and the checkpoints."""

    model_config = ConfigDict(extra="forbid")

    job: str
    phase: JobPhase = JobPhase.STARTING
    reason: str = ""
    generation: int = 0
    group_restarts: int = 0
    directives: list[dict[str, Any]] = Field(default_factory=list)
    watermark: int = -1
    analyzer: Any = None
    active: ActivePlan | None = None
    incident_keys: dict[str, int] = Field(default_factory=dict)
    attempts: dict[str, int] = Field(default_factory=dict)
    last_incident_step: int | None = None
    frozen: bool = False
    checkpoints_seen: list[int] = Field(default_factory=list)
    checkpoints_verified: list[int] = Field(default_factory=list)
    checkpoints_healthy: list[int] = Field(default_factory=list)

    def save(self, path: Path) -> None:
        """Atomic: write a temp file, fsync, rename over the old one."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        data = self.model_dump_json(indent=None)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> RuntimeState | None:
        try:
            return cls.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return None

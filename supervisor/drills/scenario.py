"""A fire-drill scenario: a small job, the faults injected into it, and what the supervisor must do.

``examples/drills/<name>.yaml``::

    name: garbage_batch
    description: one rank is fed a batch of random bytes once
    base: _base.yaml            # the job it starts from (relative to this file)
    job: {max_steps: 200}       # deep-merged over the base (faults come from `faults:` below)
    faults:
      - {kind: garbage_batch, step: 100, rank: 1}
    expect:
      phenotype: transient
      top_cause: data
      actions: [alert, apply]
      no_actions: [rollback]

The merged job is validated as a ``JobSpec`` and the faults by their own models, so a bad
scenario fails at load with ``<file>: <field>: <what>``. Files whose name starts with ``_``
are not scenarios (shared bases).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from supervisor.config.job import JobSpec
from supervisor.config.loader import load_model, read_yaml
from supervisor.core.model import Cause, Phenotype
from supervisor.core.policy import action_names
from supervisor.drills.specs import FaultParams, parse_faults
from supervisor.errors import ConfigError
from supervisor.incidents.states import EventKind, IncidentState

#: Where the shipped scenarios live (``supervisor drill`` looks here by default).
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "examples" / "drills"

Attribute = Literal["nonfinite", "rank_local", "after_resume", "source_local"]


class Expect(BaseModel):
    """What the supervisor must have done; absent fields are not checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    incident: bool = Field(
        True, description="An incident is opened at or after the first fault (false: none)."
    )
    phenotype: list[Phenotype] | None = Field(None, description="Accepted phenotypes of that incident.")
    top_cause: list[Cause] | None = Field(None, description="Accepted top causes.")
    first_rank: int | None = Field(None, ge=0, description="The rank that deviated first.")
    attributes: list[Attribute] = Field(
        default_factory=list, description="Attributes the diagnosis must carry."
    )
    actions: list[str] = Field(
        default_factory=list, description="Policy actions that must have been carried out."
    )
    attempted: list[str] = Field(
        default_factory=list, description="Actions that must have been started (done or failed)."
    )
    no_actions: list[str] = Field(
        default_factory=list, description="Actions that must never be taken in the run."
    )
    incident_state: list[IncidentState] = Field(
        default_factory=lambda: [IncidentState.RESOLVED], description="Accepted final states of the incident."
    )
    job_phase: Literal["finished", "unfinished", "escalated", "failed", "stopped"] = Field(
        "finished", description="How the job must end (`finished`: every step trained)."
    )
    report: bool = Field(True, description="An HTML postmortem renders from the incident store.")
    exported: bool = Field(True, description="The incident's JSON export exists in the job's storage.")
    recovered: bool = Field(
        True, description="Loss over the observation window is back in the pre-incident band."
    )
    final_loss_tolerance: float | None = Field(
        0.05,
        gt=0,
        description="Final loss within this relative distance of the clean run's (null: not checked).",
    )
    events: list[EventKind] = Field(
        default_factory=list, description="Timeline events the incident must hold."
    )
    restarts: int = Field(0, ge=0, description="At least this many worker-group restarts.")
    resumed_from: int | None = Field(
        None,
        ge=0,
        description="The first restart resumed from this checkpoint step (e.g. not a corrupt one).",
    )

    rollbacks: int | None = Field(
        None, ge=0, description="Exactly this many rollbacks in the whole run (the fault handled once)."
    )
    latest_healthy: bool = Field(
        False, description="At the end `latest` names the newest healthy checkpoint and no block holds it."
    )
    killed: bool = Field(False, description="The scenario's `kill:` point was reached and the kill done.")

    quarantined: list[int] = Field(
        default_factory=list,
        description="Checkpoint steps holding a save found corrupt (its verification failed, or the "
        "ranks' restore check refused it) and kept quarantined (as the live manifest, or as history "
        "beside a re-save).",
    )

    @field_validator("phenotype", "top_cause", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("actions", "attempted", "no_actions")
    @classmethod
    def _known_actions(cls, v: list[str]) -> list[str]:
        unknown = [a for a in v if a not in action_names()]
        if unknown:
            raise ValueError(f"unknown action {unknown[0]!r}; valid: {', '.join(action_names())}")
        return v


KillPoint = Literal["before_detection", "open", "frozen", "acting", "observing", "resuming", "action_began"]


class Kill(BaseModel):
    """Kill a process of the run when its incident reaches a state (the kill-anywhere family).

    ``supervisor``: the supervisor actor's process is killed; Ray restarts it and it resumes
    from its state file, the incident store and the records the workers still hold.
    ``worker``: rank ``rank``'s actor is killed; the group restarts.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: Literal["supervisor", "worker"] = Field("supervisor", description="The process to kill.")
    at: KillPoint = Field(description="The incident state at which it is killed.")
    step: int | None = Field(
        None, ge=1, description="`before_detection`: kill once the job reports this step (before the fault)."
    )
    rank: int = Field(1, ge=0, description="`worker`: the rank whose actor is killed.")
    action: str | None = Field(
        None,
        description="`action_began`: kill inside the first second after this action of the plan began "
        "(the effect boundary just after the action before it was recorded done; `observe`: the first "
        "second of the observation window).",
    )
    delay_s: float = Field(
        0.0, ge=0, le=60, description="Wait this long after the point is reached, then kill."
    )
    mode: Literal["detach", "foreground"] = Field(
        "detach",
        description="`detach`: the supervisor runs as `launch --detach` runs it and Ray restarts it; "
        "`foreground`: as a foreground `launch` runs it, and a new supervisor attaches after the kill "
        "(`launch --attach`).",
    )

    @model_validator(mode="after")
    def _action_named(self) -> Kill:
        if (self.at == "action_began") != (self.action is not None):
            raise ValueError("`action` is given with `at: action_began`, and only then")
        if self.action is not None and self.action not in action_names():
            raise ValueError(f"unknown action {self.action!r}; valid: {', '.join(action_names())}")
        return self


class Scenario(BaseModel):
    """One drill scenario file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Equal to the file name without `.yaml`.")
    description: str = Field(description="One line: what goes wrong.")
    base: str = Field("_base.yaml", description="The job file this scenario starts from (relative path).")
    job: dict[str, Any] = Field(default_factory=dict, description="Overrides deep-merged into the base job.")
    faults: list[dict[str, Any]] = Field(
        default_factory=list, description="Faults (see `supervisor drill --list`)."
    )
    expect: Expect = Field(default_factory=Expect)  # type: ignore[arg-type]
    kill: Kill | None = Field(None, description="Kill a process at an incident state (see `Kill`).")
    timeout_s: float = Field(600.0, gt=0, description="Wall-clock limit of the run.")


class LoadedScenario:
    """A validated scenario with its merged job and parsed faults."""

    def __init__(
        self, path: Path, scenario: Scenario, job: dict[str, Any], faults: list[FaultParams]
    ) -> None:
        self.path, self.scenario, self.job_data, self.faults = path, scenario, job, faults

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def expect(self) -> Expect:
        return self.scenario.expect

    @property
    def first_fault_step(self) -> int | None:
        return min((f.step for f in self.faults), default=None)

    def without_faults(self, name: str) -> LoadedScenario:
        """The same job with no fault, expected to stay quiet: a clean reference for this config."""
        quiet = Expect.model_validate({"incident": False, "recovered": False, "final_loss_tolerance": None})
        scenario = self.scenario.model_copy(update={"name": name, "faults": [], "expect": quiet})
        return LoadedScenario(self.path, scenario, {**self.job_data, "faults": []}, [])

    def job_spec(self, storage: Path, *, job_name: str | None = None) -> JobSpec:
        """The job to launch: storage under ``storage``, named ``drill-<name>`` unless given."""
        data = _merge(
            self.job_data, {"name": job_name or f"drill-{self.name}", "storage": {"path": str(storage)}}
        )
        return JobSpec.model_validate(data)

    def config_hash(self) -> str:
        """What the clean reference depends on: the job without name, storage, faults and telemetry."""
        keep = {
            k: v
            for k, v in self.job_data.items()
            if k not in ("name", "storage", "faults", "telemetry", "incidents")
        }
        return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_scenario(path: str | Path) -> LoadedScenario:
    """Validate a scenario file; ConfigError names the file and field."""
    path = Path(path)
    scenario = load_model(Scenario, path)
    if scenario.name != path.stem:
        raise ConfigError(
            f"must equal the file name {path.stem!r} (got {scenario.name!r})", source=str(path), field="name"
        )
    base_path = (path.parent / scenario.base).resolve()
    base = read_yaml(base_path)
    if not isinstance(base, dict):
        raise ConfigError("the base job must be a mapping", source=str(base_path))
    merged = _merge(base, scenario.job)
    merged["faults"] = list(scenario.faults)
    try:
        load_model(JobSpec, path, data=_merge(merged, {"name": f"drill-{scenario.name}"}))
    except ConfigError as exc:
        raise ConfigError(
            exc.message, source=str(path), field=f"job.{exc.field}" if exc.field else "job"
        ) from None
    faults = parse_faults(scenario.faults, source=str(path))
    return LoadedScenario(path, scenario, merged, faults)


def scenario_paths(directory: Path = SCENARIO_DIR) -> list[Path]:
    return sorted(p for p in directory.glob("*.yaml") if not p.name.startswith("_"))


def find_scenarios(names: list[str], directory: Path = SCENARIO_DIR) -> list[LoadedScenario]:
    """``all`` (or nothing) means every scenario; an unknown name lists the valid ones."""
    paths = {p.stem: p for p in scenario_paths(directory)}
    if not names or names == ["all"]:
        return [load_scenario(p) for p in paths.values()]
    unknown = [n for n in names if n not in paths]
    if unknown:
        raise ConfigError(
            f"unknown drill {unknown[0]!r}; valid: all, {', '.join(paths)}", source=str(directory)
        )
    return [load_scenario(paths[n]) for n in names]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out

"""What the engine reads (``JobState``) and what it returns (``Plan``): plain frozen values.

The runtime builds a ``JobState``, asks the engine for a ``Plan``, records ``Plan.to_json()`` in
the incident timeline, and only then executes the actions in order. A ``PlannedAction`` carries
its resolved arguments typed (``args``) and as JSON (``params``). As a pydantic field a ``Plan``
validates from a Plan or its JSON (older recorded plans included) and serializes to its JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

from supervisor.core.model import HealthMark
from supervisor.core.policy.actions import parse_args
from supervisor.core.policy.args import Args

Supervision = Literal["steer", "observe"]
"""How deeply the job is supervised (docs/integrations.md, "Recovery: in place or a restart, and
why"): `steer` (the SDK owns the step boundary) or `observe` (records only; recovery restarts the
group through the framework's resume path)."""
Recovery = Literal["none", "in_place", "restart"]


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """A checkpoint the rollback could target: its step and health mark."""

    step: int
    mark: HealthMark

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "mark": self.mark.value}


@dataclass(frozen=True)
class JobState:
    """The job as the engine needs to see it when an incident is (re)planned (None: not known).

    ``attempts``: recoveries started per rule name; ``observation_failures``, ``incident_attempt``
    and ``earlier_onsets``: of *this* incident (a reopened one brings its earlier attempts; a
    rollback before an earlier onset re-runs its data); ``steps_since_last_incident`` drives the
    cooldown; ``checkpoints``: None when the runtime picks the target at execution time.
    What the job runs now, so fixes are relative to it: ``lr`` (of the last healthy step),
    ``lr_scale`` (the supervisor's override in force), ``grad_clip`` (0: no clipping),
    ``grad_norm`` (median before the onset). ``rank_incidents``: (onset, rank) of earlier
    rank-local incidents; ``checkpoint_every``: the first interval within which the run's start is
    a rollback target, lengthened by ``healthy_after`` (the steps after a checkpoint before it can be
    marked healthy) for a rollback that needs a healthy one; ``max_steps``: what a re-warm to the
    onset is weighed against.
    """

    step: int
    attempts: Mapping[str, int] = field(default_factory=dict)
    observation_failures: int = 0
    steps_since_last_incident: int | None = None
    checkpoints: Sequence[CheckpointRef | tuple[int, HealthMark | str]] | None = None
    state_maybe_nonfinite: bool = False
    lr: float | None = None
    lr_scale: float = 1.0
    grad_clip: float | None = None
    grad_norm: float | None = None
    supervision: Supervision = "steer"
    incident_attempt: int = 0
    rank_incidents: Sequence[tuple[int, int]] = ()
    checkpoint_every: int | None = None
    healthy_after: int = 0
    max_steps: int | None = None
    can_replay: bool | None = None
    earlier_onsets: Sequence[int] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "attempts", MappingProxyType(dict(self.attempts)))
        object.__setattr__(self, "earlier_onsets", tuple(sorted({int(s) for s in self.earlier_onsets})))
        object.__setattr__(self, "rank_incidents", tuple((int(s), int(r)) for s, r in self.rank_incidents))
        if self.checkpoints is not None:
            object.__setattr__(self, "checkpoints", _refs(self.checkpoints))

    @property
    def checkpoint_refs(self) -> tuple[CheckpointRef, ...] | None:
        """The checkpoints as ``CheckpointRef`` values, oldest first (None: unknown)."""
        return None if self.checkpoints is None else _refs(self.checkpoints)

    def to_json(self) -> dict[str, Any]:
        """Every field in the order declared, as JSON values."""
        refs = self.checkpoint_refs
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "attempts": dict(self.attempts),
            "checkpoints": None if refs is None else [c.to_json() for c in refs],
            "rank_incidents": [list(x) for x in self.rank_incidents],
            "earlier_onsets": list(self.earlier_onsets),
        }


def _refs(items: Iterable[CheckpointRef | tuple[int, HealthMark | str]]) -> tuple[CheckpointRef, ...]:
    refs = [c if isinstance(c, CheckpointRef) else CheckpointRef(int(c[0]), HealthMark(c[1])) for c in items]
    return tuple(sorted(refs, key=lambda c: c.step))


@dataclass(frozen=True)
class PlannedAction:
    """One step of a plan, its parameters resolved (``args``: their typed view, validated once)."""

    name: str
    params: Mapping[str, Any]
    reason: str
    on_failure: str = "escalate"
    args: Args = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        args = parse_args(self.name, self.params)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "params", MappingProxyType(args.to_json()))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "params": self.args.to_json(),  # a fresh copy of ``params``
            "reason": self.reason,
            "on_failure": self.on_failure,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PlannedAction:
        return cls(
            str(d["name"]),
            dict(d.get("params") or {}),
            str(d["reason"]),
            str(d.get("on_failure", "escalate")),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """The engine's decision for one incident: ``evidence`` names the findings it followed;
    ``recovery`` says how a rollback is carried out (``in_place`` by the SDK, or ``restart``)."""

    policy: str
    rule: str | None
    matched_because: str
    actions: tuple[PlannedAction, ...]
    escalate_reason: str | None = None
    notes: tuple[str, ...] = ()
    attempt: int = 1
    passed_over: tuple[tuple[str, str], ...] = ()
    """(rule, why it did not match) for every rule tried before the one that matched."""
    evidence: tuple[str, ...] = ()
    supervision: Supervision = "steer"
    recovery: Recovery = "none"

    @property
    def action_names(self) -> list[str]:
        return [a.name for a in self.actions]

    @property
    def escalates(self) -> bool:
        return self.escalate_reason is not None

    def action(self, name: str) -> PlannedAction | None:
        return next((a for a in self.actions if a.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "rule": self.rule,
            "matched_because": self.matched_because,
            "attempt": self.attempt,
            "escalate_reason": self.escalate_reason,
            "actions": [a.to_json() for a in self.actions],
            "notes": list(self.notes),
            "passed_over": [{"rule": r, "why": why} for r, why in self.passed_over],
            "evidence": list(self.evidence),
            "supervision": self.supervision,
            "recovery": self.recovery,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Plan:
        """The plan as recorded in the incident store (a restarted supervisor resumes from it)."""
        return cls(
            policy=str(d["policy"]),
            rule=d.get("rule"),
            matched_because=str(d.get("matched_because", "")),
            actions=tuple(PlannedAction.from_json(a) for a in d.get("actions", [])),
            escalate_reason=d.get("escalate_reason"),
            notes=tuple(d.get("notes", [])),
            attempt=int(d.get("attempt", 1)),
            passed_over=tuple((p["rule"], p["why"]) for p in d.get("passed_over", [])),
            evidence=tuple(d.get("evidence", [])),
            supervision=d.get("supervision", "steer"),
            recovery=d.get(
                "recovery",
                "in_place" if any(a.get("name") == "rollback" for a in d.get("actions", [])) else "none",
            ),
        )

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """As a pydantic field: validate from a Plan or its JSON, serialize to its JSON."""
        return core_schema.no_info_plain_validator_function(
            lambda value: value if isinstance(value, Plan) else cls.from_json(value),
            serialization=core_schema.plain_serializer_function_ser_schema(lambda p: p.to_json()),
        )

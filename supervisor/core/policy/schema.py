"""The policy file (YAML, `version: 1`) as pydantic models.

A policy is data, never code: ordered rules, each a match and an ordered list of actions,
with limits. An action entry is its name alone (``- freeze``) or its name with parameters
(``- rollback: {margin_steps: 100}``), optionally with ``on_failure``. Unknown actions and
fields are errors naming the path and the valid choices.
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, field_validator, model_validator

from supervisor.config.loader import format_validation_error
from supervisor.core.policy.actions import ACTIONS, TERMINAL, ActionParams, OnFailure, action_names
from supervisor.core.policy.match import Match
from supervisor.core.policy.settings import Observation, RankOffenders, Recurrence, Restarts, Section

_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")


class ActionSpec(Section):
    """One action of a rule: its registered name, validated parameters and failure handling."""

    action: str = Field(description=f"One of: {', '.join(sorted(ACTIONS))}.")
    params: SerializeAsAny[ActionParams] = Field(description="The action's parameters (see its model).")
    on_failure: OnFailure | None = Field(None, description="Default: the policy's `defaults.on_failure`.")

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, data: Any) -> Any:
        if isinstance(data, ActionSpec):
            return data
        name, raw, extra = _split(data)
        kind = ACTIONS.get(name) if isinstance(name, str) else None
        if kind is None:
            raise ValueError(f"unknown action {name!r} (valid: {', '.join(action_names())})")
        if isinstance(raw, ActionParams):
            return {"action": name, "params": raw, **extra}
        if not isinstance(raw, dict):
            raise ValueError(f"parameters of {name!r} must be a mapping (got {type(raw).__name__})")
        try:
            params = kind.params.model_validate(raw)
        except ValidationError as exc:
            field, msg = format_validation_error(exc)
            msg = with_valid_keys(kind.params, field, msg)
            raise ValueError(
                f"{name}: {msg}" if field == "(top level)" else f"{name}.{field}: {msg}"
            ) from None
        return {"action": name, "params": params, **extra}


def _split(data: Any) -> tuple[Any, Any, dict[str, Any]]:
    """(name, raw params, other keys) of an action entry in any accepted spelling."""
    if isinstance(data, str):
        return data, {}, {}
    if not isinstance(data, dict):
        raise ValueError(f"an action is a name or `name: {{params}}` (got {type(data).__name__})")
    if "action" in data:  # the normalized form, e.g. from model_dump()
        rest = {k: v for k, v in data.items() if k not in ("action", "params")}
        return data["action"], data.get("params") or {}, rest
    names = [k for k in data if k != "on_failure"]
    if len(names) != 1:
        raise ValueError(
            f"an action is one name with its parameters, e.g. `rollback: {{margin_steps: 100}}` (got keys {names})"
        )
    extra = {"on_failure": data["on_failure"]} if "on_failure" in data else {}
    raw = data[names[0]]
    return names[0], {} if raw is None else raw, extra


def with_valid_keys(model: type[BaseModel], field: str, msg: str) -> str:
    """Append the valid keys to an "unknown key" message, found by walking `field` through `model`."""
    if msg != "unknown key":
        return msg
    current = model
    for part in field.split(".")[:-1]:
        if part.isdigit():
            continue
        info = current.model_fields.get(part)
        inner = _model_in(info.annotation) if info is not None else None
        if inner is None:
            return msg
        current = inner
    names = [f.alias or n for n, f in current.model_fields.items()]
    return f"{msg} (valid: {', '.join(names)})"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside `X`, `list[X]`, `X | None`, `Annotated[...]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _model_in(arg)) is not None:
            return found
    return None


class Limits(Section):
    """Limits every rule inherits unless it sets its own."""

    max_attempts: int = Field(2, ge=1, le=20, description="Recoveries per rule before escalating.")
    cooldown_steps: int = Field(
        500, ge=0, description="Clean steps after which a rule's attempt count starts over."
    )
    max_observation_failures: int = Field(
        2, ge=1, le=2, description="Failed observation windows of one incident before escalating (at most 2)."
    )
    on_failure: OnFailure = Field("escalate", description="What a failed action leads to, unless it says.")


class Rule(Section):
    """Incidents this rule handles and the actions, in order."""

    name: str = Field(description="Unique name; attempts are counted per rule.")
    description: str = Field("", description="Why this rule exists.")
    match: list[Match] = Field(
        description="One mapping of conditions, or a list: the rule applies if any matches."
    )
    actions: list[ActionSpec] = Field(min_length=1, description="Actions in order.")
    max_attempts: int | None = Field(None, ge=1, le=20, description="Overrides defaults.max_attempts.")
    cooldown_steps: int | None = Field(None, ge=0, description="Overrides defaults.cooldown_steps.")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"must match {_NAME.pattern} (got {v!r})")
        return v

    @field_validator("match", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return [v]
        if v is None or v == []:
            raise ValueError("needs at least one set of conditions (use `match: {}` to match any incident)")
        return v

    @field_validator("actions")
    @classmethod
    def _reachable(cls, v: list[ActionSpec]) -> list[ActionSpec]:
        _check_reachable(v)
        return v


def _check_reachable(actions: list[ActionSpec]) -> None:
    for i, spec in enumerate(actions[:-1]):
        if spec.action in TERMINAL:
            raise ValueError(f"{actions[i + 1].action!r} after {spec.action!r} (action {i}) never runs")


class Policy(Section):
    """A rollback policy: the first rule whose match fits an incident decides the plan."""

    version: Literal[1] = Field(description="Policy format version.")
    name: str = Field(description="Policy name (shown in plans and incident records).")
    description: str = Field("", description="What this policy is for.")
    defaults: Limits = Field(default_factory=Limits)  # type: ignore[arg-type]
    restarts: Restarts = Field(default_factory=Restarts)  # type: ignore[arg-type]
    observation: Observation = Field(default_factory=Observation)  # type: ignore[arg-type]
    recurrence: Recurrence = Field(default_factory=Recurrence)  # type: ignore[arg-type]
    rank_offenders: RankOffenders = Field(default_factory=RankOffenders)  # type: ignore[arg-type]
    rules: list[Rule] = Field(min_length=1, description="Ordered; the first matching rule wins.")
    fallback: list[ActionSpec] = Field(
        default_factory=lambda: [ActionSpec.model_validate("alert"), ActionSpec.model_validate("escalate")],
        description="Actions when no rule matches (default: alert, escalate).",
    )

    @field_validator("rules")
    @classmethod
    def _unique(cls, v: list[Rule]) -> list[Rule]:
        seen: set[str] = set()
        for rule in v:
            if rule.name in seen:
                raise ValueError(f"rule name {rule.name!r} used twice")
            seen.add(rule.name)
        return v

    @field_validator("fallback")
    @classmethod
    def _fallback(cls, v: list[ActionSpec]) -> list[ActionSpec]:
        if not v:
            raise ValueError("needs at least one action (e.g. alert)")
        _check_reachable(v)
        return v


def policy_schema() -> dict[str, Any]:
    """JSON schema of a policy file, with each action entry spelled as it is written in YAML."""
    schema = Policy.model_json_schema()
    defs = schema.setdefault("$defs", {})
    entries: list[dict[str, Any]] = [{"type": "string", "enum": action_names()}]
    on_failure = {"enum": list(get_args(OnFailure)), "description": "Default: defaults.on_failure."}
    for name in action_names():
        params = ACTIONS[name].params.model_json_schema()
        for key, sub in params.pop("$defs", {}).items():
            defs.setdefault(key, sub)
        entries.append(
            {
                "type": "object",
                "description": ACTIONS[name].params.__doc__ or name,
                "properties": {name: {"anyOf": [params, {"type": "null"}]}, "on_failure": on_failure},
                "required": [name],
                "additionalProperties": False,
            }
        )
    defs["ActionSpec"] = {"description": ActionSpec.__doc__, "oneOf": entries}
    defs.pop("ActionParams", None)
    return schema

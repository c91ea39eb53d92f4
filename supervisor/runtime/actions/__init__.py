"""One registry entry per policy action (docs/architecture.md, Registries): its executor and the
payload keys of its timeline event that the incident reports read (``incidents.postmortem``).
What the action means is the action table's (``core.policy.actions``); ``check`` fails at start,
naming the valid actions, when the policy has an action the runtime cannot carry out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from supervisor.core.policy.actions import ACTIONS
from supervisor.errors import PolicyError
from supervisor.incidents import EventKind, IncidentState
from supervisor.runtime.actions.base import Executor, Outcome, Runtime
from supervisor.runtime.actions.checkpoints import BlockLatestAction, RollbackAction, SnapshotAction
from supervisor.runtime.actions.control import EscalateAction, FreezeAction, ResumeAction, StopAction
from supervisor.runtime.actions.fix import ApplyAction, ObserveAction
from supervisor.runtime.actions.notify import AlertAction
from supervisor.runtime.actions.replay import ReplayAction

Report = Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]


def _no_report(params: dict[str, Any], memo: dict[str, Any]) -> dict[str, Any]:
    return {}


def _rollback_report(params: dict[str, Any], memo: dict[str, Any]) -> dict[str, Any]:
    if "to_step" not in memo:
        return {}
    return {
        "from_step": memo["from_step"],
        "to_step": memo["to_step"],
        "checkpoint": f"step_{memo['to_step']:08d}",
    }


def _apply_report(params: dict[str, Any], memo: dict[str, Any]) -> dict[str, Any]:
    ex = params.get("exclude") or {}
    out = {
        k: params[k]
        for k in ("lr_scale", "warmup_steps", "grad_clip", "precision", "skip_batches")
        if params.get(k)
    }
    for key, src in (
        ("exclude_samples", "samples"),
        ("exclude_sources", "sources"),
        ("exclude_batches", "batch_range"),
    ):
        if ex.get(src):
            out[key] = ex[src]
    return out


def _observe_report(params: dict[str, Any], memo: dict[str, Any]) -> dict[str, Any]:
    return {"window": [memo["from_step"] + 1, memo["from_step"] + memo["steps"]], "steps": memo["steps"]}


@dataclass(frozen=True)
class ActionEntry:
    name: str
    executor: Executor
    report: Report = _no_report

    @property
    def event(self) -> EventKind:  # the action table's, as the incident store's type
        return EventKind(ACTIONS[self.name].event)

    @property
    def state(self) -> IncidentState | None:  # entered when the action begins (when that move is valid)
        enters = ACTIONS[self.name].enters
        return IncidentState(enters) if enters is not None else None


_E = ActionEntry
REGISTRY: dict[str, ActionEntry] = {e.name: e for e in (
    _E("alert", AlertAction()), _E("freeze", FreezeAction()), _E("snapshot", SnapshotAction()),
    _E("block_latest", BlockLatestAction()), _E("replay", ReplayAction()),
    _E("rollback", RollbackAction(), _rollback_report), _E("apply", ApplyAction(), _apply_report),
    _E("observe", ObserveAction(), _observe_report), _E("resume", ResumeAction()),
    _E("escalate", EscalateAction()), _E("stop", StopAction()),
)}  # fmt: skip


def entry(name: str) -> ActionEntry:
    try:
        return REGISTRY[name]
    except KeyError:
        raise PolicyError(
            f"the runtime cannot execute action {name!r} (valid: {', '.join(sorted(REGISTRY))})"
        ) from None


def check(names: Iterable[str]) -> None:
    for name in names:
        entry(name)


__all__ = ["REGISTRY", "ActionEntry", "Executor", "Outcome", "Runtime", "check", "entry"]

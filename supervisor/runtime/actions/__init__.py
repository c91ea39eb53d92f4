"""Action executors by name (STYLE.md point 7): the names are the policy's action names."""

from __future__ import annotations

from supervisor.errors import PolicyError
from supervisor.runtime.actions.base import Executor, Outcome, Runtime
from supervisor.runtime.actions.checkpoints import BlockLatestAction, RollbackAction, SnapshotAction
from supervisor.runtime.actions.control import EscalateAction, FreezeAction, ResumeAction, StopAction
from supervisor.runtime.actions.fix import ApplyAction, ObserveAction
from supervisor.runtime.actions.notify import AlertAction
from supervisor.runtime.actions.replay import ReplayAction

EXECUTORS: dict[str, Executor] = {
    "alert": AlertAction(),
    "freeze": FreezeAction(),
    "snapshot": SnapshotAction(),
    "block_latest": BlockLatestAction(),
    "replay": ReplayAction(),
    "rollback": RollbackAction(),
    "apply": ApplyAction(),
    "observe": ObserveAction(),
    "resume": ResumeAction(),
    "escalate": EscalateAction(),
    "stop": StopAction(),
}


def executor(name: str) -> Executor:
    """The executor of a policy action, or PolicyError naming the valid ones."""
    try:
        return EXECUTORS[name]
    except KeyError:
        raise PolicyError(
            f"the runtime cannot execute action {name!r} (valid: {', '.join(sorted(EXECUTORS))})"
        ) from None


__all__ = ["EXECUTORS", "Executor", "Outcome", "Runtime", "executor"]

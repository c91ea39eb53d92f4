"""What to do about a worker-group fault: a decision, as a value, from the policy's ``restarts``.

Worker supervision reports what happened (``GroupEvent``); ``decide`` says, without side effects,
whether the group is restarted (after how long) or the job escalates, and logs its cause with
the setting behind it (docs/architecture.md, One writer per state). The settings are the policy's
``restarts`` section (``core.policy.settings.Restarts``; docs/policies.md, Policy-wide sections).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from supervisor.core.policy.settings import Restarts
from supervisor.logging import get_logger

log = get_logger("supervisor.runtime.restarts")

FaultKind = Literal["finished", "failed", "hung", "lost"]


@dataclass(frozen=True, slots=True)
class Restarting:
    """The job between a group's shutdown and its successor's launch (phase ``restarting``)."""

    due: float
    """``time.monotonic()`` at which the new generation is launched (the restart policy's backoff)."""
    resume_step: int | None
    after_seq: int
    """The new generation reads the directive log after this number (its re-delivered copies)."""
    machinery: tuple[int, int] | None = None
    """(event id, incident id) of a fault's ``worker_restarted`` event, finished at the launch."""


@dataclass(frozen=True, slots=True)
class GroupEvent:
    kind: FaultKind
    ranks: tuple[int, ...] = ()
    reason: str = ""

    def describe(self) -> str:
        who = f"rank(s) {list(self.ranks)} " if self.ranks else ""
        return f"worker {who}{self.kind}: {self.reason}" if self.reason else f"worker {who}{self.kind}"


@dataclass(frozen=True, slots=True)
class RestartDecision:
    action: Literal["restart", "escalate"]
    reason: str
    delay_s: float = 0.0


def decide(
    event: GroupEvent,
    restart_steps: list[int],
    step: int,
    settings: Restarts,
    without_progress: int = 0,
) -> RestartDecision:
    """Restart the group (after the backoff) or escalate, and say why.

    ``restart_steps``: the steps of earlier restarts of this run (with ``restarts.window_steps``
    only those within that many steps count). ``without_progress``: restarted groups in a row that
    failed before training a step, this one included; at ``restarts.max_without_progress`` the
    failure repeats before the first step (a bad argument, an import error): restarting cannot fix it.
    """
    cause = event.describe()
    if without_progress and without_progress >= settings.max_without_progress:
        why = (
            f"Deciding to ESCALATE: {cause}; the group failed again before training a step, "
            f"{without_progress} restart(s) in a row without progress reached "
            f"restarts.max_without_progress={settings.max_without_progress} (policy): restarting "
            "does not fix a failure that repeats before the first step"
        )
        log.warning("restart_decision", decision="escalate", cause=cause, without_progress=without_progress,
                    max_without_progress=settings.max_without_progress)  # fmt: skip
        return RestartDecision("escalate", why)
    window = settings.window_steps
    counted = [s for s in restart_steps if window is None or step - s <= window]
    scope = "in this run" if window is None else f"within restarts.window_steps={window}"
    if len(counted) >= settings.max_restarts:
        why = (
            f"Deciding to ESCALATE: {cause}; {len(counted)} group restarts {scope} reached "
            f"restarts.max_restarts={settings.max_restarts} (policy)"
        )
        log.warning("restart_decision", decision="escalate", cause=cause, restarts=len(counted),
                    max_restarts=settings.max_restarts, window_steps=window)  # fmt: skip
        return RestartDecision("escalate", why)
    n = len(counted) + 1
    delay = settings.backoff(n)
    why = (
        f"Deciding to RESTART: {cause}; restart {n} of restarts.max_restarts={settings.max_restarts} "
        f"{scope}, after {delay:g}s (restarts.backoff_s={settings.backoff_s:g}, "
        f"backoff_factor={settings.backoff_factor:g})"
    )
    log.warning("restart_decision", decision="restart", cause=cause, restart=n,
                max_restarts=settings.max_restarts, delay_s=delay)  # fmt: skip
    return RestartDecision("restart", why, delay)

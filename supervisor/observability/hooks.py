"""The training side's rollback hook: tell the user's own logger before training resumes.

After an in-place rollback the step counter of the training loop goes back (from 257 to 150,
say). A logger that keys on the step — W&B drops steps lower than the last one it saw,
TensorBoard zig-zags, MLflow overwrites — needs to know. Register a callback; the SDK calls it
on every rank, at the step boundary where the rollback was applied, before the next step::

    from supervisor.observability import hooks

    @hooks.on_rollback
    def tell_wandb(rb: hooks.Rollback) -> None:
        wandb.log({"rollback/to_step": rb.to_step}, step=log_step(rb.from_step))

or keep a logging step that never goes backwards::

    log_step = hooks.MonotonicStep()          # registers itself
    ...
    wandb.log(metrics, step=log_step(step))   # step 151 after a rollback 257 -> 150 logs as 258

A callback that raises is logged and skipped: a logging problem never stops training.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from supervisor.logging import get_logger

log = get_logger("supervisor.sdk.hooks")


@dataclass(frozen=True, slots=True)
class Rollback:
    from_step: int
    """The last step trained on the abandoned timeline."""
    to_step: int
    """The checkpoint step loaded: the next step trained is ``to_step + 1``."""


RollbackCallback = Callable[[Rollback], None]
_callbacks: list[RollbackCallback] = []
_lock = threading.Lock()


def on_rollback(fn: RollbackCallback) -> RollbackCallback:
    """Register ``fn(Rollback)``; usable as a decorator. Returns ``fn``."""
    with _lock:
        if fn not in _callbacks:
            _callbacks.append(fn)
    return fn


def remove(fn: RollbackCallback) -> None:
    with _lock:
        if fn in _callbacks:
            _callbacks.remove(fn)


def notify_rollback(from_step: int, to_step: int) -> Rollback:
    """Called by the SDK once the rollback's state is loaded, before training resumes."""
    rb = Rollback(from_step=from_step, to_step=to_step)
    with _lock:
        callbacks = list(_callbacks)
    for fn in callbacks:
        try:
            fn(rb)
        except Exception as exc:  # the user's logger must not stop training
            log.warning("rollback_hook_failed", hook=getattr(fn, "__qualname__", repr(fn)), error=repr(exc))
    return rb


class MonotonicStep:
    """Maps a training step to a logging step that never goes backwards across rollbacks."""

    def __init__(self, register: bool = True) -> None:
        self.offset = 0
        if register:
            on_rollback(self.rolled_back)

    def rolled_back(self, rb: Rollback) -> None:
        """The hook: later steps log past the highest step already logged."""
        self.offset += max(0, rb.from_step - rb.to_step)

    def __call__(self, step: int) -> int:
        return step + self.offset

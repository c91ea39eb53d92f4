"""How a rollback is carried out for a job: in place, or as a restart of the worker group.

Pure (no framework, Ray or torch import): the runtime's rollback action, ``policy explain``
and the incident record all say the mode and the reason from here.

- ``in_place``: every rank loads the target into its live model, optimizer and scheduler at
  the step boundary. The supervisor's own checkpoints (``checkpoint.every_steps``, DCP) can
  be loaded so by every adapter in this package (``sdk.init``, ``sdk.watch``, the HF and
  Lightning callbacks).
- ``restart``: the worker group is shut down and started again from the target; the new
  processes resume through the framework's own path (``resume_from_checkpoint`` / ``ckpt_path``
  with ``resume_checkpoint()``) when the target is a framework checkpoint the supervisor
  adopted, else the SDK loads its own checkpoint before the first step. The policy's fixes
  (LR scale, re-warm, clip) reach the new processes as directives, after the freeze.

job.yaml ``recovery: auto`` (default) picks per target: in place for the supervisor's own
checkpoints, restart for a framework's (only the framework reads its own format);
``recovery: restart`` restarts for every rollback.
"""

from __future__ import annotations

from typing import Literal

Setting = Literal["auto", "restart"]
Mode = Literal["in_place", "restart"]

SETTINGS: tuple[Setting, ...] = ("auto", "restart")


def rollback_mode(setting: str, framework_target: bool | None) -> tuple[Mode, str]:
    """(mode, why) for a rollback. ``framework_target``: the target is an adopted framework
    checkpoint (True), the supervisor's own (False), or not known yet (None: explain)."""
    if setting == "restart":
        return "restart", (
            "job.yaml recovery: restart: the worker group restarts from the target, through the "
            "framework's resume path for a framework checkpoint"
        )
    if framework_target:
        return "restart", (
            "the target is a framework checkpoint the supervisor adopted: only the framework reads its "
            "format, so the worker group restarts and resumes through the framework's own path (recovery: auto)"
        )
    if framework_target is None:
        return "in_place", (
            "recovery: auto: in place when the target is the supervisor's own checkpoint; a restart of the "
            "worker group through the framework's resume path when it is a framework checkpoint (a Trainer "
            "or ModelCheckpoint saving every N steps)"
        )
    return "in_place", (
        "the target is the supervisor's own checkpoint: every rank loads it into the live model, optimizer "
        "and scheduler at the step boundary (recovery: auto)"
    )


__all__ = ["SETTINGS", "Mode", "Setting", "rollback_mode"]

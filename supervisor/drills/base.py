"""What every fault injector shares: the hook surface, its context, and "fire once" bookkeeping.

Hazard: after a rollback the training loop replays steps it has already run. A fault that
models a one-off event (an oversized update, a flipped bit, a killed worker) must not fire
again on replay, or no recovery could ever succeed; a fault that lives in the data (a
garbage sample, a bad source) must fire again whenever that data comes back, or the drill
would not test the fix. ``OnceWindow`` gives the first behaviour, sample-keyed rewrites the
second. "Fired" markers are files under the job's state dir so they survive a worker restart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from supervisor.drills.specs import FaultParams
from supervisor.logging import get_logger
from supervisor.storage.base import Backend
from supervisor.storage.local import LocalBackend


class Markers:
    """Named "this already happened" flags: in memory, and as objects on a storage backend when given.

    The backend is the job's own storage (local directory or S3), so a marker outlives the
    worker process that wrote it; ``put_bytes`` is durable before it returns.
    """

    def __init__(self, backend: Backend | None = None, prefix: str = "") -> None:
        self.backend = backend
        self.prefix = prefix.strip("/")
        self._mem: set[str] = set()

    @classmethod
    def in_directory(cls, directory: str | Path | None) -> Markers:
        return cls(LocalBackend(directory) if directory is not None else None)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def fired(self, key: str) -> bool:
        return key in self._mem or (
            self.backend is not None and self.backend.stat(self._key(key)) is not None
        )

    def mark(self, key: str) -> None:
        self._mem.add(key)
        if self.backend is not None:
            self.backend.put_bytes(self._key(key), f"{os.getpid()}\n".encode())

    def put_json(self, name: str, obj: Any) -> None:
        if self.backend is not None:
            self.backend.put_bytes(self._key(name), json.dumps(obj, sort_keys=True).encode())

    def get_json(self, name: str) -> Any:
        if self.backend is None or self.backend.stat(self._key(name)) is None:
            return None
        return json.loads(self.backend.get_bytes(self._key(name)))

    def names(self, suffix: str) -> list[str]:
        """Stored names ending in ``suffix`` (without the prefix)."""
        if self.backend is None:
            return []
        cut = len(self.prefix) + 1 if self.prefix else 0
        return [o.key[cut:] for o in self.backend.list(self.prefix) if o.key.endswith(suffix)]


@dataclass
class PlanContext:
    """What injectors of one rank share."""

    rank: int
    world_size: int
    markers: Markers
    vocab_size: int | None = None
    log: Any = field(default=None)


class OnceWindow:
    """Active on the first pass through steps ``[start, start + length)`` only.

    Closed for good by a step regression (rollback / replay) or once a step past the window is
    seen; a persisted marker keeps it closed in a restarted process.
    """

    def __init__(self, key: str, start: int, length: int, markers: Markers) -> None:
        self.key, self.start, self.end, self.markers = key, start, start + length, markers
        self.opened = self.closed = False
        self.last = -1

    def active(self, step: int) -> bool:
        if self.closed:
            return False
        if self.opened and step < self.last:
            self.closed = True
            return False
        if not self.start <= step < self.end:
            self.closed = self.opened and step >= self.end
            return False
        if not self.opened:
            if self.markers.fired(self.key):
                self.closed = True
                return False
            self.opened = True
            self.markers.mark(self.key)
        self.last = step
        return True


class Injector:
    """One fault on one rank. Every hook is a no-op unless overridden.

    ``observe_step`` runs once each time the loop reports a new step, before that step's hooks.
    """

    def __init__(self, spec: FaultParams, index: int, ctx: PlanContext) -> None:
        self.spec = spec
        self.ctx = ctx
        # Per fault *and* per rank: ranks share the job's storage, and each fires its own copy.
        self.key = f"fault{index}-{spec.kind}-s{spec.step}-rank{ctx.rank}"
        self.log = get_logger("drills", fault=spec.kind, rank=ctx.rank)

    def fired(self, step: int, **details: Any) -> None:
        self.log.warning("fault_injected", step=step, **details)

    def once_window(self, length: int = 1, *, start: int | None = None, suffix: str = "") -> OnceWindow:
        return OnceWindow(
            self.key + suffix, self.spec.step if start is None else start, length, self.ctx.markers
        )

    def observe_step(self, step: int) -> None:
        return None

    def install(self, model: torch.nn.Module) -> None:
        return None

    def batch(self, step: int, batch: Any) -> Any:
        return batch

    def lr_scale(self, step: int) -> float:
        return 1.0

    def mixture(self, step: int) -> dict[str, float] | None:
        return None

    def before_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        return None

    def after_optimizer_step(
        self, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> None:
        return None

    def record(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        return record

    def on_checkpoint_saved(self, step: int, target: Any) -> None:
        return None

    def maybe_crash(self, step: int) -> None:
        return None

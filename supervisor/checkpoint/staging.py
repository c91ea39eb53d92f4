"""Staging an asynchronous save to host memory while the next step's forward and backward run.

Between two optimizer steps the parameters and the optimizer state do not change: forward and
backward read the parameters and write only activations and gradients. So the copy of those
tensors to host memory need not stop training; it must only be finished before the next
``optimizer.step()``. That is DCP's own split of an asynchronous save (``async_save`` returns a
``staging_completion`` future, and torchtitan waits for it just before the optimizer step):

- tensors that the optimizer step alone changes (parameters, optimizer state) are copied by
  DCP's ``DefaultStager`` on its background thread (CUDA: device -> pinned host on a side stream);
- every other model tensor (buffers: BatchNorm's running statistics change in *forward*) is
  copied before ``save`` returns;
- an optimizer step pre-hook waits for the background copy, so whatever steps the optimizer
  (the probe, ``scaler.step``, a framework's own loop) never changes a tensor mid-copy.

Each save stages through stagers of its own, closed when the next save begins (at most one is in
flight). Reused across saves, DCP's stager with pinned memory failed every save after its first on
CUDA (torch 2.11: ``KeyError: <class 'type'>`` from its deep copy, seen on an H200, so every
periodic checkpoint after the first was lost); a fresh one stages as the first save did, at the
cost of allocating the host buffers again. Hazard: code that writes parameters in place outside
``optimizer.step()`` between a save and the next step (a weight surgery in the user's loop) must
call ``Checkpointer.wait_staged()`` first.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions


def _storage(value: Any) -> int | None:
    """The data pointer of a tensor's (a DTensor's local shard's) storage; None for anything else."""
    if not isinstance(value, torch.Tensor):
        return None
    local = value.to_local() if hasattr(value, "to_local") else value
    ptr = local.untyped_storage().data_ptr()
    return ptr or None


def stable_storages(model: torch.nn.Module) -> set[int]:
    """Storages of the parameters: only the optimizer step writes them."""
    return {ptr for p in model.parameters() if (ptr := _storage(p)) is not None}


@dataclass(slots=True)
class Staging:
    """One save's host copy: the part copied at once, and the background part's future."""

    keys: list[str]
    now: dict[str, Any]
    later: Future[Any]
    waited_s: float = 0.0
    """How long optimizer steps waited for the background copy."""
    started: float = field(default_factory=time.perf_counter)

    def done(self) -> bool:
        return self.later.done()

    def wait(self) -> None:
        """Block until the background copy finished (its outcome is read by ``result``)."""
        if not self.later.done():
            start = time.perf_counter()
            wait_futures([self.later])
            self.waited_s += time.perf_counter() - start

    def result(self) -> dict[str, Any]:
        """The whole staged state, model keys in their original order; raises what staging raised."""
        later = self.later.result()
        model = {k: self.now[k] if k in self.now else later["model"][k] for k in self.keys}
        return {"model": model, "optimizer": later["optimizer"]}


class OverlappedStager:
    """Stages ``{"model", "optimizer"}`` state dicts as the module doc says (one per Checkpointer)."""

    def __init__(self) -> None:
        self.cuda = torch.cuda.is_available()
        self._stagers: tuple[DefaultStager, DefaultStager] | None = None

    def _fresh(self) -> tuple[DefaultStager, DefaultStager]:
        """This save's (synchronous, asynchronous) stagers; the last save's are closed (module doc)."""
        self.close()
        cuda = self.cuda
        # (pinned memory, shared memory, async staging, non-blocking copy)
        self._stagers = (DefaultStager(StagingOptions(cuda, False, False, cuda)),
                         DefaultStager(StagingOptions(cuda, False, True, cuda)))  # fmt: skip
        return self._stagers

    def stage(self, state: dict[str, Any], stable: set[int]) -> Staging:
        """Start staging one save's state; the save before it must have finished staging."""
        now_stager, later_stager = self._fresh()
        model = state["model"]
        deferred = {k: v for k, v in model.items() if _storage(v) in stable}
        now = {k: v for k, v in model.items() if k not in deferred}
        staged_now = now_stager.stage(now) if now else {}
        assert isinstance(staged_now, dict)  # synchronous staging returns the dict itself
        if self.cuda:
            # The side stream must see the finished optimizer step: kernels still queued on the
            # compute stream would race the copy (at a step boundary the queue is nearly empty).
            torch.cuda.current_stream().synchronize()
        later = later_stager.stage({"model": deferred, "optimizer": state["optimizer"]})
        assert isinstance(later, Future)
        return Staging(list(model), staged_now, later)

    def close(self) -> None:
        if self._stagers is not None:
            for stager in self._stagers:
                stager.close()
            self._stagers = None

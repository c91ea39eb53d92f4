"""Saving a rank's training state: synchronous or asynchronous, one commit protocol for both.

A save, on every rank at the same step:

1. capture the small state (scheduler, scaler, RNG, data cursor, extra) and the model and
   optimizer state (``get_state_dict``); for an asynchronous save, start the copy of the
   latter to host memory (``staging.OverlappedStager``): buffers at once, parameters and
   optimizer state in the background while the next forward and backward run. Training
   waits only for this step, and its next ``optimizer.step()`` for the copy to finish;
2. ``dcp.save`` the model and optimizer state, then write this rank's small-state file; every
   file is fsynced (or uploaded) and checksummed as stored;
3. gather every rank's file entries to rank 0, which commits MANIFEST.json (the commit
   marker) only when every rank reported its files durable; the outcome is broadcast back,
   so a failure on any rank raises on every rank.

Steps 2-3 of an asynchronous save run on one background thread (after the staging copy), over a dedicated gloo
group (collectives on it never interleave with the training's). At most one save is in
flight: the next save, a snapshot, a restore and ``close`` wait for it first. A rank that
dies mid-save leaves files but no manifest: nothing names them, no rollback or restart can
target them, and retention collects them once stale.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from supervisor.checkpoint import dcp_state
from supervisor.checkpoint.consistency import summarize
from supervisor.checkpoint.manifest import FileEntry, Manifest
from supervisor.checkpoint.staging import OverlappedStager, Staging, stable_storages
from supervisor.checkpoint.store import CheckpointStore
from supervisor.checkpoint.torch_io import capture_rng, save_file
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError, SupervisorError


@dataclass(slots=True)
class SmallState:
    """What sits beside DCP's files, one ``state.rankN`` file per rank (captured at the step)."""

    state: dict[str, Any]
    components: list[str]
    summary: dict[str, Any]


def capture_small(
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    data_state: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None,
) -> SmallState:
    state = {
        "scheduler": copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
        "scaler": copy.deepcopy(scaler.state_dict()) if scaler is not None else None,
        "rng": capture_rng(),
        "data_state": copy.deepcopy(dict(data_state)) if data_state is not None else None,
        "extra": copy.deepcopy(dict(extra or {})),
    }
    components = ["rng"] + [c for c in ("scheduler", "scaler") if state[c] is not None]
    if data_state is not None:
        components.append("data_cursor")
        if data_state.get("exclusions") is not None:
            components.append("exclusions")
    return SmallState(state, components, summarize(optimizer, scheduler, data_state))


@dataclass(slots=True)
class SaveHandle:
    """One save: done when committed everywhere (``result()``: the Manifest on rank 0, None on
    the others) or failed everywhere (``result()`` raises CheckpointError)."""

    step: int
    mark: HealthMark
    future: Future[Manifest | None]
    blocked_s: float
    """How long the save call took: the whole save if synchronous; else the capture, the copy of
    the buffers and starting the background copy (``staged_wait_s`` adds what optimizer steps waited)."""
    started: float = field(default_factory=time.time)
    staging: Staging | None = None

    @property
    def staged_wait_s(self) -> float:
        return self.staging.waited_s if self.staging is not None else 0.0

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Manifest | None:
        return self.future.result(timeout)


@dataclass(slots=True)
class RankResult:
    """What one rank sends rank 0: its file entries and the facts for the resume check."""

    files: list[FileEntry]
    summary: dict[str, Any]


class Checkpointer:
    """Saves one rank's training state through DCP into a CheckpointStore (module doc)."""

    def __init__(
        self,
        store: CheckpointStore,
        *,
        rank: int,
        world_size: int,
        dedicated_group: bool = True,
        timeout_s: float = 1800.0,
    ) -> None:
        """``dedicated_group=False``: collectives on the default group (synchronous saves only)."""
        self.store, self.rank, self.world_size, self.timeout_s = store, rank, world_size, timeout_s
        self.dedicated_group = dedicated_group
        self.in_flight: SaveHandle | None = None
        self._group: Any = None
        self._stager: OverlappedStager | None = None
        self._hooks: dict[int, Any] = {}
        self._pool: ThreadPoolExecutor | None = None
        self.log = store.log.bind(rank=rank)

    def group(self) -> Any:
        """The gloo group of checkpoint collectives, made on first use (every rank saves at the same step)."""
        if self._group is None and self.dedicated_group and distributed(self.world_size):
            self._group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.timeout_s))
        return self._group

    def save(
        self,
        step: int,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any = None,
        scaler: Any = None,
        data_state: Mapping[str, Any] | None = None,
        extra: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float | None] | None = None,
        mark: HealthMark = HealthMark.UNVERIFIED,
        blocking: bool = True,
    ) -> SaveHandle:
        """Start a save of this step (every rank calls it); waits for a save still in flight first."""
        self.wait()
        group = self.group()
        started = time.perf_counter()
        small = capture_small(optimizer, scheduler, scaler, data_state, extra)
        state = dcp_state.live_state(model, optimizer)
        job = (step, small, dict(extra or {}), dict(metrics or {}), mark, group)
        if blocking:
            future: Future[Manifest | None] = Future()
            try:
                future.set_result(self._write_and_commit(state, *job))
            except CheckpointError as exc:
                future.set_exception(exc)
            return SaveHandle(step, mark, future, time.perf_counter() - started)
        if not self.dedicated_group:
            raise CheckpointError("an asynchronous save needs the dedicated checkpoint group")
        if self._stager is None:
            self._stager = OverlappedStager()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._hook(optimizer)
        staging = self._stager.stage(
            state, stable_storages(model)
        )  # last: the copy thread takes the GIL at times
        future = self._pool.submit(self._write_staged, staging, *job)
        handle = SaveHandle(step, mark, future, time.perf_counter() - started, staging=staging)
        self.in_flight = handle
        self.log.info("checkpoint save started", step=step, blocked_s=round(handle.blocked_s, 4))
        return handle

    def wait_staged(self) -> None:
        """Block until the save in flight has its host copy (then the live state may change)."""
        handle = self.in_flight
        if handle is not None and handle.staging is not None:
            handle.staging.wait()

    def _hook(self, optimizer: torch.optim.Optimizer) -> None:
        """Every ``optimizer.step()`` first waits for a background staging copy (module doc)."""
        if id(optimizer) not in self._hooks:
            self._hooks[id(optimizer)] = optimizer.register_step_pre_hook(lambda *_: self.wait_staged())

    def poll(self) -> SaveHandle | None:
        """The in-flight save once it has finished (once), else None."""
        handle = self.in_flight
        if handle is None or not handle.done():
            return None
        self.in_flight = None
        return handle

    def wait(self) -> SaveHandle | None:
        """Block until the save in flight (if any) finished; returns it (its outcome is in ``result``)."""
        handle = self.in_flight
        if handle is None:
            return None
        with contextlib.suppress(CheckpointError):  # the caller reads the outcome from the handle
            handle.result()
        self.in_flight = None
        return handle

    def close(self) -> SaveHandle | None:
        handle = self.wait()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        for hook in self._hooks.values():
            hook.remove()
        self._hooks.clear()
        return handle

    # -- the commit protocol --------------------------------------------------------------------
    def _write_staged(
        self,
        staging: Staging,
        step: int,
        small: SmallState,
        extra: dict[str, Any],
        metrics: dict[str, float | None],
        mark: HealthMark,
        group: Any,
    ) -> Manifest | None:
        try:
            state = staging.result()
        except Exception as exc:  # a failed host copy fails the save on every rank, like a failed write
            failed = f"staging to host memory failed: {type(exc).__name__}: {exc}"
            world = self.world_size
            return commit_everywhere(
                self.store, step, failed, self.rank, world, group, extra, metrics, mark, "dcp"
            )
        return self._write_and_commit(state, step, small, extra, metrics, mark, group)

    def _write_and_commit(
        self,
        state: dict[str, Any],
        step: int,
        small: SmallState,
        extra: dict[str, Any],
        metrics: dict[str, float | None],
        mark: HealthMark,
        group: Any,
    ) -> Manifest | None:
        store, rank = self.store, self.rank
        try:
            small.summary.update(dcp_state.fingerprint(state["model"], store.settings.checksum))
            dirname = dcp_state.new_dir_name(group, self.world_size)
            files = dcp_state.write(store, step, dirname, state, rank=rank, group=group)
            files.append(
                store.write_file(
                    step,
                    f"state.rank{rank:05d}",
                    lambda f: save_file(small.state, f),
                    rank=rank,
                    components=small.components,
                )
            )
            mine: RankResult | str = RankResult(files, small.summary)
        except SupervisorError as exc:
            mine = exc.one_line()
        return commit_everywhere(store, step, mine, rank, self.world_size, group, extra, metrics, mark, "dcp")


def distributed(world_size: int) -> bool:
    return world_size > 1 and dist.is_available() and dist.is_initialized()


def commit_everywhere(
    store: CheckpointStore,
    step: int,
    mine: RankResult | str,
    rank: int,
    world_size: int,
    group: Any,
    extra: Mapping[str, Any],
    metrics: Mapping[str, float | None],
    mark: HealthMark,
    layout: str,
) -> Manifest | None:
    """Gather every rank's result to rank 0, commit there, broadcast the outcome; raises on every
    rank if any rank failed. Rank 0 returns the Manifest, the others None."""
    gathered = _gather(mine, rank, world_size, group)
    outcome: Manifest | str | None = None
    if rank == 0:
        outcome = _commit(store, step, world_size, gathered, extra, metrics, mark, layout)
    outcome = _broadcast(outcome, world_size, group)
    if isinstance(outcome, str):
        store.log.error("checkpoint save failed", step=step, rank=rank, error=outcome)
        raise CheckpointError(f"save of step {step} failed: {outcome}", source=store.where(step))
    return outcome if rank == 0 else None


def _commit(
    store: CheckpointStore,
    step: int,
    world_size: int,
    gathered: list[RankResult | str],
    extra: Mapping[str, Any],
    metrics: Mapping[str, float | None],
    mark: HealthMark,
    layout: str,
) -> Manifest | str:
    failures = [f"rank {r}: {e}" for r, e in enumerate(gathered) if isinstance(e, str)]
    if failures:
        return "; ".join(failures)  # files already written stay uncommitted: garbage for the GC
    results = [g for g in gathered if isinstance(g, RankResult)]
    info = {
        **dict(extra),
        "step": step,
        "world_size": world_size,
        "summary": results[0].summary,
        "rank_summaries": {str(r): g.summary for r, g in enumerate(results)},
    }
    try:
        return store.commit(
            step,
            world_size=world_size,
            files=[e for g in results for e in g.files],
            metrics=dict(metrics),
            extra=info,
            mark=mark,
            layout=layout,
        )
    except SupervisorError as exc:
        return exc.one_line()


def _gather(mine: RankResult | str, rank: int, world_size: int, group: Any) -> list[RankResult | str]:
    if not distributed(world_size):
        return [mine]
    payload = mine if isinstance(mine, str) else ([e.model_dump() for e in mine.files], mine.summary)
    out: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(payload, out, dst=0, group=group)
    if out is None:
        return []
    return [
        p if isinstance(p, str) else RankResult([FileEntry.model_validate(e) for e in p[0]], p[1])
        for p in out
    ]


def _broadcast(outcome: Manifest | str | None, world_size: int, group: Any) -> Manifest | str | None:
    if not distributed(world_size):
        return outcome
    box: list[Any] = [
        outcome.model_dump(mode="json", by_alias=True) if isinstance(outcome, Manifest) else outcome
    ]
    dist.broadcast_object_list(box, src=0, group=group)
    value = box[0]
    return Manifest.model_validate(value) if isinstance(value, dict) else value

"""The torch side: save and restore a rank's full training state through a CheckpointStore.

Format: plain ``torch.save`` per rank (not torch.distributed.checkpoint). For DDP-sized
state each rank writes its own files in one sequential stream, which is what makes a save
cost about a raw write and lets a restore copy from an mmap straight into the live tensors;
DCP's planner, metadata round and per-tensor files buy resharding we do not need for
replicated state. Sharded state (FSDP2 / DTensor) is ready in the same layout: with
``sharded=True`` every rank saves its own model shard (``layout="sharded"``), restorable at
the same world size; resharding to another world size is where DCP would come in.

Files of one save (the store adds a save id to each name):
  model            rank 0 (replicated) or every rank (sharded): the model state_dict
  optimizer.rankN  every rank: optimizer state_dict
  state.rankN      every rank: scheduler, scaler, RNG (python, numpy, torch CPU, CUDA), data_state, extra
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from supervisor.checkpoint.consistency import compare, summarize
from supervisor.checkpoint.manifest import FileEntry, Manifest
from supervisor.checkpoint.store import CheckpointStore
from supervisor.checkpoint.torch_io import (
    capture_rng,
    check_loadable,
    load_mmap,
    one_thread,
    restore_rng,
    save_file,
)
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError, SupervisorError

__all__ = ["LoadedState", "check_loadable", "load_training_state", "save_training_state", "unwrap"]


@dataclass(slots=True)
class LoadedState:
    data_state: dict[str, Any] | None
    extra: dict[str, Any]
    report: list[str] = field(default_factory=list)
    manifest: Manifest | None = None


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """DDP / compiled wrappers keep the real module in ``.module`` / ``._orig_mod``."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


def _distributed(world_size: int) -> bool:
    return world_size > 1 and dist.is_available() and dist.is_initialized()


# -- save -----------------------------------------------------------------------------------------


def save_training_state(
    store: CheckpointStore,
    step: int,
    *,
    rank: int,
    world_size: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    data_state: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    metrics: Mapping[str, float | None] | None = None,
    mark: HealthMark = HealthMark.UNVERIFIED,
    sharded: bool = False,
) -> Manifest | None:
    """Every rank calls this at the same step; rank 0 commits and gets the Manifest, others None.

    With torch.distributed initialised the ranks' file entries are gathered to rank 0 and
    the outcome is broadcast back, so a failure on any rank raises on every rank (no rank
    is left waiting in a collective).
    """
    log = store.log.bind(step=step, rank=rank)
    try:
        files = _write_rank_files(
            store, step, rank, model, optimizer, scheduler, scaler, data_state, extra, sharded
        )
        mine: _RankResult | str = _RankResult(files, summarize(optimizer, scheduler, data_state))
    except SupervisorError as exc:
        mine = exc.one_line()
    gathered = _gather(mine, rank, world_size)
    outcome: Manifest | str | None = None
    if rank == 0:
        outcome = _commit(store, step, world_size, gathered, extra, metrics, mark, sharded)
    outcome = _broadcast(outcome, world_size)
    if isinstance(outcome, str):
        log.error("checkpoint save failed", error=outcome)
        raise CheckpointError(f"save of step {step} failed: {outcome}", source=store.where(step))
    return outcome if rank == 0 else None


def _write_rank_files(
    store: CheckpointStore,
    step: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any,
    data_state: Mapping[str, Any] | None,
    extra: Mapping[str, Any] | None,
    sharded: bool,
) -> list[FileEntry]:
    files = []
    if sharded or rank == 0:
        model_sd = unwrap(model).state_dict()
        stem = f"model.rank{rank:05d}" if sharded else "model"
        files.append(
            store.write_file(
                step,
                stem,
                lambda f: save_file(model_sd, f),
                rank=rank if sharded else None,
                components=["model"],
            )
        )
    optim_sd = optimizer.state_dict()
    files.append(
        store.write_file(
            step,
            f"optimizer.rank{rank:05d}",
            lambda f: save_file(optim_sd, f),
            rank=rank,
            components=["optimizer"],
        )
    )
    state = {
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": capture_rng(),
        "data_state": dict(data_state) if data_state is not None else None,
        "extra": dict(extra or {}),
    }
    components = ["rng"] + [c for c in ("scheduler", "scaler") if state[c] is not None]
    if data_state is not None:
        components.append("data_cursor")
        if data_state.get("exclusions") is not None:
            components.append("exclusions")
    files.append(
        store.write_file(
            step, f"state.rank{rank:05d}", lambda f: save_file(state, f), rank=rank, components=components
        )
    )
    return files


@dataclass(slots=True)
class _RankResult:
    """What one rank sends rank 0: its file entries and the facts for the resume check."""

    files: list[FileEntry]
    summary: dict[str, Any]


def _commit(
    store: CheckpointStore,
    step: int,
    world_size: int,
    gathered: list[_RankResult | str],
    extra: Mapping[str, Any] | None,
    metrics: Mapping[str, float | None] | None,
    mark: HealthMark,
    sharded: bool,
) -> Manifest | str:
    failures = [f"rank {r}: {e}" for r, e in enumerate(gathered) if isinstance(e, str)]
    if failures:
        return "; ".join(failures)  # files already written stay uncommitted: garbage for the GC
    results = [g for g in gathered if isinstance(g, _RankResult)]
    info = {
        **dict(extra or {}),
        "step": step,
        "world_size": world_size,
        "summary": results[0].summary,
        "rank_summaries": {str(r): g.summary for r, g in enumerate(results)},
    }
    files = [e for g in results for e in g.files]
    try:
        return store.commit(
            step,
            world_size=world_size,
            files=files,
            metrics=dict(metrics or {}),
            extra=info,
            mark=mark,
            layout="sharded" if sharded else "replicated",
        )
    except SupervisorError as exc:
        return exc.one_line()


def _gather(mine: _RankResult | str, rank: int, world_size: int) -> list[_RankResult | str]:
    if not _distributed(world_size):
        return [mine]
    payload = mine if isinstance(mine, str) else ([e.model_dump() for e in mine.files], mine.summary)
    out: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(payload, out, dst=0)
    if out is None:
        return []
    return [
        p if isinstance(p, str) else _RankResult([FileEntry.model_validate(e) for e in p[0]], p[1])
        for p in out
    ]


def _broadcast(outcome: Manifest | str | None, world_size: int) -> Manifest | str | None:
    if not _distributed(world_size):
        return outcome
    box: list[Any] = [
        outcome.model_dump(mode="json", by_alias=True) if isinstance(outcome, Manifest) else outcome
    ]
    dist.broadcast_object_list(box, src=0)
    value = box[0]
    return Manifest.model_validate(value) if isinstance(value, dict) else value


# -- load -----------------------------------------------------------------------------------------


def load_training_state(
    store: CheckpointStore,
    step: int,
    *,
    rank: int,
    world_size: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    map_location: str | torch.device = "cpu",
    expect: Mapping[str, Any] | None = None,
) -> LoadedState:
    """Restore checkpoint ``step`` in place (no process restart) and report every inconsistency.

    Tensors are copied from an mmap of each file into the live parameters and optimizer
    state. ``expect`` holds the job's current geometry (global_batch_size, grad_accum_steps,
    micro_batch_size) to compare with the checkpoint's; differences, including the change
    in effective learning rate, come back in ``report`` and are logged.
    """
    log = store.log.bind(step=step, rank=rank)
    manifest = store.manifest(step)
    if manifest.health == HealthMark.QUARANTINED:
        raise CheckpointError(
            f"step {step} is quarantined: {_last_reason(manifest)}", source=store.where(step)
        )
    sharded = manifest.layout == "sharded"
    if sharded and manifest.world_size != world_size:
        raise CheckpointError(
            f"sharded checkpoint saved by {manifest.world_size} ranks cannot load on {world_size}",
            source=store.where(step),
        )
    src = rank % manifest.world_size
    report = [] if src == rank else [f"rank {rank} restores rank {src}'s optimizer/rng/data state"]
    with (
        one_thread(),
        store.local_file(step, _entry(store, manifest, "model", src if sharded else None).name) as path,
    ):
        unwrap(model).load_state_dict(load_mmap(path, map_location))
    with one_thread(), store.local_file(step, _entry(store, manifest, "optimizer", src).name) as path:
        _restore_optimizer(optimizer, load_mmap(path, map_location))
    with store.local_file(step, _entry(store, manifest, "rng", src).name) as path:
        state = torch.load(path, map_location="cpu", weights_only=True)
    report += _restore_small(state, scheduler, scaler)
    data_state = state.get("data_state")
    report += compare(
        manifest.extra,
        saved_world_size=manifest.world_size,
        world_size=world_size,
        rank=src,
        optimizer=optimizer,
        scheduler=scheduler,
        data_state=data_state,
        expect=expect,
    )
    for event in report:
        log.warning("resume consistency", detail=event)
    log.info("training state restored", events=len(report))
    return LoadedState(
        data_state=data_state, extra=dict(state.get("extra") or {}), report=report, manifest=manifest
    )


def _entry(store: CheckpointStore, manifest: Manifest, component: str, rank: int | None) -> FileEntry:
    for entry in manifest.files:
        if component in entry.components and entry.rank == rank:
            return entry
    who = "shared" if rank is None else f"rank {rank}"
    raise CheckpointError(f"no {component} file ({who}) in the manifest", source=store.where(manifest.step))


def _restore_optimizer(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> None:
    """load_state_dict, then copy into the existing state tensors (or own copies), never leaving mmap views."""
    before = {
        p: {k: v for k, v in s.items() if isinstance(v, torch.Tensor)} for p, s in optimizer.state.items()
    }
    optimizer.load_state_dict(state_dict)
    with torch.no_grad():
        for param, state in optimizer.state.items():
            old = before.get(param, {})
            for key, value in list(state.items()):
                if not isinstance(value, torch.Tensor):
                    continue
                live = old.get(key)
                if (
                    live is not None
                    and live.shape == value.shape
                    and live.dtype == value.dtype
                    and live.device == value.device
                ):
                    live.copy_(value)
                    state[key] = live
                elif value.device.type == "cpu":
                    state[key] = value.clone()


def _restore_small(state: Mapping[str, Any], scheduler: Any, scaler: Any) -> list[str]:
    events = []
    for name, obj in (("scheduler", scheduler), ("scaler", scaler)):
        saved = state.get(name)
        if obj is not None and saved is not None:
            obj.load_state_dict(saved)
        elif obj is not None:
            events.append(f"checkpoint has no {name} state: the {name} starts fresh")
        elif saved is not None:
            events.append(f"checkpoint has {name} state but no {name} was given: not restored")
    events += restore_rng(state["rng"])
    return events


def _last_reason(manifest: Manifest) -> str:
    return manifest.history[-1].reason if manifest.history else "no reason recorded"

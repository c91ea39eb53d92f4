"""The torch side: save and restore a rank's full training state through a CheckpointStore.

Two engines, one commit protocol (``saver.commit_everywhere``):

``dcp`` (default): model and optimizer through torch.distributed.checkpoint
(``get_state_dict`` / ``set_state_dict``, ``dcp.save`` / ``dcp.load``), the same for plain,
DDP, FSDP2 and DTensor modules; a checkpoint saved by N ranks restores on M (resharding).
Saves may be asynchronous (``saver.Checkpointer``). Restores are in place: the live
parameters and optimizer state receive the checkpoint's values.

``torch``: one ``torch.save`` stream per file, restored from an mmap. Kept for comparison
in bench/checkpoint_io.py and to read checkpoints written before DCP; it cannot reshard.

Files of one save (the store adds a save id to each name):
  dcp-<id>/.metadata, dcp-<id>/__R_0.distcp   (dcp) DCP's directory: model + optimizer
  model, optimizer.rankN                       (torch) model state_dict (rank 0 / every rank
                                               when sharded), each rank's optimizer state_dict
  state.rankN     every rank: scheduler, scaler, RNG (python, numpy, torch CPU, CUDA), data_state, extra
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from supervisor.checkpoint import dcp_state
from supervisor.checkpoint.consistency import compare
from supervisor.checkpoint.manifest import FileEntry, Manifest
from supervisor.checkpoint.saver import Checkpointer, RankResult, SmallState, capture_small, commit_everywhere
from supervisor.checkpoint.store import CheckpointStore
from supervisor.checkpoint.torch_io import check_loadable, load_mmap, one_thread, restore_rng, save_file
from supervisor.checkpoint.verify import RestoreCheckError
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError, SupervisorError

Engine = Literal["dcp", "torch"]

__all__ = [
    "LoadedState",
    "check_loadable",
    "incomplete_components",
    "load_training_state",
    "resume_check",
    "resume_events",
    "save_training_state",
    "unwrap",
]


@dataclass(slots=True)
class LoadedState:
    data_state: dict[str, Any] | None
    extra: dict[str, Any]
    report: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    shard_checksum: str | None = None
    """This rank's restored model state, checked equal to the one saved (same layout); None if resharded."""

    @property
    def incomplete(self) -> list[str]:
        """State components the restore did not bring back as saved (``incomplete_components``)."""
        return incomplete_components(self.report)


#: Report lines (``consistency.compare``, ``_restore_small``) that mean a component of the saved
#: state is missing or differs after the load -> the component. Geometry and world-size lines are
#: intended changes, not a lost state.
_INCOMPLETE = (
    ("optimizer moment ", "optimizer"),
    ("optimizer lr differs", "optimizer"),
    ("scheduler step differs", "scheduler"),
    ("scheduler last lr differs", "scheduler"),
    ("checkpoint has no scheduler state", "scheduler"),
    ("checkpoint has scheduler state but no scheduler", "scheduler"),
    ("checkpoint has no scaler state", "scaler"),
    ("checkpoint has scaler state but no scaler", "scaler"),
    ("data cursor differs", "loader"),
)


def incomplete_components(report: list[str]) -> list[str]:
    """The state components (optimizer, scheduler, scaler, loader) a restore's report says were not
    restored as saved, sorted, each once. The SDK sends each as a ``resume_incomplete:<component>``
    record event after the load; the detector opens a ``resume_state`` incident on it at once,
    whatever the optimizer's update looks like (Lion's ``lr * sign(.)`` never changes size)."""
    found = {comp for line in report for prefix, comp in _INCOMPLETE if line.startswith(prefix)}
    return sorted(found)


def resume_check(
    saved_summary: Mapping[str, Any],
    *,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    data_state: Mapping[str, Any] | None = None,
) -> list[str]:
    """After any resume (the SDK's, or a script's own), the components that did not come back as
    saved: ``saved_summary`` is ``consistency.summarize`` of the state at save time (what a
    checkpoint's manifest keeps per rank), compared with the live optimizer (its moments present,
    its LRs), scheduler (its step, last LR) and loader cursor. Returns the record events to send
    (``resume_events``)."""
    report = compare(
        {"summary": dict(saved_summary)},
        saved_world_size=1,
        world_size=1,
        optimizer=optimizer,
        scheduler=scheduler,
        data_state=data_state,
        expect=None,
    )
    return resume_events(report)


def resume_events(report: list[str]) -> list[str]:
    """The record events of a restore with this report: ``resume_incomplete:<component>`` each."""
    return [f"resume_incomplete:{c}" for c in incomplete_components(report)]


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """DDP / compiled wrappers keep the real module in ``.module`` / ``._orig_mod``."""
    while True:
        inner = getattr(model, "module", None) or getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return model
        model = inner


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
    engine: Engine = "dcp",
    sharded: bool = False,
) -> Manifest | None:
    """Every rank calls this at the same step; rank 0 commits and gets the Manifest, others None.

    A synchronous save (``Checkpointer`` does asynchronous ones). ``engine="dcp"`` (default):
    model and optimizer through DCP, any module layout, reshardable. ``engine="torch"``: the
    per-rank ``torch.save`` files (``sharded`` for per-rank model shards, same world size only).
    With torch.distributed initialised, a failure on any rank raises on every rank.
    """
    if engine == "dcp":
        saver = Checkpointer(store, rank=rank, world_size=world_size, dedicated_group=False)
        handle = saver.save(
            step, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
            data_state=data_state, extra=extra, metrics=metrics, mark=mark, blocking=True,
        )  # fmt: skip
        return handle.result()
    if engine != "torch":
        raise CheckpointError(f"unknown checkpoint engine {engine!r}; valid: dcp, torch", field="engine")
    try:
        small = capture_small(optimizer, scheduler, scaler, data_state, extra)
        mine: RankResult | str = RankResult(_write_torch_files(store, step, rank, model, optimizer, small, sharded),
                                            small.summary)  # fmt: skip
    except SupervisorError as exc:
        mine = exc.one_line()
    layout = "sharded" if sharded else "replicated"
    return commit_everywhere(
        store, step, mine, rank, world_size, None, extra or {}, metrics or {}, mark, layout
    )


def _write_torch_files(
    store: CheckpointStore,
    step: int,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    small: SmallState,
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
    files.append(
        store.write_file(
            step,
            f"state.rank{rank:05d}",
            lambda f: save_file(small.state, f),
            rank=rank,
            components=small.components,
        )  # fmt: skip
    )
    return files


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
    group: Any = None,
) -> LoadedState:
    """Restore checkpoint ``step`` in place (no process restart) and report every inconsistency.

    Model and optimizer values are copied into the live parameters and optimizer state (DCP:
    resharded to this world size and module layout; ``group`` carries DCP's collectives, the
    default group when None). ``expect`` holds the job's current geometry (global_batch_size, grad_accum_steps,
    micro_batch_size) to compare with the checkpoint's; differences, including the change
    in effective learning rate, come back in ``report`` and are logged.
    """
    log = store.log.bind(step=step, rank=rank)
    manifest = store.manifest(step)
    if manifest.health == HealthMark.QUARANTINED:
        raise CheckpointError(
            f"step {step} is quarantined: {_last_reason(manifest)}", source=store.where(step)
        )
    src = rank % manifest.world_size
    dcp = manifest.layout == "dcp"
    taken = "rng/data state" if dcp else "optimizer/rng/data state"
    report = [] if src == rank else [f"rank {rank} restores rank {src}'s {taken}"]
    shard_checksum = None
    if dcp:
        folded = dcp_state.load(store, manifest, model, optimizer, group=group, shard_hash=True)
        shard_checksum = _check_shard(store, manifest, rank, model, optimizer, folded)
    else:
        _load_torch_files(store, manifest, rank, world_size, model, optimizer, map_location)
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
        data_state=data_state, extra=dict(state.get("extra") or {}), report=report, manifest=manifest,
        shard_checksum=shard_checksum,
    )  # fmt: skip


def _check_shard(
    store: CheckpointStore,
    manifest: Manifest,
    rank: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    folded: str | None = None,
) -> str | None:
    """The restored shard's checksum, when this rank's layout is the saving rank's; a difference
    is a failed restore (raised), never a silent one. ``folded``: that checksum as the load's
    reader hashed the live tensors while writing them (else they are hashed again here)."""
    saved = (manifest.extra.get("rank_summaries") or {}).get(str(rank)) or {}
    model_state = dcp_state.live_state(model, optimizer)["model"]
    layout = dcp_state.shard_layout(model_state, store.settings.checksum)
    # Sharded (DTensor) state on another world size is resharded: this rank's local shards are
    # not the saved rank's, even where their shapes match. Replicated state is the whole model on
    # every rank, at any world size (a group restarted on fewer ranks): compared bit for bit.
    sharded = any(hasattr(v, "to_local") for v in model_state.values())
    if saved.get("shard_layout") != layout or (sharded and manifest.world_size != dist_world_size()):
        return None  # resharded (another world size or module layout): nothing to compare bit for bit
    live = (
        {"shard_checksum": folded}
        if folded is not None
        else dcp_state.fingerprint(model_state, store.settings.checksum)
    )
    if saved.get("shard_checksum") != live["shard_checksum"]:
        raise RestoreCheckError(
            f"rank {rank}: restored model state differs from the saved one "
            f"({live['shard_checksum']} != {saved.get('shard_checksum')})",
            source=store.where(manifest.step),
        )
    return live["shard_checksum"]


def dist_world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _load_torch_files(
    store: CheckpointStore,
    manifest: Manifest,
    rank: int,
    world_size: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    map_location: str | torch.device,
) -> None:
    """The per-rank torch.save layouts: copy from an mmap of each file into the live tensors."""
    sharded = manifest.layout == "sharded"
    if sharded and manifest.world_size != world_size:
        raise CheckpointError(
            f"sharded torch.save checkpoint saved by {manifest.world_size} ranks cannot load on {world_size}",
            source=store.where(manifest.step),
        )
    src = rank % manifest.world_size
    model_file = _entry(store, manifest, "model", src if sharded else None).name
    with one_thread(), store.local_file(manifest.step, model_file) as path:
        unwrap(model).load_state_dict(load_mmap(path, map_location))
    with (
        one_thread(),
        store.local_file(manifest.step, _entry(store, manifest, "optimizer", src).name) as path,
    ):
        _restore_optimizer(optimizer, load_mmap(path, map_location))


def _entry(store: CheckpointStore, manifest: Manifest, component: str, rank: int | None) -> FileEntry:
    for entry in manifest.files:
        if component in entry.components and entry.rank == rank and "/" not in entry.name:
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

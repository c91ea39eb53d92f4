"""Operational faults: a wrong logged metric, a killed worker, a corrupted checkpoint shard."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

from supervisor.drills.base import Injector
from supervisor.drills.specs import CorruptCheckpoint, LoggingBug, WorkerKill


class LoggingBugInjector(Injector):
    """Only the logged ``loss`` changes; ``loss_sum`` and ``tokens`` stay true, training is untouched."""

    spec: LoggingBug

    def record(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        if not self.spec.step <= step < self.spec.step + self.spec.steps or "loss" not in record:
            return record
        loss = float(record["loss"])
        if self.spec.mode == "misreduced":
            # all-reduce SUM without the division by world size
            wrong = loss * (self.spec.factor or max(2, self.ctx.world_size))
        else:
            # the mean taken over every position, padding included, each pad position costing pad_loss
            pf = self.spec.pad_fraction
            wrong = (1 - pf) * loss + pf * self.spec.pad_loss
        self.fired(step, mode=self.spec.mode, true_loss=loss, logged_loss=wrong)
        return {**record, "loss": wrong}


class WorkerKillInjector(Injector):
    """SIGKILL of this worker at the first step >= ``step``; a marker file stops it after the restart."""

    spec: WorkerKill

    def maybe_crash(self, step: int) -> None:
        if step < self.spec.step or self.ctx.markers.fired(self.key):
            return
        self.ctx.markers.mark(self.key)  # written and fsynced first: the restarted worker must see it
        self.fired(step, pid=os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)


class CorruptCheckpointInjector(Injector):
    """Flips one byte in the middle of this rank's largest shard file of one saved checkpoint.

    ``target`` is the job's ``CheckpointStore`` (the byte is flipped through its storage
    backend, so S3 works too) or, for tests, file / directory paths.
    """

    spec: CorruptCheckpoint

    def on_checkpoint_saved(self, step: int, target: Any) -> None:
        if step < self.spec.step or self.ctx.markers.fired(self.key):
            return
        shards = (
            _store_shards(target, step, self.ctx.rank) if hasattr(target, "backend") else _path_shards(target)
        )
        if not shards:
            self.log.warning("fault_skipped", step=step, reason="no shard file to corrupt")
            return
        name, size, read, write = max(shards, key=lambda s: (s[1], s[0]))
        data = bytearray(read())
        offset = size // 2
        data[offset] ^= 0xFF
        write(bytes(data))
        self.ctx.markers.mark(self.key)
        self.fired(step, file=name, offset=offset)


Shard = tuple[str, int, Callable[[], bytes], Callable[[bytes], Any]]


def _store_shards(store: Any, step: int, rank: int) -> list[Shard]:
    """This rank's committed files of checkpoint ``step`` (its rank files and DCP shard; the model file on rank 0)."""
    out: list[Shard] = []
    for name in store.step_dirs().get(step, []):
        mine = f"rank{rank:05d}" in name or f"/__{rank}_" in name or (rank == 0 and name.startswith("model-"))
        if name == "MANIFEST.json" or name.startswith(".") or not mine:
            continue
        key, backend = store.key(step, name), store.backend
        info = backend.stat(key)
        if info is not None and info.size > 0:
            out.append((key, info.size, partial(backend.get_bytes, key), partial(backend.put_bytes, key)))
    return out


def _path_shards(paths: Iterable[str | Path] | str | Path) -> list[Shard]:
    """Files among ``paths`` (files, or directories searched recursively); never the manifest."""
    items = [paths] if isinstance(paths, str | Path) else list(paths)
    files: list[Path] = []
    for item in map(Path, items):
        files += (
            [p for p in item.rglob("*") if p.is_file()] if item.is_dir() else [item] if item.is_file() else []
        )
    return [(str(p), p.stat().st_size, p.read_bytes, p.write_bytes) for p in files
            if p.name != "MANIFEST.json" and p.stat().st_size > 0]  # fmt: skip

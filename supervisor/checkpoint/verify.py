"""Verification: is every file there, whole, and the checkpoint complete and usable for this job?

Checks, in order: ``files`` (present, right size), ``checksums`` (streamed, never a whole
file in memory), ``components`` (what the manifest says plus what the store requires, for
every rank), ``world_size`` (compatible with the job: a DCP checkpoint reshards to any), and with
``deep`` ``loadable`` (each torch.save file opens with torch; a DCP ``.metadata`` loads and
covers exactly the listed files). The result goes into the manifest: a pass moves ``unverified`` to
``verified``; a failure moves the checkpoint to ``quarantined`` with the first problem as
the reason, so it is never selected as a rollback target. A world size the checkpoint's layout
cannot load on (sharded state, a group restarted on fewer ranks) fails the check for this job
only: the checkpoint is passed over, never quarantined.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.checkpoint.hashing import hash_path, hash_reader, split_checksum
from supervisor.checkpoint.manifest import Manifest, Verification
from supervisor.checkpoint.store import MANIFEST, CheckpointStore
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError, SupervisorError
from supervisor.storage.base import ObjectNotFound
from supervisor.storage.local import LocalBackend

PER_RANK = ("optimizer", "rng")
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
_PICKLED_OBJECTS = "UnpicklingError: Weights only load failed"
"""Files of an adopted checkpoint that the deep check opens with torch."""


class RestoreCheckError(CheckpointError):
    """A checkpoint that passed verification but whose state, once loaded, differs from the state
    saved (each rank's restored shard checksum against the one recorded at save): its files and
    their checksums were rewritten to match. The rank that finds it quarantines it
    (``sdk.steering.Steering.restore``)."""


@dataclass(slots=True)
class VerifyResult:
    step: int
    ok: bool
    checks: list[str]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    manifest: Manifest | None = None
    unfit: list[str] = field(default_factory=list)
    """The problems that are this job's, not the checkpoint's (a world size its layout cannot load
    on): it is no target now, and is never quarantined for them."""

    def to_json(self) -> dict:
        health = self.manifest.health.value if self.manifest else None
        return {
            "step": self.step,
            "ok": self.ok,
            "checks": self.checks,
            "problems": self.problems,
            "notes": self.notes,
            "health": health,
        }


def verify(
    store: CheckpointStore,
    step: int,
    *,
    deep: bool = False,
    expected_world_size: int | None = None,
    by: str = "store",
    record: bool = True,
) -> VerifyResult:
    """Verify checkpoint ``step`` (see module doc); records the result unless ``record`` is False."""
    manifest = store.manifest(step)
    checks = ["files", "checksums", "components", "world_size"] + (["loadable"] if deep else [])
    problems = _files_and_checksums(store, manifest)
    problems += _components(store, manifest)
    ws_problems, notes = _world_size(manifest, expected_world_size)
    problems += ws_problems
    if deep and not problems:
        problems += _loadable(store, manifest)
    result = VerifyResult(step, not problems, checks, problems, notes, manifest, unfit=ws_problems)
    store.log.info("verified", step=step, ok=result.ok, problems=problems[:3], by=by)
    if record:
        result.manifest = _record(store, step, result, by)
    return result


def _files_and_checksums(store: CheckpointStore, manifest: Manifest) -> list[str]:
    present = {o.key: o.size for o in store.backend.list(store.folder(manifest))}
    problems = []
    for entry in manifest.files:
        size = present.get(store.file_key(manifest, entry.name))
        if size is None:
            problems.append(f"{entry.name}: file missing")
            continue
        if size != entry.size:
            problems.append(f"{entry.name}: size {size} != {entry.size} in the manifest (truncated?)")
            continue
        try:
            algo, _ = split_checksum(entry.checksum)
            read, checksum = _hash(store, store.file_key(manifest, entry.name), algo)
        except ObjectNotFound:
            problems.append(f"{entry.name}: file missing")
            continue
        except SupervisorError as exc:
            problems.append(f"{entry.name}: {exc.message}")
            continue
        if read != entry.size:
            problems.append(f"{entry.name}: read {read} bytes, manifest says {entry.size}")
        elif checksum != entry.checksum:
            problems.append(f"{entry.name}: checksum mismatch ({checksum} != {entry.checksum})")
    return problems


def _hash(store: CheckpointStore, key: str, algorithm: str) -> tuple[int, str]:
    chunk = store.settings.chunk_bytes
    if isinstance(store.backend, LocalBackend):
        try:
            return hash_path(store.backend.path(key), algorithm, chunk)
        except FileNotFoundError:
            raise ObjectNotFound(f"no such object: {key}", source=store.backend.uri) from None
    with store.backend.open_read(key) as reader:
        return hash_reader(reader, algorithm, chunk)


def _components(store: CheckpointStore, manifest: Manifest) -> list[str]:
    problems = []
    covered = {c for f in manifest.files for c in f.components}
    for comp in sorted(set(manifest.components) | set(store.settings.required_components)):
        if comp not in covered:
            problems.append(f"component {comp!r} missing")
    ranked = [f for f in manifest.files if f.rank is not None]
    # DCP spreads model and optimizer over the ranks' files as it sees fit (replicated tensors
    # are written once): its completeness is the deep check of .metadata, not a file per rank.
    per_rank = ("rng",) if manifest.layout == "dcp" else PER_RANK
    for comp in per_rank if ranked else ():
        have = {f.rank for f in ranked if comp in f.components}
        if comp in covered and have != set(range(manifest.world_size)):
            missing = sorted(set(range(manifest.world_size)) - have)
            problems.append(f"component {comp!r} missing for ranks {missing}")
    return problems


def _world_size(manifest: Manifest, expected: int | None) -> tuple[list[str], list[str]]:
    if expected is None or expected == manifest.world_size:
        return [], []
    msg = f"saved with world size {manifest.world_size}, job has {expected}"
    if manifest.layout == "dcp":
        return [], [f"{msg}: DCP reshards model and optimizer; per-rank state is remapped on load"]
    if manifest.layout == "sharded":
        return [f"{msg}: sharded state cannot be resharded"], []
    return [], [f"{msg}: replicated state, per-rank state is remapped on load"]


def _loadable(store: CheckpointStore, manifest: Manifest) -> list[str]:
    """torch opens each torch.save file; a DCP ``.metadata`` loads and names only listed files,
    every item inside its file's bytes (the .distcp files are DCP's concatenated records)."""
    from supervisor.checkpoint import dcp_state  # torch only for deep checks
    from supervisor.checkpoint.training_state import check_loadable

    problems = _each_file(store, manifest, check_loadable, skip_dirs=True)
    for entry in manifest.files:
        head, _, tail = entry.name.rpartition("/")
        if tail != dcp_state.METADATA:
            continue
        prefix = f"{head}/" if head else ""
        listed = {f.name[len(prefix) :]: f.size for f in manifest.files if f.name.startswith(prefix)}
        with store.local_file(manifest.step, entry.name, manifest) as path:
            problems += dcp_state.check_metadata(path, listed)
    return problems


def _each_file(
    store: CheckpointStore,
    manifest: Manifest,
    check: Callable[[Path], str | None],
    *,
    skip_dirs: bool = False,
) -> list[str]:
    problems = []
    for entry in manifest.files:
        if skip_dirs and "/" in entry.name:
            continue
        if manifest.source is not None and Path(entry.name).suffix not in TORCH_SUFFIXES:
            continue  # an adopted framework file torch does not read (safetensors, json): checksum only
        with store.local_file(manifest.step, entry.name, manifest) as path:
            problem = check(path)
        if manifest.source is not None and problem and problem.startswith(_PICKLED_OBJECTS):
            # A framework pickles more than tensors (HF's RNG state, TrainingArguments) and loads it
            # itself: torch's weights-only loader refusing an object means the archive opened and
            # parsed (a damaged file fails before that), so it is not a reason to quarantine.
            problem = None
        if problem:
            problems.append(f"{entry.name}: not loadable: {problem}")
    return problems


def _record(store: CheckpointStore, step: int, result: VerifyResult, by: str) -> Manifest:
    # Re-read: a mark may have landed while the (slow) hashing ran; never write back a stale copy.
    current = store.manifest(step)
    entry = Verification(
        time=time.time(), ok=result.ok, checks=result.checks, problems=result.problems, by=by
    )
    updated = current.model_copy(update={"verifications": [*current.verifications[-19:], entry]})
    damage = [p for p in result.problems if p not in result.unfit]
    if not damage and updated.health == HealthMark.UNVERIFIED:
        updated = updated.with_health(
            HealthMark.VERIFIED, f"verification passed ({', '.join(result.checks)})"
        )
    elif damage and updated.health != HealthMark.QUARANTINED:
        updated = updated.with_health(HealthMark.QUARANTINED, f"verification failed: {damage[0]}")
    store.save_manifest(updated)
    return updated


__all__ = ["MANIFEST", "VerifyResult", "verify"]

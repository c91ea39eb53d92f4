"""Which checkpoint to roll back to, and which ones may go.

Rollback target: the newest ``healthy`` checkpoint with step <= onset - margin, re-verified
right before use. A failed re-verification quarantines it (with the reason) and the search
falls back to the next older one. ``diagnostic`` and ``quarantined`` ones are never targets.

Retention keeps: the newest K healthy; every step an open incident references (its
rollback target, its snapshots); the `latest` target and the block-time `latest`; and
everything newer than the newest healthy one (not judged yet). Everything else is deleted,
manifest first. A replaced quarantined or diagnostic save kept beside a re-save (``store.history``) goes
with its step, never before. Files no manifest lists (a killed writer's, a replaced
unjudged save's) go once they are older than ``stale_uncommitted_s``: age, not step,
because after a rollback a save in flight may well be at an older step than the newest
committed one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from supervisor.checkpoint.manifest import Manifest
from supervisor.checkpoint.store import CheckpointStore, is_manifest_name
from supervisor.checkpoint.verify import verify
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError
from supervisor.storage.local import LocalBackend

if TYPE_CHECKING:
    from supervisor.config.job import JobSpec


@dataclass(slots=True)
class RollbackTarget:
    step: int
    manifest: Manifest
    rejected: list[tuple[int, str]] = field(default_factory=list)
    """Newer candidates that failed re-verification, with why (each is now quarantined)."""


def select_rollback_target(
    store: CheckpointStore,
    onset_step: int,
    margin: int,
    *,
    expected_world_size: int | None = None,
    deep: bool | None = None,
) -> RollbackTarget:
    """The newest healthy checkpoint at or before ``onset_step - margin`` that passes re-verification.

    ``deep`` (open every file with torch) defaults to on for local storage; on S3 it would
    download everything once more just before the restore downloads it again.
    """
    if deep is None:
        deep = isinstance(store.backend, LocalBackend)
    limit = onset_step - margin
    log = store.log.bind(onset=onset_step, margin=margin)
    candidates = [m for m in store.manifests() if m.health == HealthMark.HEALTHY and m.step <= limit]
    rejected: list[tuple[int, str]] = []
    for manifest in sorted(candidates, key=lambda m: m.step, reverse=True):
        result = verify(
            store, manifest.step, deep=deep, expected_world_size=expected_world_size, by="rollback"
        )
        if result.ok and result.manifest is not None:
            log.info("rollback target selected", step=manifest.step, skipped=[s for s, _ in rejected])
            return RollbackTarget(manifest.step, result.manifest, rejected)
        reason = result.problems[0] if result.problems else "verification failed"
        log.warning("rollback candidate rejected", step=manifest.step, reason=reason)
        rejected.append((manifest.step, reason))
    detail = f"; rejected: {', '.join(f'{s} ({r})' for s, r in rejected)}" if rejected else ""
    raise CheckpointError(
        f"no healthy checkpoint at or before step {limit} (onset {onset_step} - margin {margin}){detail}",
        source=store.uri,
    )


def select_restart_target(
    store: CheckpointStore, *, expected_world_size: int | None = None, verify_unverified: bool = True
) -> Manifest | None:
    """Where a dead worker group restarts: the newest verified or healthy checkpoint that passes
    re-verification now, never an unverified `latest`. Unverified ones are verified on the way
    unless ``verify_unverified`` is False. A candidate that fails is quarantined and the next
    older one is tried. None when there is nothing to restart from."""
    usable = (HealthMark.VERIFIED, HealthMark.HEALTHY)
    candidates = usable + ((HealthMark.UNVERIFIED,) if verify_unverified else ())
    for manifest in sorted(store.manifests(), key=lambda m: m.step, reverse=True):
        if manifest.health not in candidates:
            continue
        # Re-verified right before use, as a rollback target is: a `verified` mark is a past fact.
        result = verify(store, manifest.step, expected_world_size=expected_world_size, by="restart")
        manifest = result.manifest or manifest
        if result.ok and manifest.health in usable:
            store.log.info("restart target selected", step=manifest.step, health=manifest.health.value)
            return manifest
    return None


@dataclass(slots=True)
class GcReport:
    deleted: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    orphans_deleted: int = 0
    uploads_aborted: int = 0


def collect_garbage(
    store: CheckpointStore, keep: int, protected: Iterable[int] = (), *, dry_run: bool = False
) -> GcReport:
    """Apply retention (module doc). ``protected``: steps referenced by open incidents."""
    dirs = store.step_dirs()
    manifests = {m.step: m for m in store.manifests()}
    keep_steps = _kept(store, manifests, keep, set(protected))
    report = GcReport(kept=sorted(s for s in manifests if s in keep_steps))
    for step in sorted(manifests):
        if step not in keep_steps:
            report.deleted.append(step)
            if not dry_run:
                store.delete_step(step, dirs.get(step, []))
    orphans = _orphans(store, dirs, manifests)
    report.orphans_deleted = len(orphans)
    if orphans and not dry_run:
        store.backend.delete(orphans)
    abort = getattr(store.backend, "abort_stale_uploads", None)  # S3: parts of killed multipart uploads
    if abort is not None and not dry_run:
        report.uploads_aborted = abort(store.root, time.time() - store.settings.stale_uncommitted_s)
    if dry_run:  # nothing was deleted: say what would be
        store.log.info(
            "retention dry run",
            would_delete=report.deleted,
            kept=report.kept,
            orphans=len(orphans),
            keep=keep,
        )
    else:
        store.log.info(
            "retention applied", deleted=report.deleted, kept=report.kept, orphans=len(orphans), keep=keep
        )
    return report


def _kept(store: CheckpointStore, manifests: dict[int, Manifest], keep: int, protected: set[int]) -> set[int]:
    healthy = sorted((s for s, m in manifests.items() if m.health == HealthMark.HEALTHY), reverse=True)
    kept = set(healthy[:keep]) | protected
    newest_healthy = healthy[0] if healthy else -1
    unjudged = (HealthMark.UNVERIFIED, HealthMark.VERIFIED)
    kept |= {s for s, m in manifests.items() if s > newest_healthy and m.health in unjudged}
    latest = store.latest()
    block = store.block_state()
    kept |= {s for s in (latest, block.latest_at_block if block else None) if s is not None}
    return kept


def _orphans(store: CheckpointStore, dirs: dict[int, list[str]], manifests: dict[int, Manifest]) -> list[str]:
    stale_before = time.time() - store.settings.stale_uncommitted_s
    mtimes = {o.key: o.mtime for o in store.backend.list(store.root)}
    out = []
    for step, names in dirs.items():
        listed: set[str] = set()
        if step in manifests:
            # A kept (replaced quarantined or diagnostic) save is history, not garbage: it and its files stay.
            for m in [manifests[step], *store.history(step)]:
                listed |= {f.name for f in m.files}
            listed |= {n for n in names if is_manifest_name(n)}
        for name in names:
            key = store.key(step, name)
            if name not in listed and mtimes.get(key, 0.0) <= stale_before:
                out.append(key)
    return out


def open_checkpoint_store(job: JobSpec) -> CheckpointStore:
    """The job's ``CheckpointStore`` on its storage backend (local directory or S3)."""
    from supervisor.storage import open_backend

    backend = open_backend(job.storage.path, job.storage.endpoint_url, job.storage.region)
    return CheckpointStore(backend, job.name)


def pick_rollback_target(
    store: CheckpointStore | None, *, max_step: int, min_mark: str, world_size: int
) -> tuple[int, dict[str, object]]:
    """The rollback target at or before ``max_step``, re-verified (deep; one that fails is
    quarantined by the store). ``min_mark="verified"``: a verified one when no healthy one qualifies."""
    if store is None:
        raise CheckpointError("the job has no checkpoint store")
    try:
        target = select_rollback_target(store, max_step, 0, expected_world_size=world_size)
        return target.step, {"ok": True, "health": "healthy", "rejected": [list(r) for r in target.rejected]}
    except CheckpointError:
        if min_mark != "verified":
            raise
    for manifest in sorted(store.manifests(), key=lambda m: m.step, reverse=True):
        if manifest.step <= max_step and manifest.health == HealthMark.VERIFIED:
            result = verify(store, manifest.step, deep=True, expected_world_size=world_size, by="rollback")
            if result.ok:
                return manifest.step, {"ok": True, "health": "verified", "rejected": []}
    raise CheckpointError(f"no healthy or verified checkpoint at or before step {max_step}", source=store.uri)


def restart_step(checkpoints: CheckpointStore | None, world_size: int) -> int | None:
    """The step a worker-group restart resumes from (``select_restart_target``), or None."""
    if checkpoints is None:
        return None
    target = select_restart_target(checkpoints, expected_world_size=world_size, verify_unverified=False)
    return None if target is None else int(target.step)


__all__ = [
    "GcReport",
    "RollbackTarget",
    "collect_garbage",
    "open_checkpoint_store",
    "pick_rollback_target",
    "restart_step",
    "select_restart_target",
    "select_rollback_target",
]

"""CheckpointStore: commit protocol, manifests, health marks, and the blockable `latest` pointer.

Layout under the storage root (docs/checkpoints.md)::

    <job>/checkpoints/step_00001200/<files>       written first, each atomically
    <job>/checkpoints/step_00001200/MANIFEST.json written last: the commit marker
    <job>/checkpoints/latest                      {"step": 1200}; atomic replace
    <job>/checkpoints/LATEST_BLOCK.json           who holds `latest` and why; survives restarts

A file name is relative to its step directory and may hold one level of directory: a DCP save
writes ``dcp-<save id>/.metadata`` and ``dcp-<save id>/__<rank>_0.distcp``. File names carry a per-save id, so re-saving a step never touches the files of the
checkpoint already committed there: until the new manifest lands, the old one is whole.
A re-save over a *quarantined* or *diagnostic* checkpoint (after a rollback or restart, the
new timeline saves the same step again, possibly the very step an incident's snapshot was
taken at) first keeps the old manifest as ``MANIFEST.<mark>.<save id>.json`` beside it: the
mark, its reason and the files it names stay as the step's history (``history(step)``) and go
only with the step itself. A *healthy* checkpoint is never replaced.
One writer (rank 0) commits; manifest updates are read-modify-write by one supervisor.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, ConfigDict, Field

from supervisor.checkpoint.hashing import default_algorithm, hash_reader
from supervisor.checkpoint.manifest import COMPONENTS, FileEntry, Manifest
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError, StorageError
from supervisor.logging import get_logger
from supervisor.storage.base import Backend, ObjectNotFound, join_key
from supervisor.storage.local import LocalBackend

MANIFEST = "MANIFEST.json"
LATEST = "latest"
BLOCK = "LATEST_BLOCK.json"
_STEP_DIR = re.compile(r"^step_(\d{8,})$")
# The reason a rank gives when it quarantines a checkpoint its restore check refused after
# loading; the drills' checks read it back.
RESTORE_CHECK_FAILED = "restore check failed"
_NO_LATEST = (HealthMark.DIAGNOSTIC, HealthMark.QUARANTINED)
_NO_REPLACE = (HealthMark.HEALTHY,)
#: Replaced manifests with these marks are kept as the step's history (evidence of an incident).
_KEEP_REPLACED = (HealthMark.QUARANTINED, HealthMark.DIAGNOSTIC)
_ARCHIVED = re.compile(r"^MANIFEST\.([a-z]+)\.([0-9a-f]+)\.json$")
_GOOD_LATEST = (HealthMark.HEALTHY, HealthMark.VERIFIED)
_LATEST_DOC = re.compile(rb'\{\s*"step"\s*:\s*(\d{1,18})\s*\}')
_MAX_POINTER_BYTES = 4096
MAX_MANIFEST_BYTES = 64 << 20
"""Largest manifest read (one of 10,000 files is ~2 MB)."""
_MAX_REASON_CHARS = 4000
"""Longest reason a health change records (`checkpoints mark --reason` refuses more)."""


class StoreSettings(BaseModel):
    """How a CheckpointStore checksums, verifies and collects garbage."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checksum: str = Field(default_factory=default_algorithm, description="Algorithm for new files.")
    required_components: tuple[str, ...] = Field(
        ("model", "optimizer"), description="A checkpoint missing any of these fails verification."
    )
    stale_uncommitted_s: float = Field(
        3600.0, ge=0, description="Uncommitted files older than this are garbage even at the newest step."
    )
    chunk_bytes: int = Field(
        1 << 20, ge=4096, description="Bytes per hash update (1 MiB stays in CPU cache)."
    )


class BlockHolder(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str
    incident: str | None = None
    since: float = Field(default_factory=time.time)


class BlockState(BaseModel):
    """Who holds `latest` still. Empty holders: not blocked (the file is then removed)."""

    model_config = ConfigDict(extra="forbid")

    holders: list[BlockHolder] = Field(default_factory=list)
    latest_at_block: int | None = None


def step_dir(step: int) -> str:
    return f"step_{step:08d}"


def save_id(manifest: Manifest) -> str:
    """A stable id of one save: its file names carry random ids, so they tell saves apart."""
    names = "\n".join(sorted(f.name for f in manifest.files)) + f"\n{manifest.created_at!r}"
    return hashlib.blake2b(names.encode(), digest_size=6).hexdigest()


def archived_name(manifest: Manifest) -> str:
    """Where a replaced manifest is kept in its step directory."""
    return f"MANIFEST.{manifest.health.value}.{save_id(manifest)}.json"


def is_manifest_name(name: str) -> bool:
    """The live manifest or a kept (replaced) one."""
    return name == MANIFEST or _ARCHIVED.match(name) is not None


class CheckpointStore:
    def __init__(self, backend: Backend, job: str, settings: StoreSettings | None = None) -> None:
        self.backend = backend
        self.job = job
        self.settings = settings or StoreSettings()  # type: ignore[call-arg]
        self.root = join_key(job, "checkpoints")
        self.log = get_logger("checkpoint", job=job)

    @property
    def uri(self) -> str:
        return f"{self.backend.uri.rstrip('/')}/{self.root}"

    def key(self, step: int, name: str) -> str:
        return join_key(self.root, step_dir(step), name)

    def where(self, step: int) -> str:
        return f"{self.uri}/{step_dir(step)}"

    # -- writing ----------------------------------------------------------------------------------

    def write_file(
        self,
        step: int,
        stem: str,
        write: Callable[[BinaryIO], None],
        *,
        rank: int | None = None,
        components: Iterable[str] = (),
        suffix: str = ".pt",
    ) -> FileEntry:
        """Write ``<stem>-<save id><suffix>`` of checkpoint ``step`` through ``write(fileobj)``.

        Returns the file's entry for the manifest. The checksum is taken from the bytes as
        stored (read back while the fsync / upload runs), streamed in chunks.
        """
        return self.write_named(
            step, f"{stem}-{uuid.uuid4().hex[:8]}{suffix}", write, rank=rank, components=components
        )

    def write_named(
        self,
        step: int,
        name: str,
        write: Callable[[BinaryIO], None],
        *,
        rank: int | None = None,
        components: Iterable[str] = (),
    ) -> FileEntry:
        """Write checkpoint ``step``'s file ``name`` (a path relative to the step directory; the
        caller makes it unique per save, as a DCP ``dcp-<save id>/`` directory does)."""
        components = list(components)
        unknown = [c for c in components if c not in COMPONENTS]
        if unknown:
            raise CheckpointError(f"unknown components {unknown}; known: {', '.join(COMPONENTS)}")
        algorithm, chunk = self.settings.checksum, self.settings.chunk_bytes
        size, checksum = self.backend.write_file(
            self.key(step, name), write, lambda reader: hash_reader(reader, algorithm, chunk)
        )
        return FileEntry(
            name=name, size=size, checksum=checksum, rank=rank, components=sorted(set(components))
        )

    def commit(
        self,
        step: int,
        *,
        world_size: int,
        files: list[FileEntry],
        metrics: dict[str, float | None] | None = None,
        extra: dict | None = None,
        mark: HealthMark = HealthMark.UNVERIFIED,
        layout: str = "replicated",
        source: str | None = None,
    ) -> Manifest:
        """Write MANIFEST.json (the commit), then advance `latest` unless blocked.

        ``source``: the files are not in the step directory but under this key (an adopted
        checkpoint a framework wrote; ``supervisor.checkpoint.adopt``)."""
        log = self.log.bind(step=step)
        previous = self.find(step)
        if previous is not None and previous.health in _NO_REPLACE:
            raise CheckpointError(
                f"step {step} already holds a {previous.health.value} checkpoint; it is never replaced",
                source=self.where(step),
            )
        folder = source if source is not None else join_key(self.root, step_dir(step))
        present = {o.key: o.size for o in self.backend.list(folder)}
        for entry in files:
            if present.get(join_key(folder, entry.name)) != entry.size:
                raise CheckpointError(
                    f"{entry.name}: missing or wrong size, not committing", source=self.where(step)
                )
        if previous is not None and previous.health in _KEEP_REPLACED:
            # Keep the replaced one (and so its files) before the new commit hides it; the
            # name is derived from that save, so a retried commit writes the same copy again.
            self.backend.put_bytes(self.key(step, archived_name(previous)), previous.to_bytes())
            log.info("replaced checkpoint kept as history", kept=archived_name(previous))
        manifest = Manifest(
            job=self.job,
            step=step,
            world_size=world_size,
            files=sorted(files, key=lambda f: (f.rank if f.rank is not None else -1, f.name)),
            components=sorted({c for f in files for c in f.components}),
            metrics=dict(metrics or {}),
            extra=dict(extra or {}),
            layout=layout,  # type: ignore[arg-type]
            source=source,
        )
        if mark != HealthMark.UNVERIFIED:
            manifest = manifest.with_health(mark, "marked at save")
        self.backend.put_bytes(self.key(step, MANIFEST), manifest.to_bytes())
        log.info(
            "checkpoint committed", files=len(files), bytes=sum(f.size for f in files), health=mark.value
        )
        self._maybe_advance_latest(manifest)
        return manifest

    def _maybe_advance_latest(self, manifest: Manifest) -> None:
        log = self.log.bind(step=manifest.step)
        block = self.block_state()
        if block is not None:
            log.info("latest not advanced: blocked", holders=[h.incident for h in block.holders])
            return
        if manifest.health in _NO_LATEST:
            log.info("latest not advanced", reason=f"checkpoint is {manifest.health.value}")
            return
        try:
            current = self.latest()
        except CheckpointError as exc:  # a damaged pointer is replaced, not a reason to fail a commit
            log.warning("replacing unreadable latest pointer", error=exc.one_line())
            current = None
        if current is not None and current > manifest.step:
            return
        self._write_latest(manifest.step)

    def _write_latest(self, step: int | None) -> None:
        key = join_key(self.root, LATEST)
        if step is None:
            self.backend.delete([key])
        else:
            self.backend.put_bytes(key, json.dumps({"step": step}).encode())

    def advance_latest(self, step: int) -> None:
        """Move `latest` forward to checkpoint ``step`` (an incident's block was released, or the run
        ended): only forward, never while blocked, never to a diagnostic or quarantined one."""
        self._maybe_advance_latest(self.manifest(step))

    def retreat_latest(self, step: int) -> None:
        """Training went back to checkpoint ``step`` (-1: to the start): `latest` must not name a
        step of the abandoned timeline, so a newer pointer moves back to ``step`` (or goes). This
        is not an advance: it happens while an incident holds the block, too."""
        try:
            current = self.latest()
            if current is None or current <= step:
                return
        except CheckpointError as exc:
            self.log.warning("replacing unreadable latest pointer", error=exc.one_line())
            current = None
        target = step if step >= 0 else None
        self._write_latest(target)
        self.log.info("latest moved back", from_step=current, to_step=target)

    # -- reading ----------------------------------------------------------------------------------

    def step_dirs(self) -> dict[int, list[str]]:
        """Every step directory (committed or not) -> its object keys."""
        out: dict[int, list[str]] = {}
        for obj in self.backend.list(self.root):
            parts = obj.key[len(self.root) + 1 :].split("/")
            m = _STEP_DIR.match(parts[0])
            if m and len(parts) >= 2:
                out.setdefault(int(m.group(1)), []).append("/".join(parts[1:]))
        return out

    def steps(self) -> list[int]:
        """Committed steps, ascending."""
        return sorted(step for step, names in self.step_dirs().items() if MANIFEST in names)

    def find(self, step: int) -> Manifest | None:
        try:
            data = self._get_small(self.key(step, MANIFEST), f"{self.where(step)}/{MANIFEST}")
        except ObjectNotFound:
            return None
        return Manifest.from_bytes(data, source=f"{self.where(step)}/{MANIFEST}")

    def _get_small(self, key: str, where: str, limit: int = MAX_MANIFEST_BYTES) -> bytes:
        """A manifest, pointer or block file; a local one past ``limit`` is refused by its size
        before it is read (a 1 GiB garbage manifest cost a GiB, then a parse)."""
        if isinstance(self.backend, LocalBackend):
            info = self.backend.stat(key)
            if info is None:
                raise ObjectNotFound(key)
            if info.size > limit:
                raise CheckpointError(f"larger than {limit:,} bytes; not a checkpoint record", source=where)
        return self.backend.get_bytes(key)

    def manifest(self, step: int) -> Manifest:
        found = self.find(step)
        if found is None:
            have = self.steps()
            hint = f"committed: {', '.join(map(str, have[-5:]))}" if have else "no committed checkpoints"
            raise CheckpointError(f"no checkpoint at step {step} ({hint})", source=self.uri)
        return found

    def manifests(self) -> list[Manifest]:
        """Every readable committed manifest, ascending; a corrupt one is logged and skipped."""
        out = []
        for step in self.steps():
            try:
                m = self.find(step)
            except CheckpointError as exc:
                self.log.warning("skipping unreadable manifest", step=step, error=exc.one_line())
                continue
            if m is not None:
                out.append(m)
        return out

    def history(self, step: int) -> list[Manifest]:
        """Earlier saves of ``step`` that a re-save replaced (quarantined, diagnostic), oldest first."""
        prefix = join_key(self.root, step_dir(step))
        out = []
        for name in (o.key[len(prefix) + 1 :] for o in self.backend.list(prefix)):
            if _ARCHIVED.match(name) is None:
                continue
            try:
                data = self.backend.get_bytes(self.key(step, name))
                out.append(Manifest.from_bytes(data, source=f"{self.where(step)}/{name}"))
            except (ObjectNotFound, CheckpointError) as exc:
                self.log.warning("skipping unreadable kept manifest", step=step, name=name, error=repr(exc))
        return sorted(out, key=lambda m: m.created_at)

    def saves(self, step: int) -> list[Manifest]:
        """Every save of ``step`` still on record: the kept ones (``history``), then the live one."""
        live = self.find(step)
        return [*self.history(step), *([live] if live is not None else [])]

    def folder(self, manifest: Manifest) -> str:
        """The key under which a checkpoint's files are: its step directory, or an adopted source."""
        return (
            manifest.source if manifest.source is not None else join_key(self.root, step_dir(manifest.step))
        )

    def file_key(self, manifest: Manifest, name: str) -> str:
        return join_key(self.folder(manifest), name)

    @contextmanager
    def local_file(self, step: int, name: str, manifest: Manifest | None = None) -> Iterator[Path]:
        """A local path with the file's bytes (for torch.load with mmap); ``manifest`` locates
        the files of an adopted checkpoint."""
        key = self.file_key(manifest, name) if manifest is not None else self.key(step, name)
        try:
            with self.backend.local_path(key) as path:
                yield path
        except ObjectNotFound:
            raise CheckpointError(f"{name}: file missing", source=self.where(step)) from None

    # -- health -----------------------------------------------------------------------------------

    def save_manifest(self, manifest: Manifest) -> None:
        """Atomically rewrite a committed manifest (health, verification results)."""
        self.backend.put_bytes(self.key(manifest.step, MANIFEST), manifest.to_bytes())

    def mark(self, step: int, to: HealthMark, reason: str) -> Manifest:
        """Move a checkpoint's health mark; the transition and its reason go into the history."""
        if not reason.strip():
            raise CheckpointError("a health change needs a reason", source=self.where(step))
        if len(reason) > _MAX_REASON_CHARS:
            raise CheckpointError(
                f"reason longer than {_MAX_REASON_CHARS:,} characters", source=self.where(step)
            )
        current = self.manifest(step)
        updated = current.with_health(to, reason)
        if updated is not current:
            self.save_manifest(updated)
            self.log.info("health changed", step=step, frm=current.health.value, to=to.value, reason=reason)
        return updated

    # -- latest and its block ---------------------------------------------------------------------

    def latest(self) -> int | None:
        """The step `latest` names (None: no pointer); CheckpointError when it is unreadable.

        The pointer is ``{"step": N}``: anything else (1e400, a 100k-deep list, a negative or
        fractional step, kilobytes of text) is refused in one line without being parsed whole."""
        try:
            data = self._get_small(join_key(self.root, LATEST), f"{self.uri}/{LATEST}", _MAX_POINTER_BYTES)
        except ObjectNotFound:
            return None
        except CheckpointError:
            data = b"x"  # too big to be a pointer: unreadable, said below
        where = f"{self.uri}/{LATEST}"
        match = (
            _LATEST_DOC.fullmatch(data[:_MAX_POINTER_BYTES].strip())
            if len(data) <= _MAX_POINTER_BYTES
            else None
        )
        if match is None:
            raise CheckpointError(
                'unreadable latest pointer (expected {"step": N})', source=where, field="step"
            )
        return int(match.group(1))

    def problems(self) -> list[str]:
        """What a reader of this store should be warned about, one line each: committed steps whose
        manifest cannot be read, and a `latest` that is unreadable or names no readable checkpoint."""
        out, readable = [], set()
        for step in self.steps():
            try:
                if self.find(step) is not None:
                    readable.add(step)
            except CheckpointError as exc:
                out.append(f"step {step}: {exc.one_line()}")
        try:
            latest = self.latest()
        except CheckpointError as exc:
            out.append(exc.one_line())
        else:
            if latest is not None and latest not in readable:
                why = "its manifest is unreadable" if latest in self.steps() else "no such checkpoint"
                out.append(f"{self.uri}/{LATEST}: names step {latest}, {why}")
        return out

    def quarantine(self, step: int, reason: str) -> Manifest:
        """A checkpoint that failed a check (verification, or the restore check after loading it)
        is quarantined: never a target again, and `latest` no longer names it (it moves back to the
        newest healthy or verified checkpoint before ``step``, or goes). Idempotent."""
        current = self.manifest(step)
        updated = current
        if current.health != HealthMark.QUARANTINED:
            updated = current.with_health(HealthMark.QUARANTINED, reason[:_MAX_REASON_CHARS])
            self.save_manifest(updated)
            self.log.warning(
                "checkpoint quarantined", step=step, frm=current.health.value, reason=reason[:300]
            )
        try:
            pointed = self.latest()
        except CheckpointError:
            pointed = step  # an unreadable pointer is replaced as well
        if pointed == step:
            below = [m.step for m in self.manifests() if m.step < step and m.health in _GOOD_LATEST]
            self._write_latest(max(below) if below else None)
            self.log.info(
                "latest moved off a quarantined checkpoint", frm=pointed, to=max(below) if below else None
            )
        return updated

    def block_state(self) -> BlockState | None:
        try:
            data = self.backend.get_bytes(join_key(self.root, BLOCK))
        except ObjectNotFound:
            return None
        try:
            state = BlockState.model_validate_json(data)
        except ValueError:
            # Fail closed: an unreadable block still blocks (a restart must not silently unblock).
            self.log.warning("unreadable block file; treating latest as blocked")
            return BlockState(holders=[BlockHolder(reason="unreadable block file")])
        return state if state.holders else None

    def block(self, reason: str, incident: str | int | None = None) -> BlockState:
        """Stop `latest` from advancing; idempotent per incident; persisted in storage."""
        state = self.block_state() or BlockState(latest_at_block=self.latest())
        key = None if incident is None else str(incident)
        if not any(h.incident == key for h in state.holders):
            state.holders.append(BlockHolder(reason=reason, incident=key))
            self.backend.put_bytes(join_key(self.root, BLOCK), state.model_dump_json(indent=1).encode())
            self.log.info("latest blocked", incident=key, reason=reason, latest=state.latest_at_block)
        return state

    def unblock(self, incident: str | int | None = None) -> BlockState | None:
        """Release ``incident``'s hold (all holds when None); returns what still holds `latest`."""
        state = self.block_state()
        if state is None:
            return None
        key = None if incident is None else str(incident)
        state.holders = [h for h in state.holders if incident is not None and h.incident != key]
        if state.holders:
            self.backend.put_bytes(join_key(self.root, BLOCK), state.model_dump_json(indent=1).encode())
            return state
        self.backend.delete([join_key(self.root, BLOCK)])
        self.log.info("latest unblocked", incident=key)
        return None

    def delete_step(self, step: int, names: Iterable[str]) -> None:
        """Delete one step: the manifests first (the live one, then the kept ones), so readers never
        see a half-deleted checkpoint."""
        names = list(names)
        manifests = sorted((n for n in names if is_manifest_name(n)), key=lambda n: n != MANIFEST)
        try:
            if manifests:
                self.backend.delete([self.key(step, n) for n in manifests])
            self.backend.delete([self.key(step, n) for n in names if n not in manifests])
        except StorageError as exc:
            # One failed deletion must not stop the collection of the others: it is retried next time.
            self.log.warning("checkpoint deletion failed", step=step, error=exc.one_line())

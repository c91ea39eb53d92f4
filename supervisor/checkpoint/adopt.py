"""Adopting a checkpoint a framework wrote: manifest, checksums and health marks, files left in place.

A framework (torchtitan's DCP ``step-N/``, an HF Trainer ``checkpoint-N/``, a Lightning
``.ckpt``) writes its checkpoint where and how it likes. Once it has *finished* writing,
``adopt`` records it in the store like one of ours: every file under the source with its size
and checksum, the components it holds, the metrics, and a manifest at
``<job>/checkpoints/step_<N>/MANIFEST.json`` naming the source (``Manifest.source``). From
then on it is verified, marked (``unverified -> verified -> healthy``, or quarantined),
selected as a rollback or restart target, blocked and retained exactly like a native one.
The files stay where the framework put them and stay the framework's: retention deletes
only the manifest of an adopted step; the framework's own rotation deletes its files (a
later verification then finds them missing and quarantines the step).

The source is a key in the store's storage backend (for a local store: a path under its
root): a directory (every file under it is listed, recursively) or a single file.

``adopt_local`` takes the framework's local path instead (what a callback sees): a path under
a local store's root is adopted in place; any other (a store on S3, an ``output_dir`` outside
the storage path) is first uploaded to ``<job>/framework/<name>``, so the checkpoint is in
storage like every other, and ``local_copy`` hands it back as a local path to a resuming
framework (downloaded once into a cache folder when the store is remote).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from supervisor.checkpoint.hashing import hash_path, hash_reader
from supervisor.checkpoint.manifest import COMPONENTS, FileEntry, Manifest
from supervisor.checkpoint.store import CheckpointStore
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError
from supervisor.storage.base import TEMP_MARKER, join_key
from supervisor.storage.local import LocalBackend

DCP_METADATA = ".metadata"


def adopt(
    store: CheckpointStore,
    step: int,
    source: str,
    *,
    components: Iterable[str] = ("model", "optimizer"),
    world_size: int = 1,
    metrics: Mapping[str, float | None] | None = None,
    extra: Mapping[str, object] | None = None,
    mark: HealthMark = HealthMark.UNVERIFIED,
) -> Manifest:
    """Commit a manifest for the finished framework checkpoint at ``source`` (module doc).

    ``components``: what the checkpoint holds (``COMPONENTS`` names). A directory with a DCP
    ``.metadata`` gets ``layout="dcp"`` (the deep check reads it); others ``"replicated"``.
    Adopting a step again (a framework re-save) follows the store's rules: a healthy one is
    never replaced, a quarantined or diagnostic one is kept as the step's history.
    """
    components = sorted(set(components))
    unknown = [c for c in components if c not in COMPONENTS]
    if unknown:
        raise CheckpointError(
            f"unknown components {unknown}; known: {', '.join(COMPONENTS)}", field="components"
        )
    folder, names = _files(store, source.strip("/"))
    files = [_entry(store, folder, name, components) for name in names]
    layout = "dcp" if DCP_METADATA in names else "replicated"
    manifest = store.commit(
        step, world_size=world_size, files=files, metrics=dict(metrics or {}),
        extra={"adopted_from": f"{store.backend.uri.rstrip('/')}/{source.strip('/')}", **dict(extra or {})},
        mark=mark, layout=layout, source=folder,
    )  # fmt: skip
    store.log.info("checkpoint adopted", step=step, source=source, files=len(files), layout=layout)
    return manifest


def _files(store: CheckpointStore, source: str) -> tuple[str, list[str]]:
    """(folder key, file names relative to it): a directory's files, or one file and its folder."""
    if not source:
        raise CheckpointError(
            "adopt needs the key of a directory or file, not the storage root", field="source"
        )
    if source == store.root or source.startswith(store.root + "/"):
        raise CheckpointError(
            f"{source}: inside the store's own checkpoints; adopt a framework's output", field="source"
        )
    names = sorted(
        o.key[len(source) + 1 :]
        for o in store.backend.list(source)
        if o.key.startswith(source + "/") and TEMP_MARKER not in o.key  # not "step-100/" for "step-10"
    )
    if not names and store.backend.stat(source) is not None:
        folder, _, name = source.rpartition("/")
        return folder, [name]
    if not names:
        raise CheckpointError(
            f"{source}: no such file or directory, or empty", source=store.backend.uri, field="source"
        )
    return source, names


def _entry(store: CheckpointStore, folder: str, name: str, components: list[str]) -> FileEntry:
    key, algorithm, chunk = join_key(folder, name), store.settings.checksum, store.settings.chunk_bytes
    if isinstance(store.backend, LocalBackend):
        size, checksum = hash_path(store.backend.path(key), algorithm, chunk)
    else:
        with store.backend.open_read(key) as reader:
            size, checksum = hash_reader(reader, algorithm, chunk)
    return FileEntry(name=name, size=size, checksum=checksum, rank=None, components=components)


def adopt_local(
    store: CheckpointStore,
    step: int,
    path: str | Path,
    *,
    components: Iterable[str] = ("model", "optimizer"),
    world_size: int = 1,
    metrics: Mapping[str, float | None] | None = None,
    extra: Mapping[str, object] | None = None,
) -> Manifest:
    """Adopt the finished framework checkpoint at local ``path`` (a directory or one file).

    Under a local store's root it is adopted where it is; elsewhere it is uploaded first to
    ``<job>/framework/<name>`` (module doc), file by file through the backend.
    """
    path = Path(path).resolve()
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or directory", field="source")
    backend = store.backend
    if isinstance(backend, LocalBackend) and (path == backend.root or backend.root in path.parents):
        key = path.relative_to(backend.root).as_posix()
    else:
        key = join_key(store.job, "framework", path.name)
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for f in files:
            name = f.relative_to(path).as_posix() if path.is_dir() else ""
            with f.open("rb") as src, backend.open_write(join_key(key, name) if name else key) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    return adopt(store, step, key, components=components, world_size=world_size, metrics=metrics,
                 extra={"local_path": str(path), "kind": "directory" if path.is_dir() else "file",
                        **dict(extra or {})})  # fmt: skip


def local_copy(store: CheckpointStore, manifest: Manifest, cache: str | Path | None = None) -> Path:
    """A local path of adopted checkpoint ``manifest`` for the framework to load (verify it first).

    A local store's files are used where they are; a remote store's are downloaded into
    ``cache`` (default ``$SUPERVISOR_CACHE`` or ``~/.cache/spike-supervisor``), once.
    """
    if manifest.source is None:
        raise CheckpointError(
            f"step {manifest.step} is the supervisor's own checkpoint, not a framework's", field="source"
        )
    single = manifest.extra.get("kind") == "file"
    backend = store.backend
    if isinstance(backend, LocalBackend):
        folder = backend.path(manifest.source)
        return folder / manifest.files[0].name if single else folder
    root = Path(cache or os.environ.get("SUPERVISOR_CACHE", "~/.cache/spike-supervisor")).expanduser()
    dest = root / store.job / f"step_{manifest.step:08d}"
    for entry in manifest.files:
        target = dest / entry.name
        if target.is_file() and target.stat().st_size == entry.size:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with backend.open_read(join_key(manifest.source, entry.name)) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    return dest / manifest.files[0].name if single else dest


__all__ = ["adopt", "adopt_local", "local_copy"]

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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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


__all__ = ["adopt"]

"""Model and optimizer state through torch.distributed.checkpoint (DCP).

``get_state_dict`` gives the model and optimizer state with fully qualified names, the same
for a plain module, DDP, FSDP2 (``fully_shard``) and DTensor / tensor-parallel modules:
sharded modules contribute their local shards, replicated tensors are written once (DCP
deduplicates them across ranks). ``dcp.save`` writes one ``__<rank>_<n>.distcp`` file per
rank and the coordinator's ``.metadata`` into a directory of the step, ``dcp-<save id>/``,
so a re-save of a step never touches the files of a committed one. ``dcp.load`` reshards:
a checkpoint written by N ranks loads on M ranks, into whatever layout the live module has,
in place (``set_state_dict`` copies into the live parameters and optimizer state).

Storage. On a local backend DCP's ``FileSystemWriter`` writes (and fsyncs) straight into the
step directory. On other backends (S3) it writes to a local staging directory and every file
then goes up through the backend's ``write_file``, with its retries and the checksum taken
during the upload: DCP stays the well-kept writer of the format, the backend stays the one
place that knows S3 (multipart, retries, credentials), and a file is durable on S3 before the
manifest can name it. Reads on S3 fetch only the files a rank's load plan touches.
"""

from __future__ import annotations

import pickle
import re
import shutil
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.futures import Future

from supervisor.checkpoint.dcp_reader import MmapReader, ShardHash
from supervisor.checkpoint.hashing import hash_path, new_hasher
from supervisor.checkpoint.manifest import FileEntry, Manifest
from supervisor.checkpoint.store import CheckpointStore
from supervisor.checkpoint.torch_io import crc_off
from supervisor.errors import CheckpointError
from supervisor.storage.local import LocalBackend

# DCP warns on every single-process save / load that it assumes one process; that is the intent
# here (world size 1, or a resharding load in one process), so exactly that message is silenced.
warnings.filterwarnings(
    "ignore", message=r"torch\.distributed is (disabled|unavailable)", category=UserWarning
)

METADATA = ".metadata"
DIR_PREFIX = "dcp-"
COMPONENTS = ("model", "optimizer")
_RANK_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


def live_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state by FQN (sharded modules: their local shards, as DTensors)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optimizer": optim_sd}


class HostStager:
    """Copies a state dict to host memory: what training waits for in an asynchronous save.

    DCP's ``DefaultStager``: CUDA tensors go to pinned host buffers (a device->host copy at
    full PCIe speed), CPU tensors are copied. Each copy goes through a stager of its own, the
    last one closed first: on CUDA a reused stager failed every copy after its first
    (``staging.py``).
    """

    def __init__(self) -> None:
        self._cuda = torch.cuda.is_available()
        self._stager: DefaultStager | None = None

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        self.close()
        self._stager = DefaultStager(StagingOptions(self._cuda, False, False, self._cuda))
        staged = self._stager.stage(state)
        assert isinstance(staged, dict)  # synchronous staging returns the dict itself
        return staged

    def close(self) -> None:
        if self._stager is not None:
            self._stager.close()
            self._stager = None


def fingerprint(model_state: dict[str, Any], algorithm: str) -> dict[str, str]:
    """This rank's model state, bit for bit: ``shard_layout`` (names, local shapes, dtypes) and
    ``shard_checksum`` (their bytes, names sorted). Recorded per rank at save; after a restore on
    the same layout the live shard must give the same checksum (a rollback provably restored it;
    ``dcp_reader.ShardHash`` takes the same checksum during the load)."""
    data = new_hasher(algorithm)
    for _, local in _locals(model_state):
        flat = local.detach().reshape(-1).contiguous().cpu()
        data.update(flat.view(torch.uint8).numpy().data)
    return {
        "shard_layout": shard_layout(model_state, algorithm),
        "shard_checksum": f"{algorithm}:{data.hexdigest()}",
    }


def shard_layout(model_state: dict[str, Any], algorithm: str) -> str:
    """``fingerprint``'s ``shard_layout`` alone (names, local shapes and dtypes: no data read)."""
    layout = new_hasher(algorithm)
    for name, local in _locals(model_state):
        layout.update(f"{name}:{tuple(local.shape)}:{local.dtype};".encode())
    return f"{algorithm}:{layout.hexdigest()}"


def _locals(model_state: dict[str, Any]) -> list[tuple[str, torch.Tensor]]:
    """(name, this rank's local tensor) of the state's tensors, names sorted."""
    out = []
    for name in sorted(model_state):
        value = model_state[name]
        if isinstance(value, torch.Tensor):
            out.append((name, value.to_local() if hasattr(value, "to_local") else value))
    return out


def new_dir_name(group: Any, world_size: int) -> str:
    """One directory name for this save on every rank (rank 0 draws it)."""
    box = [f"{DIR_PREFIX}{uuid.uuid4().hex[:10]}"]
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        dist.broadcast_object_list(box, src=0, group=group)
    return str(box[0])


def write(
    store: CheckpointStore,
    step: int,
    dirname: str,
    state: dict[str, Any],
    *,
    rank: int,
    group: Any,
) -> list[FileEntry]:
    """``dcp.save`` of ``state`` into ``<step>/<dirname>/``; this rank's file entries (size, checksum)."""
    backend = store.backend
    if isinstance(backend, LocalBackend):
        target = backend.path(store.key(step, dirname))
        _save(state, target, group)
        return [_entry(store, dirname, path, rank) for path in _mine(target, rank)]
    with tempfile.TemporaryDirectory(prefix="dcp-stage-") as tmp:
        _save(state, Path(tmp), group)
        return [_upload(store, step, dirname, path, rank) for path in _mine(Path(tmp), rank)]


def _save(state: dict[str, Any], path: Path, group: Any) -> None:
    try:
        writer = dcp.FileSystemWriter(path, sync_files=True)
        with crc_off():
            dcp.save(state, storage_writer=writer, process_group=group, no_dist=_single())
    except (Exception, CheckpointException) as exc:  # DCP: every rank's failure in one CheckpointException
        raise CheckpointError(f"dcp.save failed: {type(exc).__name__}: {_first_line(exc)}") from None


def _mine(directory: Path, rank: int) -> list[Path]:
    """The files this rank wrote (its ``__<rank>_*.distcp``), plus the ``.metadata`` on rank 0."""
    out = []
    for path in sorted(directory.iterdir()):
        m = _RANK_FILE.match(path.name)
        if (m and int(m.group(1)) == rank) or (path.name == METADATA and rank == 0):
            out.append(path)
    return out


def _entry(store: CheckpointStore, dirname: str, path: Path, rank: int) -> FileEntry:
    size, checksum = hash_path(path, store.settings.checksum, store.settings.chunk_bytes)
    return FileEntry(
        name=f"{dirname}/{path.name}",
        size=size,
        checksum=checksum,
        rank=None if path.name == METADATA else rank,
        components=list(COMPONENTS),
    )


def _upload(store: CheckpointStore, step: int, dirname: str, path: Path, rank: int) -> FileEntry:
    def copy(f: Any) -> None:
        with open(path, "rb") as src:
            shutil.copyfileobj(src, f, 8 << 20)

    return store.write_named(
        step,
        f"{dirname}/{path.name}",
        copy,
        rank=None if path.name == METADATA else rank,
        components=COMPONENTS,
    )


# -- load -----------------------------------------------------------------------------------------


def dcp_dir(manifest: Manifest) -> str:
    """The DCP directory (relative to the step) of a ``layout="dcp"`` checkpoint."""
    for entry in manifest.files:
        head, _, tail = entry.name.rpartition("/")
        if tail == METADATA and head.startswith(DIR_PREFIX):
            return head
    raise CheckpointError(f"no DCP {METADATA} in the manifest of step {manifest.step}", field="files")


def load(
    store: CheckpointStore,
    manifest: Manifest,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    group: Any = None,
    shard_hash: bool = False,
) -> str | None:
    """Load the checkpoint's model and optimizer state into the live objects, resharding as needed.

    ``shard_hash``: also return ``fingerprint``'s ``shard_checksum`` of the restored model state,
    hashed by the reader as it writes the live tensors (``dcp_reader.ShardHash``); None when the
    load could not be hashed so (the caller then fingerprints the live state)."""
    state = live_state(model, optimizer)
    dirname = dcp_dir(manifest)
    backend = store.backend
    folded = ShardHash(state["model"], store.settings.checksum) if shard_hash else None
    try:
        if isinstance(backend, LocalBackend):
            path = backend.path(store.key(manifest.step, dirname))
            reader: dcp.StorageReader = MmapReader(path, shard_hash=folded)
            dcp.load(state, storage_reader=reader, process_group=group, no_dist=_single())
        else:
            with tempfile.TemporaryDirectory(prefix="dcp-fetch-") as tmp:
                reader = FetchingReader(store, manifest.step, dirname, Path(tmp), shard_hash=folded)
                dcp.load(state, storage_reader=reader, process_group=group, no_dist=_single())
    except CheckpointError:
        raise
    except (Exception, CheckpointException) as exc:
        raise CheckpointError(
            f"dcp.load failed: {type(exc).__name__}: {_first_line(exc)}", source=store.where(manifest.step)
        ) from None
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    if folded is None or not _same_tensors(state["model"], live_state(model, optimizer)["model"]):
        return None  # set_state_dict put other tensors in place than the ones the reader hashed
    return folded.checksum


def _same_tensors(hashed: dict[str, Any], live: dict[str, Any]) -> bool:
    """The live model state is the tensors the reader wrote (same names, same storage)."""
    return hashed.keys() == live.keys() and all(
        not isinstance(v, torch.Tensor)
        or (isinstance(live[k], torch.Tensor) and live[k].data_ptr() == v.data_ptr())
        for k, v in hashed.items()
    )


class FetchingReader(MmapReader):
    """An MmapReader over a local cache that fetches each file from the backend on first use:
    a rank downloads ``.metadata`` and only the files its load plan reads."""

    def __init__(
        self,
        store: CheckpointStore,
        step: int,
        dirname: str,
        cache: Path,
        shard_hash: ShardHash | None = None,
    ) -> None:
        super().__init__(cache, shard_hash=shard_hash)
        self.store, self.step, self.dirname, self.cache = store, step, dirname, cache

    def _fetch(self, name: str) -> None:
        local = self.cache / name
        if local.exists():
            return
        part = local.with_name(local.name + ".part")
        key = self.store.key(self.step, f"{self.dirname}/{name}")
        with self.store.backend.open_read(key) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 8 << 20)
        part.rename(local)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        self._fetch(METADATA)
        return super().read_metadata(*args, **kwargs)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for name in sorted({self.storage_data[item.storage_index].relative_path for item in plan.items}):
            self._fetch(name)
        return super().read_data(plan, planner)


# -- deep verification ----------------------------------------------------------------------------


def check_metadata(path: Path, listed: dict[str, int]) -> list[str]:
    """Problems of a DCP ``.metadata`` against the files a manifest lists (name -> size):
    every file it references is listed, and every item lies inside its file."""
    try:
        with open(path, "rb") as f:
            metadata = pickle.load(f)  # DCP's own format; read exactly as dcp.load reads it
        storage = metadata.storage_data
    except Exception as exc:
        return [f"{METADATA}: not loadable: {type(exc).__name__}: {_first_line(exc)}"]
    problems: list[str] = []
    for info in storage.values():
        size = listed.get(info.relative_path)
        if size is None:
            problems.append(f"{METADATA}: references {info.relative_path}, which the manifest does not list")
        elif info.offset + info.length > size:
            problems.append(
                f"{info.relative_path}: an item ends at byte {info.offset + info.length} > {size}"
            )
        if len(problems) >= 5:
            break
    return sorted(set(problems))


def _single() -> bool:
    """No process group: DCP saves / loads this process alone (and says so, unasked, unless told)."""
    return not (dist.is_available() and dist.is_initialized())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""

"""A DCP reader that copies each tensor record once, from an mmap of the file into the live tensor.

DCP's ``FileSystemReader`` ``torch.load``s every tensor record through a Python stream into a
new tensor and then copies that into the destination: the bytes cross memory three times,
and a restore took ~4x the mmap'd torch.save path (bench/checkpoint_io.py). A record is a
``torch.save`` zip of one tensor whose storage DCP keeps minimal, stored uncompressed. This
reader finds the storage bytes through the zip's own directory, reads the tensor's layout
from its pickle with an unpickler that admits only a tensor rebuild (no other class or
call), views the bytes in place and copies the requested slice straight into the target.
Anything else (bytes items, another layout, a big-endian host) goes through DCP's own path.

The restore's self-check (``dcp_state.fingerprint`` of the restored model state against the one
saved) is folded into that copy when the load is in place (``ShardHash``): each model tensor is
copied in chunks of ``FOLD_CHUNK`` bytes and each chunk is hashed from the live tensor while it
is still in the CPU cache, instead of reading the whole model again after the load. The hash
sees the live tensors' bytes in the fingerprint's order (names sorted), after every write to
them, so it equals the fingerprint taken after the load; any item it cannot cover so (another
layout, a slice, a device tensor, aliased storage) leaves it unset and the check hashes the
live state after the load, as before.
"""

from __future__ import annotations

import io
import mmap
import pickle
import struct
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from supervisor.checkpoint.hashing import new_hasher

_STORAGE_DTYPES = {
    "FloatStorage": torch.float32, "DoubleStorage": torch.float64, "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool, "ComplexFloatStorage": torch.complex64, "ComplexDoubleStorage": torch.complex128,
}  # fmt: skip
"""The storage classes a torch.save pickle names, by dtype (any other dtype: DCP's own path)."""


class _Window(io.RawIOBase):
    """A read-only, seekable file over ``buf[start:start + length]`` (for zipfile), without copying."""

    def __init__(self, buf: mmap.mmap, start: int, length: int) -> None:
        self.buf, self.start, self.length, self.pos = buf, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.length}[whence]
        self.pos = max(0, min(self.length, base + offset))
        return self.pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), self.length - self.pos)
        at = self.start + self.pos
        b[:n] = self.buf[at : at + n]
        self.pos += n
        return n


class _Layout(pickle.Unpickler):
    """Reads ``data.pkl`` of a one-tensor torch.save: (storage key, dtype, offset, size, stride)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return lambda storage, offset, size, stride, *_: (storage, offset, tuple(size), tuple(stride))
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name in _STORAGE_DTYPES:
            return _STORAGE_DTYPES[name]  # the storage class stands for its dtype
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        kind, storage_type, key, _location, numel = pid
        if kind != "storage":
            raise pickle.UnpicklingError(str(kind))
        return key, storage_type, int(numel)


def _data_offset(buf: mmap.mmap, start: int, info: zipfile.ZipInfo) -> int | None:
    """Where an uncompressed member's bytes begin in ``buf`` (its local header's lengths; no CRC
    check: the store writes records with torch's CRC off and checksums whole files instead)."""
    if info.compress_type != zipfile.ZIP_STORED:
        return None
    head = start + info.header_offset
    name_len, extra_len = struct.unpack("<HH", buf[head + 26 : head + 30])
    return head + 30 + name_len + extra_len


def _view(buf: mmap.mmap, start: int, length: int) -> torch.Tensor | None:
    """The record's tensor as a view into ``buf``; None when the record is not the plain layout."""
    with zipfile.ZipFile(_Window(buf, start, length)) as zf:
        pkl = next((i for i in zf.infolist() if i.filename.endswith("/data.pkl")), None)
        at = _data_offset(buf, start, pkl) if pkl is not None else None
        if pkl is None or at is None:
            return None
        layout = _Layout(io.BytesIO(buf[at : at + pkl.file_size])).load()
        if not (isinstance(layout, tuple) and len(layout) == 4):
            return None
        (key, dtype, numel), offset, size, stride = layout
        info = zf.getinfo(f"{pkl.filename.rsplit('/', 1)[0]}/data/{key}")
        data = _data_offset(buf, start, info)
        if not isinstance(dtype, torch.dtype) or data is None or info.file_size != numel * dtype.itemsize:
            return None
    flat = (
        torch.frombuffer(buf, dtype=dtype, count=numel, offset=data) if numel else torch.empty(0, dtype=dtype)
    )
    return flat.as_strided(size, stride, offset)


FOLD_CHUNK = 1 << 20
"""Bytes copied then hashed at a time when the self-check is folded into the copy (fits in L2)."""


class ShardHash:
    """``dcp_state.fingerprint``'s ``shard_checksum`` of the restored model state, taken by the reader
    as it writes the live tensors (module doc). ``checksum`` is None unless every model tensor was
    covered whole, in order, in place."""

    def __init__(self, model_state: dict[str, Any], algorithm: str, prefix: str = "model.") -> None:
        self.algorithm, self.prefix = algorithm, prefix
        self.live = {n: v for n, v in model_state.items() if isinstance(v, torch.Tensor)}
        self.order = sorted(self.live)
        self._hasher = new_hasher(algorithm)
        self._next = 0
        # Plain CPU tensors only (a DTensor's bytes are its shard's, a device tensor's are not here),
        # each with a storage of its own: with tied weights a later write could change a hashed tensor.
        self.usable = all(t.device.type == "cpu" and not hasattr(t, "to_local") for t in self.live.values())
        if self.usable:
            storages = [t.untyped_storage().data_ptr() for t in self.live.values() if t.numel()]
            self.usable = len(set(storages)) == len(storages)

    def name(self, item: ReadItem) -> str | None:
        """The model state name an item writes, or None (an optimizer item, another component)."""
        fqn = item.dest_index.fqn
        return (
            fqn[len(self.prefix) :]
            if fqn.startswith(self.prefix) and fqn[len(self.prefix) :] in self.live
            else None
        )

    def copy(self, name: str, item: ReadItem, source: torch.Tensor, target: torch.Tensor) -> bool:
        """Copy ``source`` into ``target`` hashing it on the way; False (nothing done) when this
        item cannot be folded: then the caller copies and the fold is given up."""
        live = self.live[name]
        whole = target.size() == live.size() and not any(item.dest_offsets) and source.size() == live.size()
        if not (
            self.usable and self._next < len(self.order) and self.order[self._next] == name and whole
            and target.data_ptr() == live.data_ptr() and target.is_contiguous() and source.is_contiguous()
            and source.dtype == target.dtype
        ):  # fmt: skip
            self.usable = False
            return False
        dst, src = target.view(-1), source.view(-1)
        step = max(1, FOLD_CHUNK // max(1, target.element_size()))
        for at in range(0, dst.numel(), step):
            chunk = dst[at : at + step]
            chunk.copy_(src[at : at + step])
            self._hasher.update(chunk.view(torch.uint8).numpy().data)
        self._next += 1
        return True

    @property
    def checksum(self) -> str | None:
        if not self.usable or self._next != len(self.order):
            return None
        return f"{self.algorithm}:{self._hasher.hexdigest()}"


class MmapReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose tensor reads copy once, from an mmap (module doc).

    ``shard_hash``: fold the restore's self-check into the copy (``ShardHash``)."""

    def __init__(self, *args: Any, shard_hash: ShardHash | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shard_hash = shard_hash

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if sys.byteorder != "little":
            if self.shard_hash is not None:
                self.shard_hash.usable = False
            return super().read_data(plan, planner)
        bufs: dict[str, mmap.mmap] = {}
        for item in plan.items:
            name = self.storage_data[item.storage_index].relative_path
            if name not in bufs:
                with open(Path(self.path) / name, "rb") as f:
                    # Writable (copy on write, never written) so frombuffer takes it; never closed
                    # here: the views hold it, and it unmaps when the last of them is gone.
                    bufs[name] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        rest = [item for item in self._ordered(plan.items) if not self._read_item(bufs, item, planner)]
        if rest:
            if self.shard_hash is not None and any(self.shard_hash.name(i) for i in rest):
                self.shard_hash.usable = False
            return super().read_data(LoadPlan(rest, plan.storage_data, plan.planner_data), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _ordered(self, items: list[ReadItem]) -> list[ReadItem]:
        """Plan order; with a folded self-check, every other item first, then the model's by name
        (the fingerprint's order), so nothing is written into a model tensor after it was hashed."""
        sh = self.shard_hash
        if sh is None:
            return items
        named = {id(i): sh.name(i) for i in items}
        return [i for i in items if named[id(i)] is None] + sorted(
            (i for i in items if named[id(i)] is not None), key=lambda i: str(named[id(i)])
        )

    def _read_item(self, bufs: dict[str, mmap.mmap], item: ReadItem, planner: LoadPlanner) -> bool:
        """Copy one tensor item from its file's mmap into its target; False: left for DCP's path."""
        info = self.storage_data[item.storage_index]
        if item.type == LoadItemType.BYTE_IO or info.transform_descriptors:
            return False
        source = _view(bufs[info.relative_path], info.offset, info.length)
        if source is None:
            return False
        source = narrow_tensor_by_index(source, item.storage_offsets, item.lengths)
        target = planner.resolve_tensor(item).detach()
        if target.size() != source.size():
            raise AssertionError(
                f"{item.storage_index}: size {tuple(source.size())} != {tuple(target.size())}"
            )
        name = self.shard_hash.name(item) if self.shard_hash is not None else None
        if name is None or not self.shard_hash.copy(name, item, source, target):  # type: ignore[union-attr]
            target.copy_(source)
        planner.commit_tensor(item, target)
        return True

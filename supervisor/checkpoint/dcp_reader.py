"""A DCP reader that copies each tensor record once, from an mmap of the file into the live tensor.

DCP's ``FileSystemReader`` ``torch.load``s every tensor record through a Python stream into a
new tensor and then copies that into the destination: the bytes cross memory three times,
and a restore took ~4x the mmap'd torch.save path (bench/checkpoint_io.py). A record is a
``torch.save`` zip of one tensor whose storage DCP keeps minimal, stored uncompressed. This
reader finds the storage bytes through the zip's own directory, reads the tensor's layout
from its pickle with an unpickler that admits only a tensor rebuild (no other class or
call), views the bytes in place and copies the requested slice straight into the target.
Anything else (bytes items, another layout, a big-endian host) goes through DCP's own path.
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


class MmapReader(dcp.FileSystemReader):
    """``FileSystemReader`` whose tensor reads copy once, from an mmap (module doc)."""

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if sys.byteorder != "little":
            return super().read_data(plan, planner)
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        rest: list[ReadItem] = []
        for name, items in per_file.items():
            rest += self._read_file(Path(self.path) / name, items, planner)
        if rest:
            return super().read_data(LoadPlan(rest, plan.storage_data, plan.planner_data), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_file(self, path: Path, items: list[ReadItem], planner: LoadPlanner) -> list[ReadItem]:
        """Copy the tensor items of one file into their targets; returns the items left for DCP."""
        rest = []
        with open(path, "rb") as f:
            # Writable (copy on write, never written) so frombuffer takes it; never closed here:
            # the views hold it, and it unmaps when the last of them is gone.
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        for item in items:
            info = self.storage_data[item.storage_index]
            source = None
            if item.type != LoadItemType.BYTE_IO and not info.transform_descriptors:
                source = _view(buf, info.offset, info.length)
            if source is None:
                rest.append(item)
                continue
            source = narrow_tensor_by_index(source, item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item).detach()
            if target.size() != source.size():
                raise AssertionError(
                    f"{item.storage_index}: size {tuple(source.size())} != {tuple(target.size())}"
                )
            target.copy_(source)
            planner.commit_tensor(item, target)
        return rest

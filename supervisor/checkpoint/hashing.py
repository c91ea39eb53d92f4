"""Checksums, chosen by measurement (bench/checkpoint_io.py; figures in bench/README.md).

A checksum is written ``<algorithm>:<hex>`` so every file says how to check it. The default
is xxh3_128 (~27 GB/s here, faster than a warm read) when the ``xxhash`` package is present,
else zlib's crc32 (~4 GB/s, stdlib). Hashing always streams in 1 MiB chunks, never a whole
file in memory: local files through a bounded mmap window, other storage through one
page-aligned buffer. On save the store hashes each file as stored (read back from the page
cache while the fsync runs), so the hash hides behind the disk instead of adding to it.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from supervisor.errors import CheckpointError
from supervisor.storage.base import aligned_buffer

CHUNK = 1 << 20
WINDOW = 64 << 20  # a multiple of mmap.ALLOCATIONGRANULARITY


class Hasher(Protocol):
    def update(self, data: Any, /) -> None: ...
    def hexdigest(self) -> str: ...


class _Zlib:
    """zlib's crc32 / adler32 behind the hashlib interface."""

    def __init__(self, fn: Callable[[Any, int], int], start: int) -> None:
        self.fn, self.value = fn, start

    def update(self, data: Any, /) -> None:
        self.value = self.fn(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value & 0xFFFFFFFF:08x}"


def _xxh3_128() -> Hasher:
    import xxhash  # optional dependency: the fastest choice where installed

    return xxhash.xxh3_128()


ALGORITHMS: dict[str, Callable[[], Hasher]] = {
    "xxh3_128": _xxh3_128,
    "crc32": lambda: _Zlib(zlib.crc32, 0),
    "adler32": lambda: _Zlib(zlib.adler32, 1),
    "sha256": lambda: hashlib.sha256(),
    "blake2b": lambda: hashlib.blake2b(),
}


def available(name: str) -> bool:
    try:
        ALGORITHMS[name]()
    except (KeyError, ImportError):
        return False
    return True


def default_algorithm() -> str:
    return "xxh3_128" if available("xxh3_128") else "crc32"


def new_hasher(name: str) -> Hasher:
    try:
        factory = ALGORITHMS[name]
    except KeyError:
        raise CheckpointError(
            f"unknown checksum algorithm {name!r}; known: {', '.join(ALGORITHMS)}"
        ) from None
    try:
        return factory()
    except ImportError:
        raise CheckpointError(
            f"checksum algorithm {name!r} needs the `xxhash` package (pip install xxhash)"
        ) from None


def split_checksum(checksum: str) -> tuple[str, str]:
    algo, sep, digest = checksum.partition(":")
    if not sep or not digest:
        raise CheckpointError(f"malformed checksum {checksum!r}; expected <algorithm>:<hex>")
    return algo, digest


def hash_reader(reader: BinaryIO, algorithm: str, chunk: int = CHUNK) -> tuple[int, str]:
    """(size, checksum) of a stream, read through one page-aligned buffer of ``chunk`` bytes.

    1 MiB chunks stay in the CPU cache between the read and the hash; a reader thread
    overlapping the two measured slower on a busy 2-core machine (bench/README.md).
    """
    hasher = new_hasher(algorithm)
    view = memoryview(aligned_buffer(chunk))
    size = 0
    while n := reader.readinto(view):  # type: ignore[attr-defined]
        hasher.update(view[:n])
        size += n
    return size, f"{algorithm}:{hasher.hexdigest()}"


def hash_path(path: Path, algorithm: str, chunk: int = CHUNK, window: int = WINDOW) -> tuple[int, str]:
    """(size, checksum) of a local file, hashed straight out of the page cache through an mmap
    window (no copy into a buffer: faster than a plain read); at most ``window`` bytes mapped."""
    hasher = new_hasher(algorithm)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, window):
            length = min(window, size - offset)
            with mmap.mmap(f.fileno(), length, prot=mmap.PROT_READ, offset=offset) as mapped:
                mapped.madvise(mmap.MADV_SEQUENTIAL)
                view = memoryview(mapped)
                try:
                    for start in range(0, length, chunk):
                        hasher.update(view[start : start + chunk])
                finally:
                    view.release()
    return size, f"{algorithm}:{hasher.hexdigest()}"

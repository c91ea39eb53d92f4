"""Checksums, chosen by measurement (bench/checkpoint_io.py; figures in bench/README.md).

A checksum is written ``<algorithm>:<hex>`` so every file says how to check it. The default
is xxh3_128 (~27 GB/s here, faster than a warm read) when the ``xxhash`` package is present,
else zlib's crc32 (~4 GB/s, stdlib). Hashing always streams: chunks read through two
page-aligned buffers, the next read overlapping the hash of the current chunk. On save the
store hashes the file as written (read back from the page cache while the fsync runs), so
the hash hides behind the disk instead of adding to the save.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Protocol

from supervisor.errors import CheckpointError
from supervisor.storage.base import aligned_buffer

CHUNK = 8 << 20


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


def hash_reader(
    reader: BinaryIO, algorithm: str, pool: ThreadPoolExecutor, chunk: int = CHUNK
) -> tuple[int, str]:
    """(size, checksum) of a stream: two page-aligned buffers, reading one while hashing the other."""
    hasher = new_hasher(algorithm)
    views = [memoryview(aligned_buffer(chunk)), memoryview(aligned_buffer(chunk))]
    size, cur = 0, 0
    pending = pool.submit(reader.readinto, views[cur])  # type: ignore[attr-defined]
    while True:
        n = pending.result()
        if not n:
            break
        pending = pool.submit(reader.readinto, views[1 - cur])  # type: ignore[attr-defined]
        hasher.update(views[cur][:n])
        size += n
        cur = 1 - cur
    return size, f"{algorithm}:{hasher.hexdigest()}"

"""The storage contract: a flat key space of immutable-ish files with atomic whole-object writes.

Keys are ``/``-separated and relative to the backend's root (a directory, or an S3
bucket + prefix). Two guarantees every backend gives, and the checkpoint store relies on:

- ``open_write(key)`` makes the object visible only when the ``with`` block exits cleanly
  (local: temp file + fsync + rename; S3: the PUT / multipart completion is the commit);
  an exception or a killed process leaves no object under ``key``.
- ``put_bytes(key, data)`` replaces ``key`` atomically: readers see the old or the new bytes.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol, TypeVar, runtime_checkable

from supervisor.errors import EXIT_BAD_INPUT, StorageError

T = TypeVar("T")

TEMP_MARKER = ".tmp-"
"""Part of every in-flight temp name; such keys are never objects, only GC leftovers."""


class ObjectNotFound(StorageError):
    """The key does not exist (a normal answer for readers: a checkpoint without a manifest)."""

    exit_code = EXIT_BAD_INPUT  # escaping a command, it names something a person asked for


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float


@runtime_checkable
class Backend(Protocol):
    """One storage location. ``uri`` is for messages: it never contains credentials."""

    uri: str

    def open_write(self, key: str) -> AbstractContextManager[BinaryIO]:
        """A binary writer whose bytes become ``key`` atomically when the block exits cleanly."""
        ...

    def write_file(self, key: str, write: Callable[[BinaryIO], None], digest: Callable[[BinaryIO], T]) -> T:
        """Like ``open_write``, plus ``digest(reader)`` over the written bytes, run while they are made
        durable (local: during the fsync; S3: during the upload). Returns the digest's result."""
        ...

    def put_bytes(self, key: str, data: bytes) -> None:
        """Atomically create or replace a small object."""
        ...

    def get_bytes(self, key: str) -> bytes:
        """The whole object; raises ObjectNotFound."""
        ...

    def open_read(self, key: str) -> AbstractContextManager[BinaryIO]:
        """A streaming reader supporting ``readinto``; raises ObjectNotFound."""
        ...

    def local_path(self, key: str) -> AbstractContextManager[Path]:
        """A local file with the object's bytes (the file itself, or a temp download removed after)."""
        ...

    def stat(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under ``prefix`` (recursive), including leftover temp files."""
        ...

    def delete(self, keys: Iterable[str]) -> None:
        """Delete keys; missing keys are ignored."""
        ...


def aligned_buffer(size: int) -> mmap.mmap:
    """A page-aligned anonymous buffer: reading into one is several times faster than into an unaligned one."""
    return mmap.mmap(-1, size)


def iter_chunks(reader: BinaryIO, chunk_size: int = 8 << 20) -> Iterator[memoryview]:
    """Stream a reader through one page-aligned buffer (never the whole object in memory).

    Each yielded view is only valid until the next iteration.
    """
    # The buffer is freed by refcounting, not closed here: the caller may still hold the last view.
    view = memoryview(aligned_buffer(chunk_size))
    while True:
        n = reader.readinto(view)  # type: ignore[attr-defined]
        if not n:
            return
        yield view[:n]


def join_key(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))

"""A directory on a local (or mounted) filesystem."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, TypeVar

from supervisor.errors import StorageError
from supervisor.storage.base import TEMP_MARKER, ObjectInfo, ObjectNotFound

T = TypeVar("T")


def _digest_during_fsync(f: BinaryIO, tmp: Path, digest: Callable[[BinaryIO], T]) -> T:
    # The digest reads the bytes back from the page cache while the disk absorbs them, so it
    # hides behind the fsync instead of adding to the save (bench/README.md has the figures).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="fsync") as pool:
        synced = pool.submit(os.fsync, f.fileno())
        with open(tmp, "rb", buffering=0) as reader:
            result = digest(reader)
        synced.result()
    return result


def fsync_dir(path: Path) -> None:
    """Make a rename durable: the directory entry itself must reach the disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalBackend:
    """Objects are files under ``root``; writes go to a temp name, fsync, then ``os.replace``."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.uri = str(self.root)

    def path(self, key: str) -> Path:
        """The file behind ``key`` (it may not exist)."""
        path = (self.root / key).resolve()
        if self.root != path and self.root not in path.parents:
            raise StorageError(f"key escapes the storage root: {key!r}", source=self.uri)
        return path

    @contextmanager
    def _staged(self, key: str, digest: Callable[[BinaryIO], T] | None) -> Iterator[tuple[BinaryIO, list[T]]]:
        final = self.path(key)
        tmp = final.with_name(f".{final.name}{TEMP_MARKER}{uuid.uuid4().hex[:12]}")
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            f = open(tmp, "wb", buffering=0)  # noqa: SIM115 - closed below on every path
        except OSError as exc:
            raise StorageError(f"cannot write {key}: {exc.strerror}", source=self.uri) from None
        result: list[T] = []
        try:
            yield f, result
            if digest is None:
                os.fsync(f.fileno())
            else:
                result.append(_digest_during_fsync(f, tmp, digest))
            f.close()
            os.replace(tmp, final)
            fsync_dir(final.parent)
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise

    @contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        with self._staged(key, None) as (f, _):
            yield f

    def write_file(self, key: str, write: Callable[[BinaryIO], None], digest: Callable[[BinaryIO], T]) -> T:
        with self._staged(key, digest) as (f, result):
            write(f)
        return result[0]

    def put_bytes(self, key: str, data: bytes) -> None:
        with self.open_write(key) as f:
            f.write(data)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"no such object: {key}", source=self.uri) from None
        except OSError as exc:
            raise StorageError(f"cannot read {key}: {exc.strerror}", source=self.uri) from None

    @contextmanager
    def open_read(self, key: str) -> Iterator[BinaryIO]:
        try:
            f = open(self.path(key), "rb", buffering=0)  # noqa: SIM115
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"no such object: {key}", source=self.uri) from None
        with f:
            yield f

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        path = self.path(key)
        if not path.is_file():
            raise ObjectNotFound(f"no such object: {key}", source=self.uri)
        yield path

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self.path(key).stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        return ObjectInfo(key, st.st_size, st.st_mtime)

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self.path(prefix) if prefix else self.root
        if not base.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = Path(dirpath) / name
                try:
                    st = full.stat()
                except FileNotFoundError:  # deleted while walking
                    continue
                out.append(ObjectInfo(full.relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return sorted(out, key=lambda o: o.key)

    def delete(self, keys: Iterable[str]) -> None:
        parents = set()
        for key in keys:
            path = self.path(key)
            path.unlink(missing_ok=True)
            parents.add(path.parent)
        # Empty step directories go too, so a deleted checkpoint leaves nothing behind.
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            if parent != self.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()

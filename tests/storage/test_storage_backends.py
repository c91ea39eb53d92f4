"""Backend contract: identical behaviour on the local directory and on S3 over HTTP."""

from __future__ import annotations

import os

import pytest

from supervisor.errors import StorageError
from supervisor.storage import Backend, ObjectNotFound, iter_chunks


def test_put_get_roundtrip_and_replace(backend: Backend) -> None:
    backend.put_bytes("a/b/x.json", b"one")
    assert backend.get_bytes("a/b/x.json") == b"one"
    backend.put_bytes("a/b/x.json", b"two")
    assert backend.get_bytes("a/b/x.json") == b"two"


def test_missing_object_is_object_not_found(backend: Backend) -> None:
    with pytest.raises(ObjectNotFound):
        backend.get_bytes("nope")
    assert backend.stat("nope") is None
    with pytest.raises(ObjectNotFound), backend.open_read("nope"):
        pass


def test_open_write_commits_only_on_clean_exit(backend: Backend) -> None:
    with pytest.raises(RuntimeError), backend.open_write("d/half.bin") as f:
        f.write(b"x" * 1000)
        raise RuntimeError("writer died")
    assert backend.stat("d/half.bin") is None
    assert backend.list("d") == []
    with backend.open_write("d/whole.bin") as f:
        f.write(b"y" * 1000)
    info = backend.stat("d/whole.bin")
    assert info is not None and info.size == 1000


def test_list_is_recursive_relative_and_sorted(backend: Backend) -> None:
    for key in ("j/c/s2/b", "j/c/s1/a", "j/c/latest", "other/z"):
        backend.put_bytes(key, key.encode())
    assert [o.key for o in backend.list("j/c")] == ["j/c/latest", "j/c/s1/a", "j/c/s2/b"]
    assert [o.size for o in backend.list("j/c/s1")] == [len(b"j/c/s1/a")]
    assert backend.list("j/missing") == []


def test_delete_ignores_missing_keys(backend: Backend) -> None:
    backend.put_bytes("k/1", b"1")
    backend.put_bytes("k/2", b"2")
    backend.delete(["k/1", "k/never"])
    assert [o.key for o in backend.list("k")] == ["k/2"]


def test_large_file_streams_and_multipart(backend: Backend) -> None:
    data = os.urandom(12 << 20)  # above the 5 MiB multipart threshold of the S3 fixture
    with backend.open_write("big/blob") as f:
        f.write(data[: 7 << 20])
        f.write(data[7 << 20 :])
    with backend.open_read("big/blob") as r:
        chunks = [bytes(c) for c in iter_chunks(r, 1 << 20)]
    assert max(len(c) for c in chunks) <= 1 << 20
    assert b"".join(chunks) == data
    with backend.local_path("big/blob") as p:
        assert p.read_bytes() == data


def test_key_cannot_escape_local_root(tmp_path: os.PathLike[str]) -> None:
    from supervisor.storage import LocalBackend

    with pytest.raises(StorageError, match="escapes"):
        LocalBackend(tmp_path).get_bytes("../../etc/passwd")

"""S3 under faults, through a real HTTP proxy in front of the moto server: retried, or one clear StorageError."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor import logging as slog
from supervisor.errors import StorageError
from supervisor.storage import S3Backend, iter_chunks
from supervisor.storage.retry import RetrySettings
from tests.s3support import fast_s3_settings, free_port


def _backend(proxy: Any, uri: str, tmp_path: Path, **kw: Any) -> S3Backend:
    return S3Backend(f"{uri}/p", fast_s3_settings(proxy.url, spool_dir=str(tmp_path), **kw))


@pytest.mark.parametrize("fault", ["503", "500", "reset"])
def test_transient_faults_are_retried_until_committed(
    s3_fault_proxy: Any, s3_uri: str, tmp_path: Path, fault: str
) -> None:
    backend = _backend(s3_fault_proxy, s3_uri, tmp_path)
    s3_fault_proxy.inject([fault] * 3)  # attempts=4: the fourth gets through
    backend.put_bytes("x", b"payload")
    assert s3_fault_proxy.injected == 3
    assert backend.get_bytes("x") == b"payload"


def test_spent_attempts_raise_one_storage_error_and_commit_nothing(
    s3_fault_proxy: Any, s3_uri: str, tmp_path: Path
) -> None:
    backend = _backend(s3_fault_proxy, s3_uri, tmp_path)
    s3_fault_proxy.inject(["503"] * 4)
    with pytest.raises(StorageError, match=r"failed after 4 attempts: SlowDown \(HTTP 503\)"):
        backend.put_bytes("y", b"never")
    assert backend.stat("y") is None


def test_multipart_upload_survives_faults_mid_transfer(
    s3_fault_proxy: Any, s3_uri: str, tmp_path: Path
) -> None:
    # Six attempts for two faults: the pooled connection the proxy drops at inject() fails one
    # attempt of its own when the upload reuses it first, and under load a 5 MiB part can outlast
    # the tests' 5 s read timeout (make test once ended on the 503 as the fourth failure).
    retry = RetrySettings(attempts=6, initial_s=0.01, max_s=0.05, jitter_s=0.01)
    backend = _backend(s3_fault_proxy, s3_uri, tmp_path, max_concurrency=1, retry=retry, read_timeout_s=30.0)
    data = os.urandom(11 << 20)  # three 5 MiB parts
    backend.put_bytes("warm", b"")  # open a pooled connection, so the faults land mid-upload
    with backend.open_write("big") as f:
        f.write(data)
        s3_fault_proxy.inject(["reset", "503"])
    assert s3_fault_proxy.injected == 2
    with backend.local_path("big") as p:
        assert p.read_bytes() == data


def test_read_resumes_after_connection_cut_mid_body(s3_fault_proxy: Any, s3_uri: str, tmp_path: Path) -> None:
    backend = _backend(s3_fault_proxy, s3_uri, tmp_path)
    data = os.urandom(3 << 20)
    backend.put_bytes("blob", data)
    s3_fault_proxy.inject(["cut:1000000"])
    with backend.open_read("blob") as r:
        got = b"".join(bytes(c) for c in iter_chunks(r, 256 << 10))
    assert s3_fault_proxy.injected == 1
    assert got == data


def test_unreachable_endpoint_is_a_clear_storage_error(tmp_path: Path) -> None:
    settings = fast_s3_settings(
        f"http://127.0.0.1:{free_port()}", retry=RetrySettings(attempts=2, initial_s=0.01, jitter_s=0)
    )
    backend = S3Backend("s3://nobody-home/p", settings)
    with pytest.raises(StorageError, match="failed after 2 attempts: EndpointConnectionError"):
        backend.get_bytes("k")


def test_missing_bucket_is_not_retried(s3_endpoint: str, tmp_path: Path) -> None:
    backend = S3Backend("s3://no-such-bucket-here/p", fast_s3_settings(s3_endpoint))
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-here' does not exist"):
        backend.put_bytes("k", b"v")


def test_credentials_never_reach_logs_or_errors(
    s3_fault_proxy: Any,
    s3_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slog.configure("info")  # another test may have raised the level past warnings
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "sekrit-4f1c9e")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDLOGCHECK77")
    backend = _backend(s3_fault_proxy, s3_uri, tmp_path)
    s3_fault_proxy.inject(["503"] * 10)
    with capture_logs() as logs, pytest.raises(StorageError) as info:
        backend.put_bytes("z", b"v")
    text = repr(logs) + str(info.value)
    assert [e["attempt"] for e in logs if e["event"] == "retrying storage call"] == [1, 2, 3]
    assert "SlowDown" in text
    assert "sekrit-4f1c9e" not in text and "AKIDLOGCHECK77" not in text

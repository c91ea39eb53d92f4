"""Helpers for tests against the loopback S3 endpoint of the ``s3_endpoint`` fixture (tests/conftest.py)."""

from __future__ import annotations

import socket
import uuid
from typing import Any

from supervisor.storage import RetrySettings, S3Settings

FAST_RETRY = RetrySettings(attempts=4, initial_s=0.01, max_s=0.05, jitter_s=0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_bucket(endpoint: str, name: str | None = None) -> str:
    """Create a bucket on the test endpoint; returns ``s3://<name>``."""
    import boto3

    name = name or f"test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return f"s3://{name}"


def fast_s3_settings(endpoint: str, **overrides: Any) -> S3Settings:
    """Settings for tests: quick retries, a 5 MiB multipart threshold (S3's minimum part), short timeouts."""
    base: dict[str, Any] = {
        "endpoint_url": endpoint,
        "retry": FAST_RETRY,
        "multipart_threshold": 5 << 20,
        "multipart_chunksize": 5 << 20,
        "max_concurrency": 2,
        "read_timeout_s": 5.0,
        "connect_timeout_s": 2.0,
    }
    base.update(overrides)
    return S3Settings(**base)

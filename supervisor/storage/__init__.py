"""Storage backends: a local directory or an S3 bucket, behind one ``Backend`` protocol."""

from __future__ import annotations

from supervisor.storage.base import Backend, ObjectInfo, ObjectNotFound, iter_chunks, join_key
from supervisor.storage.local import LocalBackend
from supervisor.storage.retry import RetrySettings
from supervisor.storage.s3 import S3Backend, S3Settings


def open_backend(
    path: str,
    endpoint_url: str | None = None,
    region: str | None = None,
    *,
    settings: S3Settings | None = None,
) -> Backend:
    """``s3://bucket/prefix`` -> S3Backend; anything else -> LocalBackend on that directory."""
    if path.startswith("s3://"):
        base = settings or S3Settings()  # type: ignore[call-arg]
        overrides = {k: v for k, v in (("endpoint_url", endpoint_url), ("region", region)) if v is not None}
        return S3Backend(path, base.model_copy(update=overrides))
    return LocalBackend(path)


__all__ = [
    "Backend",
    "LocalBackend",
    "ObjectInfo",
    "ObjectNotFound",
    "RetrySettings",
    "S3Backend",
    "S3Settings",
    "iter_chunks",
    "join_key",
    "open_backend",
]

"""An S3 bucket + prefix through boto3 (AWS, or MinIO / Ceph via ``endpoint_url``).

Credentials come from boto3's standard chain (environment, shared config, instance role)
and are never passed through here or logged. Every call goes through ``call_with_retry``;
botocore's own retry loop is off so attempts are bounded in one place.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import boto3
from boto3.s3.transfer import TransferConfig
from botocore import exceptions as bex
from botocore.config import Config
from pydantic import BaseModel, ConfigDict, Field

from supervisor.errors import EXIT_BAD_INPUT, StorageError
from supervisor.storage.base import TEMP_MARKER, ObjectInfo, ObjectNotFound, join_key
from supervisor.storage.retry import RetrySettings, call_with_retry, describe, is_retryable

T = TypeVar("T")


class S3Settings(BaseModel):
    """Connection and transfer settings of one S3 location."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint_url: str | None = Field(None, description="S3-compatible endpoint (MinIO, Ceph); None = AWS.")
    region: str | None = Field(None, description="Region; None = from the standard boto3 chain.")
    retry: RetrySettings = Field(default_factory=RetrySettings)  # type: ignore[arg-type]
    multipart_threshold: int = Field(64 << 20, ge=5 << 20, description="Files above this go up in parts.")
    multipart_chunksize: int = Field(64 << 20, ge=5 << 20, description="Part size (S3 minimum: 5 MiB).")
    max_concurrency: int = Field(8, ge=1, description="Parallel part uploads / downloads.")
    connect_timeout_s: float = Field(10.0, gt=0)
    read_timeout_s: float = Field(60.0, gt=0)
    spool_dir: str | None = Field(
        None, description="Where writes are staged before upload (default: $TMPDIR)."
    )


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise StorageError("not an s3:// URI", source=uri)
    bucket, _, prefix = uri[len("s3://") :].partition("/")
    if not bucket:
        raise StorageError("missing bucket name", source=uri)
    return bucket, prefix.strip("/")


class S3Backend:
    def __init__(self, uri: str, settings: S3Settings | None = None) -> None:
        self.settings = settings or S3Settings()  # type: ignore[call-arg]
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        s = self.settings
        config = Config(
            retries={"mode": "standard", "total_max_attempts": 1},
            connect_timeout=s.connect_timeout_s,
            read_timeout=s.read_timeout_s,
            s3={"addressing_style": "path"} if s.endpoint_url else None,
        )
        try:
            session = boto3.session.Session(region_name=s.region)
            self.client: Any = session.client("s3", endpoint_url=s.endpoint_url, config=config)
        except (bex.BotoCoreError, ValueError) as exc:
            raise StorageError(f"cannot create an S3 client: {exc}", source=self.uri) from None
        self.transfer = TransferConfig(
            multipart_threshold=s.multipart_threshold,
            multipart_chunksize=s.multipart_chunksize,
            max_concurrency=s.max_concurrency,
        )

    # -- plumbing ---------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return join_key(self.prefix, key)

    def _call(self, what: str, fn: Callable[[], T], key: str | None = None) -> T:
        try:
            return call_with_retry(fn, settings=self.settings.retry, what=what, source=self.uri)
        except StorageError:
            raise
        except bex.NoCredentialsError:
            raise StorageError(
                "no AWS credentials found in the standard chain (environment, ~/.aws, instance role)",
                source=self.uri,
                exit_code=EXIT_BAD_INPUT,
            ) from None
        except bex.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                raise ObjectNotFound(f"no such object: {key}", source=self.uri) from None
            if code == "NoSuchBucket":
                raise StorageError(  # a bucket name a person gave: bad input, exit 2
                    f"bucket {self.bucket!r} does not exist", source=self.uri, exit_code=EXIT_BAD_INPUT
                ) from None
            raise StorageError(f"{what}: {describe(exc)}", source=self.uri) from None
        except (bex.BotoCoreError, OSError) as exc:
            cause = exc.__cause__
            if isinstance(cause, bex.ClientError):
                raise StorageError(f"{what}: {describe(cause)}", source=self.uri) from None
            raise StorageError(f"{what}: {describe(exc)}", source=self.uri) from None
        except Exception as exc:  # boto3's S3UploadFailedError and friends wrap the real error
            if isinstance(exc.__cause__, bex.ClientError) or is_retryable(exc):
                raise StorageError(f"{what}: {describe(exc)}", source=self.uri) from None
            raise

    # -- Backend ----------------------------------------------------------------------------------

    def _spool(self, label: str) -> Path:
        spool = Path(self.settings.spool_dir or tempfile.gettempdir())
        spool.mkdir(parents=True, exist_ok=True)
        return spool / f"{label}{TEMP_MARKER}{uuid.uuid4().hex}"

    def _upload(self, tmp: Path, key: str) -> None:
        # The object appears only when the upload (or the multipart completion) succeeds.
        self._call(
            f"upload {key}",
            lambda: self.client.upload_file(str(tmp), self.bucket, self._key(key), Config=self.transfer),
            key,
        )

    @contextmanager
    def open_write(self, key: str) -> Iterator[BinaryIO]:
        tmp = self._spool("spool")
        try:
            with open(tmp, "wb", buffering=0) as f:
                yield f
            self._upload(tmp, key)
        finally:
            tmp.unlink(missing_ok=True)

    def write_file(self, key: str, write: Callable[[BinaryIO], None], digest: Callable[[BinaryIO], T]) -> T:
        tmp = self._spool("spool")
        try:
            with open(tmp, "wb", buffering=0) as f:
                write(f)
            # Digest the spooled bytes while they go up: the upload reads the same file.
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="upload") as pool:
                uploaded = pool.submit(self._upload, tmp, key)
                with open(tmp, "rb", buffering=0) as reader:
                    result = digest(reader)
                uploaded.result()
            return result
        finally:
            tmp.unlink(missing_ok=True)

    def put_bytes(self, key: str, data: bytes) -> None:
        self._call(
            f"put {key}",
            lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data),
            key,
        )

    def get_bytes(self, key: str) -> bytes:
        def _get() -> bytes:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            with body:
                return bytes(body.read())

        return self._call(f"get {key}", _get, key)

    @contextmanager
    def open_read(self, key: str) -> Iterator[BinaryIO]:
        info = self.stat(key)
        if info is None:
            raise ObjectNotFound(f"no such object: {key}", source=self.uri)
        reader = _RangeReader(self, key, info.size)
        try:
            yield reader  # type: ignore[misc]
        finally:
            reader.close()

    @contextmanager
    def local_path(self, key: str) -> Iterator[Path]:
        tmp = self._spool("download")
        try:
            self._call(
                f"download {key}",
                lambda: self.client.download_file(
                    self.bucket, self._key(key), str(tmp), Config=self.transfer
                ),
                key,
            )
            yield tmp
        finally:
            tmp.unlink(missing_ok=True)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            head = self._call(
                f"head {key}", lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key)), key
            )
        except ObjectNotFound:
            return None
        return ObjectInfo(key, int(head["ContentLength"]), head["LastModified"].timestamp())

    def list(self, prefix: str) -> list[ObjectInfo]:
        full = self._key(prefix)
        full = full + "/" if full else ""

        def _list() -> list[ObjectInfo]:
            out = []
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            ):
                for obj in page.get("Contents", []):
                    rel = obj["Key"][len(self.prefix) + 1 :] if self.prefix else obj["Key"]
                    out.append(ObjectInfo(rel, int(obj["Size"]), obj["LastModified"].timestamp()))
            return sorted(out, key=lambda o: o.key)

        return self._call(f"list {prefix}", _list)

    def abort_stale_uploads(self, prefix: str, older_than: float) -> int:
        """Abort multipart uploads under ``prefix`` started before ``older_than`` (unix time).

        A writer killed mid-upload leaves its parts invisible but billed; retention calls this.
        """
        full = self._key(prefix)

        def _abort() -> int:
            count = 0
            for page in self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=full
            ):
                for up in page.get("Uploads", []):
                    if up["Initiated"].timestamp() <= older_than:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=up["Key"], UploadId=up["UploadId"]
                        )
                        count += 1
            return count

        return self._call(f"abort stale uploads {prefix}", _abort)

    def delete(self, keys: Iterable[str]) -> None:
        batch = [{"Key": self._key(k)} for k in keys]
        for i in range(0, len(batch), 1000):
            part = batch[i : i + 1000]
            self._call(
                "delete",
                lambda part=part: self.client.delete_objects(  # type: ignore[misc]
                    Bucket=self.bucket, Delete={"Objects": part, "Quiet": True}
                ),
            )


class _RangeReader(io.RawIOBase):
    """Streams one object; a connection dropped mid-body resumes with a ranged GET from where it stopped."""

    def __init__(self, backend: S3Backend, key: str, size: int) -> None:
        self.backend, self.key, self.size = backend, key, size
        self.pos = 0
        self.body: Any = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.pos >= self.size:
            return 0
        view = memoryview(buffer).cast("B")

        def _read() -> int:
            try:
                if self.body is None:
                    resp = self.backend.client.get_object(
                        Bucket=self.backend.bucket,
                        Key=self.backend._key(self.key),
                        Range=f"bytes={self.pos}-",
                    )
                    self.body = resp["Body"]
                n = int(self.body.readinto(view))
            except Exception:
                self._drop()
                raise
            if n == 0:  # the server ended the body early: reopen from pos
                self._drop()
                raise bex.ResponseStreamingError(error=f"body ended at {self.pos} of {self.size}")
            return n

        n = self.backend._call(f"read {self.key}", _read, self.key)
        self.pos += n
        return n

    def _drop(self) -> None:
        if self.body is not None:
            with contextlib.suppress(Exception):  # closing a broken stream must not mask the read error
                self.body.close()
            self.body = None

    def close(self) -> None:
        self._drop()
        super().close()

"""A checkpoint writer that stops at a named point, says so through a file, and waits to be SIGKILLed.

usage: kill_writer.py STORAGE ENDPOINT|- STOP_AT READY_FILE
STOP_AT: during_shard | during_upload | before_manifest | during_manifest | after_manifest
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from supervisor.checkpoint import CheckpointStore
from supervisor.storage import open_backend
from tests.s3support import fast_s3_settings

SIZE = 12 << 20  # above the test multipart threshold: an S3 upload goes up in parts


def _signal(ready: Path, text: str) -> None:
    """Write ``ready`` whole or not at all: the test polls for the file and reads it at once."""
    part = ready.with_name(ready.name + ".part")
    part.write_text(text)
    os.replace(part, ready)


def _stop(ready: Path) -> None:
    _signal(ready, str(os.getpid()))
    threading.Event().wait()  # until SIGKILL


def main(storage: str, endpoint: str, stop_at: str, ready: Path) -> None:
    settings = fast_s3_settings(endpoint) if endpoint != "-" else None
    backend: Any = open_backend(storage, settings=settings)
    store = CheckpointStore(backend, "job1")

    put_bytes = backend.put_bytes

    def hooked_put(key: str, data: bytes) -> None:
        if stop_at == "before_manifest" and key.endswith("MANIFEST.json"):
            _stop(ready)
        if stop_at == "after_manifest" and key.endswith("/latest"):
            _stop(ready)
        put_bytes(key, data)

    backend.put_bytes = hooked_put
    if stop_at == "during_manifest":  # local: the temp manifest is written, the rename not yet done
        real_replace = os.replace

        def hooked_replace(src: Any, dst: Any) -> None:
            if str(dst).endswith("MANIFEST.json"):
                _stop(ready)
            real_replace(src, dst)

        os.replace = hooked_replace  # type: ignore[assignment]
    if stop_at == "during_upload":  # S3: some parts of a multipart upload are up, the rest not
        upload = backend.client.upload_file

        def hooked_upload(*args: Any, **kw: Any) -> Any:
            seen = [0]

            def progress(n: int) -> None:
                seen[0] += n
                if seen[0] >= 5 << 20:
                    _stop(ready)

            return upload(*args, Callback=progress, **kw)

        backend.client.upload_file = hooked_upload

    def shard(f: Any) -> None:
        f.write(os.urandom(SIZE // 2))
        if stop_at == "during_shard":
            _stop(ready)
        f.write(os.urandom(SIZE // 2))

    files = [store.write_file(200, "model", shard, components=["model"])]
    files.append(
        store.write_file(
            200, "optimizer.rank0", lambda f: f.write(b"o" * 1000), rank=0, components=["optimizer"]
        )
    )
    store.commit(200, world_size=1, files=files)
    _signal(ready, "finished without stopping")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]))

"""Per-rank output of a training process, kept in the job's storage with a bound.

``<job>/logs/gen<G>/rank<R>.log`` holds the newest output (stdout and stderr interleaved, like
``torchrun --tee``); at ``segment_bytes`` it becomes ``rank<R>.log.1`` (replacing the one before),
so a rank keeps at most two segments. The live segment is uploaded every ``upload_interval_s``
while it changes and once more at exit (an atomic file replace, or one S3 PUT), so ``supervisor
logs --follow`` sees output within seconds on any backend.
"""

from __future__ import annotations

import threading
from typing import IO, Any

from supervisor.errors import SupervisorError
from supervisor.logging import get_logger
from supervisor.storage.base import join_key

log = get_logger("supervisor.ranks.process_logs")

SEGMENT_BYTES = 4 << 20
TAIL_BYTES = 4000


def log_key(job: str, generation: int, rank: int, old: bool = False) -> str:
    return join_key(job, "logs", f"gen{generation}", f"rank{rank}.log" + (".1" if old else ""))


class LogKeeper:
    def __init__(
        self,
        backend: Any,
        job: str,
        generation: int,
        rank: int,
        *,
        segment_bytes: int = SEGMENT_BYTES,
        upload_interval_s: float = 2.0,
    ) -> None:
        self.backend, self.job, self.generation, self.rank = backend, job, generation, rank
        self.segment_bytes = segment_bytes
        self.upload_interval_s = upload_interval_s
        self._buf = bytearray()
        self._dirty = True  # a rank that printed nothing still gets its (empty) log
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._uploader = threading.Thread(target=self._upload_loop, name=f"logs-{rank}", daemon=True)

    def follow(self, stream: IO[bytes]) -> threading.Thread:
        """The thread reading ``stream`` (join it after the process exits)."""
        reader = threading.Thread(
            target=self._read, args=(stream,), name=f"logs-read-{self.rank}", daemon=True
        )
        reader.start()
        self._uploader.start()
        return reader

    def tail(self, n: int = TAIL_BYTES) -> str:
        with self._lock:
            return bytes(self._buf[-n:]).decode("utf-8", "replace")

    def _read(self, stream: IO[bytes]) -> None:
        try:
            for line in iter(stream.readline, b""):
                with self._lock:
                    if len(self._buf) + len(line) > self.segment_bytes and self._buf:
                        self._rotate()
                    self._buf += line[: self.segment_bytes]
                    self._dirty = True
        finally:
            self._done.set()

    def _rotate(self) -> None:  # holds the lock
        self._put(log_key(self.job, self.generation, self.rank, old=True), bytes(self._buf))
        self._buf = bytearray()

    def _upload_loop(self) -> None:
        while not self._done.wait(self.upload_interval_s):
            self.upload()
        self.upload()

    def upload(self) -> None:
        with self._lock:
            if not self._dirty:
                return
            data, self._dirty = bytes(self._buf), False
        self._put(log_key(self.job, self.generation, self.rank), data)

    def close(self, timeout_s: float = 10.0) -> None:
        """Wait for the last upload (the process has exited and its output is drained)."""
        self._done.set()
        if self._uploader.is_alive():
            self._uploader.join(timeout_s)
        self.upload()

    def _put(self, key: str, data: bytes) -> None:
        try:
            self.backend.put_bytes(key, data)
        except (SupervisorError, OSError) as exc:  # storage trouble must never stop training
            log.warning("log_upload_failed", key=key, error=repr(exc))


def read_segments(backend: Any, job: str, generation: int, rank: int) -> tuple[bytes, bytes]:
    """The rank's kept output: (older segment, live segment); empty bytes where there is none."""
    from supervisor.storage.base import ObjectNotFound

    out = []
    for old in (True, False):
        try:
            out.append(backend.get_bytes(log_key(job, generation, rank, old=old)))
        except ObjectNotFound:
            out.append(b"")
    return out[0], out[1]


def generations(backend: Any, job: str) -> dict[int, list[int]]:
    """generation -> ranks with kept output."""
    found: dict[int, set[int]] = {}
    for info in backend.list(join_key(job, "logs")):
        parts = info.key.split("/")
        if len(parts) < 2 or not parts[-2].startswith("gen") or not parts[-1].startswith("rank"):
            continue
        gen, name = parts[-2][3:], parts[-1][4:].split(".")[0]
        if gen.isdigit() and name.isdigit():
            found.setdefault(int(gen), set()).add(int(name))
    return {g: sorted(r) for g, r in sorted(found.items())}

"""The alternatives behind the checkpoint I/O design, timed side by side (run via checkpoint_io.py --ablations).

Each group is timed interleaved and reported as a ratio to its first row.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from supervisor.checkpoint.hashing import hash_path, hash_reader, new_hasher
from supervisor.checkpoint.torch_io import one_thread, save_file

MIB = 1 << 20


class _InlineHash:
    """The rejected save path: hash each buffer on its way to the file (before the fsync)."""

    def __init__(self, raw: Any, algorithm: str) -> None:
        self.raw, self.hasher = raw, new_hasher(algorithm)

    def write(self, data: Any) -> int:
        self.hasher.update(data)
        return int(self.raw.write(data))

    def flush(self) -> None:
        pass


def _group(title: str, cases: dict[str, Callable[[int], object]], repeat: int) -> None:
    times: dict[str, list[float]] = {k: [] for k in cases}
    for i in range(repeat):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn(i)
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = next(iter(med.values()))
    print(f"  {title}")
    for name, t in med.items():
        print(f"    {name:42s} {t:6.3f} s  {t / base:5.2f}x")


def ablations(work: Path, algorithm: str, repeat: int, mib: int = 256) -> None:
    rows = mib * MIB // (4 * 4 * 4096)  # 4 float32 tensors of ``rows`` x 4096: 256 MiB by default
    sd = {f"w{i}": torch.randn(rows, 4096) for i in range(4)}
    views = [memoryview(t.numpy()).cast("B") for t in sd.values()]
    print(f"ablations on a {mib} MiB state dict, {algorithm}, median of {repeat}")

    def fresh(tag: str, i: int) -> Path:
        return work / f"abl-{tag}-{i}.bin"

    def raw(i: int) -> None:
        with open(fresh("raw", i), "wb", buffering=0) as f:
            for v in views:
                f.write(v)
            os.fsync(f.fileno())

    def save_crc(i: int) -> None:
        with open(fresh("crc", i), "wb", buffering=0) as f:
            torch.save(sd, f)  # torch's own per-record CRC32 on (its default)
            os.fsync(f.fileno())

    def save_inline(i: int) -> None:
        with open(fresh("inline", i), "wb", buffering=0) as f:
            save_file(sd, _InlineHash(f, algorithm))  # type: ignore[arg-type]
            os.fsync(f.fileno())

    def save_behind(i: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        path = fresh("behind", i)
        with open(path, "wb", buffering=0) as f, ThreadPoolExecutor(1) as pool:
            save_file(sd, f)
            synced = pool.submit(os.fsync, f.fileno())
            with open(path, "rb", buffering=0) as r:
                hash_reader(r, algorithm)
            synced.result()

    _group(
        "save: where the checksum goes",
        {
            "raw write+fsync": raw,
            "torch.save, torch CRC32 on (default)": save_crc,
            "torch.save, hash inline before fsync": save_inline,
            "torch.save, hash behind fsync (chosen)": save_behind,
        },
        repeat,
    )

    target = fresh("behind", 0)

    def read(chunk: int) -> Callable[[int], object]:
        def fn(_: int) -> None:
            buf = memoryview(bytearray(chunk))
            with open(target, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

        return fn

    def read_hash(chunk: int) -> Callable[[int], object]:
        def fn(_: int) -> None:
            with open(target, "rb", buffering=0) as f:
                hash_reader(f, algorithm, chunk)

        return fn

    _group(
        "verify: how a file is streamed through the hash",
        {
            "raw read, 8 MiB buffer": read(8 * MIB),
            "read + hash, 8 MiB chunks": read_hash(8 * MIB),
            "read + hash, 1 MiB chunks (S3 / other)": read_hash(MIB),
            "mmap window + hash, 1 MiB (local, chosen)": lambda _: hash_path(target, algorithm),
        },
        repeat,
    )

    dest = {k: torch.zeros_like(v) for k, v in sd.items()}

    def copy_in(i: int) -> None:
        for k, v in torch.load(fresh("behind", i), mmap=True, weights_only=True).items():
            dest[k].copy_(v)

    def copy_in_one_thread(i: int) -> None:
        with one_thread():
            copy_in(i)

    _group(
        "restore: copying from the mmap into live tensors",
        {
            f"mmap + copy_, {torch.get_num_threads()} threads": copy_in,
            "mmap + copy_, 1 thread (chosen)": copy_in_one_thread,
        },
        repeat,
    )

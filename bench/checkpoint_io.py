"""Checkpoint I/O vs raw file I/O of the same bytes, in one run (timings are ratios, not absolutes).

    .venv/bin/python bench/checkpoint_io.py [--gib 1.0] [--repeat 3] [--dir /tmp] [--checksum crc32]

Measures, for a model + AdamW state of about --gib GiB:
  raw write+fsync  the state's bytes written to one file, fsync'd
  raw read         that file read back (warm) into a page-aligned 8 MiB buffer, and into one
                   state-sized buffer (what any restore must at least do: write every byte to RAM)
  save             save_training_state (torch.save per file, hashed on the way out, fsync, rename)
  verify           verify() (stream every file through the checksum)
  restore          load_training_state into the existing model and optimizer
and the candidate checksums' throughput on the same bytes in memory. Targets (issue 5):
save <= 1.2x raw write+fsync; verify >= 0.8x raw read speed; restore <= 1.5x raw read.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from supervisor import logging as slog
from supervisor.checkpoint import CheckpointStore, StoreSettings, verify
from supervisor.checkpoint.hashing import ALGORITHMS, available, default_algorithm, new_hasher
from supervisor.checkpoint.training_state import load_training_state, save_training_state
from supervisor.storage import LocalBackend
from supervisor.storage.base import aligned_buffer

CHUNK = 8 << 20


def build(gib: float) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Linear 4096x4096 layers; AdamW after one step holds 2 moments per parameter (3x the model)."""
    layers = max(1, round(gib * (1 << 30) / (3 * 4 * 4096 * 4096)))
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096, bias=False) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[memoryview]:
    tensors = list(model.parameters()) + [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
    return [memoryview(t.detach().numpy()).cast("B") for t in tensors]


def raw_write(path: Path, views: list[memoryview]) -> None:
    with open(path, "wb", buffering=0) as f:
        for v in views:
            f.write(v)
        os.fsync(f.fileno())


def raw_read(path: Path) -> int:
    view = memoryview(aligned_buffer(CHUNK))
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            total += n
    return total


def raw_read_into(path: Path, dest: torch.Tensor) -> None:
    view = memoryview(dest.numpy()).cast("B")
    offset = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view[offset : offset + (64 << 20)]):
            offset += n


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def hash_speeds(views: list[memoryview], nbytes: int) -> dict[str, float]:
    out = {}
    for name in ALGORITHMS:
        if not available(name):
            continue
        h = new_hasher(name)
        start = time.perf_counter()
        for v in views:
            for i in range(0, len(v), CHUNK):
                h.update(v[i : i + CHUNK])
        out[name] = nbytes / (time.perf_counter() - start) / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", default=None, help="Where to write (default: a temp dir).")
    ap.add_argument("--checksum", default=default_algorithm(), choices=list(ALGORITHMS))
    ap.add_argument(
        "--ablations", action="store_true", help="Also time the design alternatives (bench/README.md)."
    )
    args = ap.parse_args()
    slog.configure("error")
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    try:
        run(work, args.gib, args.repeat, args.checksum)
        if args.ablations:
            from checkpoint_io_ablations import ablations  # type: ignore[import-not-found]

            ablations(work, args.checksum, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(work: Path, gib: float, repeat: int, checksum: str) -> None:
    model, opt = build(gib)
    views = state_bytes(model, opt)
    nbytes = sum(len(v) for v in views)
    store = CheckpointStore(LocalBackend(work / "storage"), "bench", StoreSettings(checksum=checksum))
    t: dict[str, list[float]] = {k: [] for k in ("write", "read", "read_full", "save", "verify", "restore")}
    full = torch.empty(nbytes, dtype=torch.uint8)
    full.fill_(0)  # touched, like live parameters
    # Interleaved, so drift in machine load hits every column alike. Nothing is deleted until
    # the end: on a filesystem mounted with `discard`, deletions slow down the next fsyncs.
    for step in range(repeat):
        raw = work / f"raw{step}.bin"
        t["write"].append(timed(lambda raw=raw: raw_write(raw, views)))
        raw_read(raw)  # warm, like the checkpoint files right after their save
        t["read"].append(timed(lambda raw=raw: raw_read(raw)))
        t["read_full"].append(timed(lambda raw=raw: raw_read_into(raw, full)))
        t["save"].append(
            timed(
                lambda s=step: save_training_state(store, s, rank=0, world_size=1, model=model, optimizer=opt)
            )
        )
        verify(store, step, record=False)  # warm
        t["verify"].append(timed(lambda s=step: verify(store, s, record=False)))
        t["restore"].append(
            timed(
                lambda s=step: load_training_state(store, s, rank=0, world_size=1, model=model, optimizer=opt)
            )
        )
    med = {k: statistics.median(v) for k, v in t.items()}
    gb = nbytes / 1e9
    print(f"state {nbytes / 2**30:.2f} GiB, checksum {checksum}, median of {repeat}")
    print(f"  raw write+fsync  {med['write']:6.2f} s  {gb / med['write']:6.2f} GB/s")
    print(
        f"  raw read (warm)  {med['read']:6.2f} s  {gb / med['read']:6.2f} GB/s  into one 8 MiB page-aligned buffer"
    )
    print(
        f"  raw read (warm)  {med['read_full']:6.2f} s  {gb / med['read_full']:6.2f} GB/s  into a state-sized buffer"
    )
    print(
        f"  save             {med['save']:6.2f} s  {med['save'] / med['write']:5.2f}x raw write+fsync  (target <= 1.2)"
    )
    print(
        f"  verify           {med['verify']:6.2f} s  {med['read'] / med['verify']:5.2f}x raw read speed  (target >= 0.8)"
    )
    print(
        f"  restore          {med['restore']:6.2f} s  {med['restore'] / med['read']:5.2f}x raw read time   (target <= 1.5)"
        f"; {med['restore'] / med['read_full']:.2f}x the state-sized read"
    )
    speeds = hash_speeds(views, nbytes)
    print(
        "  checksums in memory (GB/s; raw read above for scale): "
        + ", ".join(f"{k} {v:.1f}" for k, v in speeds.items())
    )


if __name__ == "__main__":
    main()

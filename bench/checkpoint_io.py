"""Checkpoint I/O vs raw file I/O of the same bytes, in one run (timings are ratios, not absolutes).

    .venv/bin/python bench/checkpoint_io.py [--gib 1.0 | --params 1e9] [--device cpu|cuda]
                                            [--repeat 3] [--restores 4] [--dir /tmp] [--checksum crc32]
                                            [--ablations]
    .venv/bin/python bench/checkpoint_io.py --smoke   # seconds: 10 MiB of state, once, ablations on 16 MiB

Measures, for a model + AdamW state of about --gib GiB (or a model of --params parameters,
whose state is 3x that: the weights and AdamW's two moments), interleaved in one run:
  raw write+fsync  the state's bytes (from host memory) written to one file, fsync'd
  raw read         that file read back (warm) into a page-aligned 8 MiB buffer, and into one
                   state-sized buffer (what any restore must at least do: write every byte to RAM)
  save torch       save_training_state(engine="torch"): torch.save per file, hashed, fsync, rename
  save dcp         save_training_state (DCP, synchronous): dcp.save + the commit protocol
  train step       one training step (forward, backward, AdamW step) with nothing in flight
  async blocked    Checkpointer.save(blocking=False), then one training step: the time of the call
                   plus what that step's optimizer step waited for the staging copy. The call
                   copies the buffers and starts the background copy of parameters and optimizer
                   state to host memory (CUDA: device -> pinned host), which overlaps the step's
                   forward and backward. Write, fsync, checksum and commit run in the background
  next step        that training step's time: on a CPU-only box it shares the cores with the
                   background copy and write, so it runs slower than a step alone (on a GPU the
                   step runs on the device while the host writes)
  staging (sync)   the same host copy done before returning (the previous design's blocked time)
  async total      from the call until the manifest is committed
  verify           verify() of the DCP checkpoint (stream every file through the checksum)
  restore torch    load_training_state of the torch.save checkpoint into the live model
  raw read ckpt    the DCP checkpoint's own files read raw into the state-sized buffer, right
                   before its restore (the same files, the same page-cache state: the fair
                   baseline of a restore, which must write every byte into the live tensors)
  restore dcp      load_training_state of the DCP checkpoint (dcp.load + set_state_dict and the
                   shard self-check, hashed as the load writes each tensor)
  restore, rehash  the same with the self-check hashing the restored model after the load (the
                   previous design), and the load alone (no self-check), in the same repeat
and the candidate checksums' throughput on the same bytes in memory. Targets: save <= 1.2x
raw write+fsync; async blocked <= 0.15x the synchronous save; verify >= 0.8x raw read speed;
restore <= 1.5x raw read (of the checkpoint's own files into a state-sized buffer). With --device cuda the model and optimizer live on the GPU.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from supervisor import logging as slog
from supervisor.checkpoint import CheckpointStore, StoreSettings, dcp_state, verify
from supervisor.checkpoint.dcp_state import HostStager, live_state
from supervisor.checkpoint.hashing import ALGORITHMS, available, default_algorithm, new_hasher
from supervisor.checkpoint.saver import Checkpointer
from supervisor.checkpoint.training_state import load_training_state, save_training_state
from supervisor.storage import LocalBackend
from supervisor.storage.base import aligned_buffer

CHUNK = 8 << 20


def build(
    gib: float, params: float | None, device: str, width: int = 4096
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Linear ``width`` x ``width`` layers (4096; the smoke run 512); AdamW after one step holds
    2 moments per parameter (3x the model)."""
    per_layer = width * width
    layers = (
        max(1, round(params / per_layer)) if params else max(1, round(gib * (1 << 30) / (3 * 4 * per_layer)))
    )
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]).to(
        device
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def state_bytes(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[memoryview]:
    """The state's bytes in host memory (a host copy of GPU tensors, made once, untimed)."""
    tensors = list(model.parameters()) + [t for s in opt.state.values() for t in s.values() if t.dim() > 0]
    return [memoryview(t.detach().cpu().numpy()).cast("B") for t in tensors]


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
    assert path.stat().st_size <= len(view), f"{path} does not fit the buffer"
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
    ap.add_argument("--gib", type=float, default=1.0, help="State size (weights + AdamW moments).")
    ap.add_argument("--params", type=float, default=None, help="Model parameters instead (e.g. 1e9).")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--restores", type=int, default=1,
        help="raw read + the three restores, this many times per repeat (their spread is the widest)",
    )  # fmt: skip
    ap.add_argument(
        "--batch", type=int, default=16, help="Rows per training step (the step async saves overlap)."
    )
    ap.add_argument("--dir", default=None, help="Where to write (default: a temp dir).")
    ap.add_argument("--checksum", default=default_algorithm(), choices=list(ALGORITHMS))
    ap.add_argument(
        "--ablations", action="store_true", help="Also time the design alternatives (bench/README.md)."
    )
    ap.add_argument("--smoke", action="store_true", help="seconds: 10 MiB of state, once, tiny ablations")
    ap.set_defaults(width=4096)
    args = ap.parse_args()
    if args.smoke:
        args.gib, args.params, args.repeat, args.batch, args.ablations = 0.01, None, 1, 2, True
        args.width = 512
    if args.device == "cuda" and not torch.cuda.is_available():
        cuda = torch.version.cuda or "none (a CPU build)"
        print(f"checkpoint_io.py: --device cuda: torch {torch.__version__} (CUDA {cuda}) sees no CUDA device here",
              file=sys.stderr)  # fmt: skip
        raise SystemExit(2)
    slog.configure("error")
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    try:
        run(work, args.gib, args.params, args.device, args.repeat, args.checksum, args.batch, args.width,
            args.restores)  # fmt: skip
        if args.ablations:
            from checkpoint_io_ablations import ablations  # type: ignore[import-not-found]

            ablations(work, args.checksum, args.repeat, mib=16 if args.smoke else 256)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def train_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, batch: int, sync: Callable[[], object]
) -> None:
    first = next(model.parameters())
    x = torch.randn(batch, first.shape[1], device=first.device)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()


def run(
    work: Path,
    gib: float,
    params: float | None,
    device: str,
    repeat: int,
    checksum: str,
    batch: int,
    width: int = 4096,
    restores_each: int = 1,
) -> None:
    model, opt = build(gib, params, device, width)
    views = state_bytes(model, opt)
    nbytes = sum(len(v) for v in views)
    store = CheckpointStore(LocalBackend(work / "storage"), "bench", StoreSettings(checksum=checksum))
    saver = Checkpointer(store, rank=0, world_size=1)
    keys = ("write", "read", "read_full", "save_torch", "save_dcp", "step", "call", "step_after", "blocked",
            "waited", "staging_sync", "async_total", "verify", "restore_torch", "read_ckpt", "restore_dcp",
            "restore_rehash", "restore_load")  # fmt: skip
    t: dict[str, list[float]] = {k: [] for k in keys}
    full = torch.empty(nbytes + (16 << 20), dtype=torch.uint8)  # + room for the DCP files' headers
    full.fill_(0)  # touched, like live parameters
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    stager = HostStager()
    train = lambda: train_step(model, opt, batch, sync)  # noqa: E731
    train()  # warm
    state: dict[str, Any] = {"rank": 0, "world_size": 1, "model": model, "optimizer": opt}
    # Interleaved, so drift in machine load hits every column alike. Nothing is deleted until
    # the end (on a filesystem mounted with `discard`, deletions slow down the next fsyncs),
    # unless the disk cannot hold every repeat's 4 copies of the state (a 1e9-parameter state
    # is 12 GB): then each repeat's files go after it, outside the timed sections.
    tidy = 4 * nbytes * repeat > 0.8 * shutil.disk_usage(work).free
    if tidy:
        print("note: files deleted after each repeat (not enough disk to keep them all)")
    for i in range(repeat):
        raw = work / f"raw{i}.bin"
        t["write"].append(timed(lambda raw=raw: raw_write(raw, views)))
        raw_read(raw)  # warm, like the checkpoint files right after their save
        t["read"].append(timed(lambda raw=raw: raw_read(raw)))
        t["read_full"].append(timed(lambda raw=raw: raw_read_into(raw, full)))
        torch_step, dcp_step, async_step = 3 * i, 3 * i + 1, 3 * i + 2
        t["save_torch"].append(
            timed(lambda s=torch_step: save_training_state(store, s, engine="torch", **state))
        )
        t["save_dcp"].append(timed(lambda s=dcp_step: save_training_state(store, s, **state)))
        t["staging_sync"].append(timed(lambda: (stager.stage(live_state(model, opt)), sync())))
        t["step"].append(timed(train))
        start = time.perf_counter()
        handle = saver.save(async_step, model=model, optimizer=opt, blocking=False)
        t["call"].append(time.perf_counter() - start)
        t["step_after"].append(timed(train))
        t["waited"].append(handle.staged_wait_s)
        t["blocked"].append(t["call"][-1] + t["waited"][-1])
        handle.result()
        t["async_total"].append(time.perf_counter() - start)
        saver.poll()
        verify(store, dcp_step, record=False)  # warm
        t["verify"].append(timed(lambda s=dcp_step: verify(store, s, record=False)))
        t["restore_torch"].append(
            timed(lambda s=torch_step: (load_training_state(store, s, **state), sync()))
        )
        files = ckpt_files(store, dcp_step)
        restores: list[tuple[str, Callable[[], object]]] = [
            ("restore_dcp", lambda s=dcp_step: (load_training_state(store, s, **state), sync())),
            ("restore_rehash", lambda s=dcp_step: (restore_rehashed(store, s, state), sync())),
            (
                "restore_load",
                lambda s=dcp_step: (dcp_state.load(store, store.manifest(s), model, opt), sync()),
            ),
        ]
        for r in range(i * restores_each, (i + 1) * restores_each):  # each: a raw read, then the 3 restores
            t["read_ckpt"].append(timed(lambda files=files: [raw_read_into(f, full) for f in files]))
            for key, fn in restores[r % 3 :] + restores[: r % 3]:  # in an order that rotates
                t[key].append(timed(fn))
        if tidy:
            raw.unlink()
            for step in (torch_step, dcp_step, async_step):
                store.delete_step(step, store.step_dirs().get(step, []))
    saver.close()
    stager.close()
    report(t, nbytes, checksum, repeat, device, views, batch)


def ckpt_files(store: CheckpointStore, step: int) -> list[Path]:
    """The local paths of a DCP checkpoint's files (``.metadata`` and the ranks' ``.distcp``)."""
    manifest = store.manifest(step)
    prefix = dcp_state.dcp_dir(manifest) + "/"
    backend = store.backend
    assert isinstance(backend, LocalBackend)
    return [backend.path(store.key(step, e.name)) for e in manifest.files if e.name.startswith(prefix)]


def restore_rehashed(store: CheckpointStore, step: int, state: dict[str, Any]) -> None:
    """load_training_state with the self-check hashing the live model after the load (the design
    before the check was folded into the load's copy)."""
    real = dcp_state.load
    dcp_state.load = lambda *a, **k: real(*a, **{**k, "shard_hash": False})  # type: ignore[assignment]
    try:
        load_training_state(store, step, **state)
    finally:
        dcp_state.load = real  # type: ignore[assignment]


def spread(num: list[float], den: list[float]) -> str:
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    return f"{min(ratios):.3f}-{max(ratios):.3f} ({', '.join(f'{r:.3f}' for r in ratios)})"


def report(
    t: dict[str, list[float]],
    nbytes: int,
    checksum: str,
    repeat: int,
    device: str,
    views: list[memoryview],
    batch: int,
) -> None:
    med = {k: statistics.median(v) for k, v in t.items()}
    gb = nbytes / 1e9
    print(f"state {nbytes / 2**30:.2f} GiB on {device}, checksum {checksum}, median of {repeat}")
    rows = [
        ("raw write+fsync", med["write"], f"{gb / med['write']:6.2f} GB/s"),
        ("raw read (warm)", med["read"], f"{gb / med['read']:6.2f} GB/s  into one 8 MiB page-aligned buffer"),
        ("raw read (warm)", med["read_full"], f"{gb / med['read_full']:6.2f} GB/s  into a state-sized buffer"),
        ("save torch", med["save_torch"], f"{med['save_torch'] / med['write']:5.2f}x raw write+fsync"),
        ("save dcp (sync)", med["save_dcp"], f"{med['save_dcp'] / med['write']:5.2f}x raw write+fsync  (target <= 1.2); "
         f"{med['save_dcp'] / med['save_torch']:.2f}x save torch"),
        ("train step", med["step"], f"batch {batch}: forward, backward, AdamW step, nothing in flight"),
        ("async: the call", med["call"], "capture, copy of the buffers, background copy started"),
        ("async: next step", med["step_after"], f"{med['step_after'] / med['step']:5.2f}x a step alone; "
         f"its optimizer step waited {med['waited']:.3f} s for the copy"),
        ("async: blocked", med["blocked"], f"{med['blocked'] / med['save_dcp']:5.3f}x the sync dcp save  (target <= 0.15); "
         f"per repeat {spread(t['blocked'], t['save_dcp'])}"),
        ("staging (sync)", med["staging_sync"], f"{med['staging_sync'] / med['save_dcp']:5.3f}x the sync dcp save  "
         "(host copy before returning: the previous design's blocked time)"),
        ("async: total", med["async_total"], f"{med['async_total'] / med['save_dcp']:5.2f}x the sync dcp save"),
        ("verify (dcp)", med["verify"], f"{med['read'] / med['verify']:5.2f}x raw read speed  (target >= 0.8)"),
        ("restore torch", med["restore_torch"], f"{med['restore_torch'] / med['read']:5.2f}x raw read time"),
        ("raw read ckpt", med["read_ckpt"], f"{gb / med['read_ckpt']:6.2f} GB/s  the DCP files, into a state-sized "
         "buffer, just before their restore"),
        ("restore dcp", med["restore_dcp"], f"{med['restore_dcp'] / med['read_ckpt']:5.2f}x raw read of its files  "
         f"(target <= 1.5); {med['restore_dcp'] / med['read']:.2f}x the 8 MiB-buffer read; "
         f"{med['restore_dcp'] / med['restore_torch']:.2f}x restore torch; per repeat "
         f"{spread(t['restore_dcp'], t['read_ckpt'])}"),
        ("restore, rehash", med["restore_rehash"], f"{med['restore_rehash'] / med['read_ckpt']:5.2f}x raw read of its "
         "files  (self-check hashing the model again after the load)"),
        ("restore, no check", med["restore_load"], f"{med['restore_load'] / med['read_ckpt']:5.2f}x raw read of its "
         "files  (dcp.load + set_state_dict alone)"),
    ]  # fmt: skip
    for name, secs, note in rows:
        print(f"  {name:<17}{secs:7.3f} s  {note}")
    speeds = hash_speeds(views, nbytes)
    print(
        "  checksums in memory (GB/s; raw read above for scale): "
        + ", ".join(f"{k} {v:.1f}" for k, v in speeds.items())
    )


if __name__ == "__main__":
    main()

"""SupervisedLoader vs a plain torch DataLoader: start-up and per-batch time, side by side.

Index spaces of 10^6 and 10^9 samples, 0 and 10^5 excluded sample IDs, 0 and 2 worker
processes. The dataset maps index ``i`` to a real-sized sample: ``--seq`` int64 tokens read
from a token file on disk (``np.memmap``, offset ``i * seq mod file size``), so the index
space can be any size while the bytes are real.

* **start-up**: constructing the loader and getting its first batch (fresh objects each time;
  with workers this includes starting them, for both). Exclusions are loaded the way a
  restore loads them (``load_state_dict``). The plain baseline shuffles with ``RandomSampler``,
  i.e. ``torch.randperm(n)``; at 10^9 that is an 8 GB table and is not run.
* **per batch**: mean time per batch over blocks of ``--block`` batches after warm-up; plain
  and supervised blocks alternate so machine noise hits both alike. Overhead = the median over
  ``--rounds`` of (supervised block / the plain block just before it) - 1, once per ``--repeat``
  (fresh loaders each time): the table gives the median over repeats and their range. Beside
  wall time, the training process's CPU time per batch (``time.process_time``): what the
  supervised loader adds there (single-process: order, exclusions, IDs; with workers: one small
  bytes object of IDs and cursor unpickled beside each batch) is steadier than wall time on a busy machine. The
  plain baseline at 10^9 iterates sequentially (no table), cheaper than any shuffle: its workers
  read the token file in order (~124 us CPU per batch of 8 x 2048 tokens against ~168 us for
  random reads, measured in process). ``--big-plain replacement`` shuffles it instead with
  ``RandomSampler(replacement=True)`` (``randint`` in chunks, no table): random reads like the
  supervised loader's.

    python bench/loader.py                      # the full table (~10 minutes on 2 busy cores)
    python bench/loader.py --quick              # 10^6 only, fewer rounds
    python bench/loader.py --quick --workers 0 --block 10 --rounds 300   # steadier on a busy machine
    python bench/loader.py --workers 2 --repeat 5 --block 10 --rounds 100  # workers, many short pairs
    python bench/loader.py --streams            # HF streaming (JSONL) vs webdataset (tar): rows/s
    python bench/loader.py --sampler            # the per-batch decision alone, CPU time (steady under load)
    python bench/loader.py --turns              # a loader worker's own per-batch work, CPU time
    python bench/loader.py --smoke              # seconds: tiny sizes, every column (tests/bench)

``--streams`` writes the same rows (512 tokens each) to 8 JSONL shards and 8 tar shards and
times one epoch through ``SupervisedLoader`` with 0 and 2 workers (start-up included).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.sdk import SupervisedLoader  # noqa: E402


class IndexSpace(Dataset[torch.Tensor]):
    """``n`` samples of ``seq`` tokens each, read from a token file on disk."""

    def __init__(self, n: int, path: Path, seq: int) -> None:
        self.n, self.path, self.seq = n, path, seq
        self.tokens = path.stat().st_size // 2
        self._data: np.memmap | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint16, mode="r")
        start = (i * self.seq) % (self.tokens - self.seq)
        return torch.from_numpy(self._data[start : start + self.seq].astype(np.int64))


def plain(ds: IndexSpace, args: argparse.Namespace, workers: int) -> DataLoader:
    kw: dict[str, Any] = {"prefetch_factor": 2, "persistent_workers": True} if workers else {}
    if len(ds) > 10**8 and args.big_plain == "replacement":  # random reads without a randperm table
        sampler = RandomSampler(ds, replacement=True, num_samples=2**62)
        return DataLoader(ds, args.batch, sampler=sampler, num_workers=workers, **kw)
    shuffle = len(ds) <= 10**8  # RandomSampler materializes randperm(n)
    return DataLoader(ds, args.batch, shuffle=shuffle, num_workers=workers, **kw)


def supervised(
    ds: IndexSpace, args: argparse.Namespace, workers: int, excluded: dict | None
) -> SupervisedLoader:
    kw: dict[str, Any] = {"prefetch_factor": 2} if workers else {}
    ld = SupervisedLoader(ds, args.batch, seed=0, rank=0, world_size=1, num_workers=workers, **kw)
    if excluded is not None:
        ld.load_state_dict(excluded)
    return ld


def exclusion_state(n: int, count: int) -> dict[str, Any] | None:
    if not count:
        return None
    rng = np.random.default_rng(0)
    ids = [str(int(i)) for i in rng.integers(0, n, size=count)]
    return {"seed": 0, "cursor": {"epoch": 0, "pos": 0, "batch": 0}, "exclusions": {"samples": ids}}


def startup(make: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        loader = make()
        next(iter(loader))
        times.append(time.perf_counter() - t)
        close(loader)
    return statistics.median(times)


def close(loader: Any) -> None:
    """Stop a loader's worker processes now (a plain DataLoader's persistent workers otherwise
    stop whenever the garbage collector gets to them, in the middle of the next row)."""
    if isinstance(loader, SupervisedLoader):
        loader.close()
        return
    it = getattr(loader, "_iterator", None)
    if it is not None and hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()
    loader._iterator = None


def per_batch(loaders: dict[str, Any], args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds per batch, per block: ``<name>`` wall time, ``<name>/cpu`` the training process's CPU time
    (what the loader adds runs there: order, exclusions, IDs; the workers' share is the same for both)."""
    its = {name: iter(ld) for name, ld in loaders.items()}
    for it in its.values():  # warm-up: workers started, first blocks mapped
        for _ in range(args.block):
            next(it)
    out: dict[str, list[float]] = {key: [] for name in loaders for key in (name, f"{name}/cpu")}
    for _ in range(args.rounds):
        for name, it in its.items():
            t, cpu = time.perf_counter(), time.process_time()
            for _ in range(args.block):
                next(it)
            out[f"{name}/cpu"].append((time.process_time() - cpu) / args.block)
            out[name].append((time.perf_counter() - t) / args.block)
    return out


def stream_rows_per_s(rows: int) -> None:
    import json

    import datasets
    import webdataset as wds

    from supervisor.sdk.data.shards import WebDatasetShards

    def collate(items: list[dict[str, Any]]) -> torch.Tensor:
        return torch.tensor([it.get("json", it)["tokens"] for it in items])

    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        jsonl, tars = [], []
        per = rows // 8
        for j in range(8):
            block = [{"id": f"r{j}-{k}", "tokens": rng.integers(0, 50_000, 512).tolist()} for k in range(per)]
            path = Path(tmp) / f"part-{j}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in block))
            jsonl.append(str(path))
            tar = Path(tmp) / f"shard-{j}.tar"
            with wds.TarWriter(str(tar)) as sink:
                for k, r in enumerate(block):
                    sink.write({"__key__": f"{j:02d}-{k:06d}", "json": r})
            tars.append(str(tar))
        print(
            f"| source | workers | rows/s (one epoch of {per * 8:,} rows x 512 tokens, start-up included) |"
        )
        print("|---|---|---|")
        for name in ("hf streaming (JSONL)", "webdataset (tar)"):
            for workers in (0, 2):
                if name.startswith("hf"):
                    src: Any = datasets.load_dataset("json", data_files=jsonl, split="train", streaming=True)
                else:
                    src = WebDatasetShards(tars)
                t = time.perf_counter()
                ld = SupervisedLoader(src, 16, rank=0, world_size=1, collate_fn=collate, num_workers=workers)
                for _ in range(per * 8 // 16):
                    ld.next_batch()
                ld.close()
                print(f"| {name} | {workers} | {per * 8 / (time.perf_counter() - t):,.0f} |", flush=True)


def sampler_cpu(args: argparse.Namespace) -> None:
    """What each loader runs in the training process to decide a batch, alone, in CPU time.

    plain: the DataLoader's ``BatchSampler`` over ``RandomSampler`` (a ``randperm`` table; at
    10^9 ``SequentialSampler``, cheaper than any shuffle). supervised: ``Schedule.next`` — the
    permutation, the exclusion filter and the batch's sample IDs. Blocks of the two alternate;
    the difference is the per-batch work the supervised loader adds in the training process,
    whatever the workers and the machine's load do to wall time.
    """
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    from supervisor.sdk.data.exclusions import ExclusionSet
    from supervisor.sdk.data.lookup import inverse
    from supervisor.sdk.data.schedule import Schedule
    from supervisor.sdk.directives import Exclusions

    print(
        f"batch {args.batch}; CPU per batch, median of {args.rounds} x {args.repeat} blocks of 2,000 batches"
    )
    print("| n | excluded | plain sampler | supervised schedule | added per batch |")
    print("|---|---|---|---|---|")
    for n in (10**6, 10**9):
        for count in (0, 100_000):
            ex = ExclusionSet()
            state = exclusion_state(n, count)
            if state:
                ex.add(Exclusions.from_dict(state["exclusions"]))
            sched = Schedule(n, args.batch, rank=0, world_size=1, seed=0, shuffle=True, sample_id=None,
                             source=None, exclusions=ex, index_of=inverse(range(n), n))  # fmt: skip
            base = RandomSampler(range(n)) if n <= 10**8 else SequentialSampler(range(n))
            plain_it = iter(BatchSampler(base, args.batch, drop_last=False))
            steps = {"plain": functools.partial(next, plain_it), "supervised": sched.next}
            out: dict[str, list[float]] = {"plain": [], "supervised": []}
            for _ in range(args.rounds * args.repeat):
                for name, step in steps.items():
                    t = time.process_time()
                    for _ in range(2_000):
                        step()
                    out[name].append((time.process_time() - t) / 2_000)
            p, q = statistics.median(out["plain"]), statistics.median(out["supervised"])
            print(
                f"| 1e{len(str(n)) - 1} | {count:,} | {p * 1e6:.2f} us | {q * 1e6:.2f} us | {(q - p) * 1e6:+.2f} us |"
            )


def _token_file(folder: Path) -> Path:
    """8 Mi random uint16 tokens on disk, read through ``np.memmap`` by the bench's datasets."""
    path = folder / "tokens.u16"
    np.random.default_rng(0).integers(0, 50_000, size=8 << 20, dtype=np.uint16).tofile(path)
    return path


def worker_cpu(args: argparse.Namespace, workers: int = 2) -> None:
    """A loader worker's per-batch CPU, in process: its schedule (``Schedule.turns``: walking
    every batch of the generation vs counting past the others' and mapping only its own) and
    loading + collating its batch. Worker 0 of ``workers``; blocks of the two alternate."""
    from torch.utils.data import default_collate

    from supervisor.sdk.data.exclusions import ExclusionSet
    from supervisor.sdk.data.schedule import Schedule
    from supervisor.sdk.directives import Exclusions

    with tempfile.TemporaryDirectory() as tmp:
        path = _token_file(Path(tmp))
        print(
            f"worker 0 of {workers}, batch {args.batch} x {args.seq} tokens; CPU per own batch, "
            f"median of {args.rounds} x {args.repeat} blocks of 1,000 batches"
        )
        print("| n | excluded | schedule, walking | schedule, counting | load + collate | saved per batch |")
        print("|---|---|---|---|---|---|")
        for n in (10**6, 10**9):
            ds = IndexSpace(n, path, args.seq)
            for count in (0, 100_000):
                ex = ExclusionSet()
                state = exclusion_state(n, count)
                if state:
                    ex.add(Exclusions.from_dict(state["exclusions"]))
                sched = Schedule(n, args.batch, rank=0, world_size=1, seed=0, shuffle=True, sample_id=None,
                                 source=None, exclusions=ex, index_of=inverse_of(n))  # fmt: skip
                its = {
                    "walk": sched.for_worker()._walked_turns(0, workers),
                    "count": sched.for_worker().turns(0, workers),
                }
                for it in its.values():  # warm-up: first blocks / runs mapped
                    for _ in range(600):
                        next(it)
                out: dict[str, list[float]] = {"walk": [], "count": [], "load": []}
                for _ in range(args.rounds * args.repeat):
                    for name, it in its.items():
                        drawing = loading = 0.0
                        for _ in range(1_000):
                            t = time.process_time()
                            draw = next(it)
                            t2 = time.process_time()
                            default_collate([ds[i] for i in draw.indices])
                            drawing, loading = drawing + t2 - t, loading + time.process_time() - t2
                        out[name].append(drawing / 1_000)
                        out["load"].append(loading / 1_000)
                w, c, ld = (statistics.median(out[k]) * 1e6 for k in ("walk", "count", "load"))
                print(
                    f"| 1e{len(str(n)) - 1} | {count:,} | {w:.1f} us | {c:.1f} us | {ld:.1f} us | "
                    f"{w - c:+.1f} us ({(w - c) / (w + ld) * 100:.1f}% of the worker's batch) |",
                    flush=True,
                )


def inverse_of(n: int) -> Any:
    from supervisor.sdk.data.lookup import inverse

    return inverse(range(n), n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--block", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=None, help="blocks per loader (default 15, --quick 6)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sampler", action="store_true", help="only the per-batch decision, in CPU time")
    ap.add_argument(
        "--big-plain",
        choices=("sequential", "replacement"),
        default="sequential",
        help="the plain baseline's sampler at 10^9 (randperm would be 8 GB)",
    )
    ap.add_argument("--turns", action="store_true", help="a loader worker's per-batch work, in CPU time")
    ap.add_argument("--repeat", type=int, default=3, help="fresh plain + supervised loaders per row")
    ap.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    ap.add_argument("--streams", type=int, nargs="?", const=16_000, default=None, metavar="ROWS")
    ap.add_argument("--smoke", action="store_true", help="seconds: 10^6 only, tiny batches, 1,000 excluded")
    args = ap.parse_args()
    # One multiprocessing temp folder for the whole run, made here before any worker forks: each
    # worker then shares it instead of making its own, which it removed when it exited mid-table
    # while a file descriptor it had passed was still being fetched from it ("OSError: Directory
    # not empty" traceback between two rows). The folder goes once, at exit, after the workers.
    multiprocessing.util.get_temp_dir()
    excluded_counts: tuple[int, ...] = (0, 100_000)
    if args.smoke:
        args.quick, args.seq, args.block, args.rounds, args.repeat = True, 64, 2, 1, 1
        excluded_counts = (0, 1_000)
    if args.streams:
        stream_rows_per_s(args.streams)
        return
    if args.sampler:
        args.rounds = args.rounds or 5
        sampler_cpu(args)
        return
    if args.turns:
        args.rounds = args.rounds or 3
        worker_cpu(args)
        return
    sizes = [10**6] if args.quick else [10**6, 10**9]
    if args.rounds is None:
        args.rounds = 6 if args.quick else 15
    with tempfile.TemporaryDirectory() as tmp:
        path = _token_file(Path(tmp))
        print(
            f"batch {args.batch} x {args.seq} tokens; per batch: {args.repeat} repeats x "
            f"{args.rounds} interleaved blocks of {args.block} batches; plain at 10^9: {args.big_plain}"
        )
        print(
            "| n | excluded | workers | start-up plain | start-up supervised | per batch plain / "
            "supervised (median) | overhead, wall: median of repeats [min, max] | overhead, "
            "training-process CPU: median [min, max] |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for n in sizes:
            ds = IndexSpace(n, path, args.seq)
            for count in excluded_counts:
                excluded = exclusion_state(n, count)
                for workers in args.workers:
                    run_row(ds, n, count, workers, excluded, args)


def run_row(
    ds: IndexSpace, n: int, count: int, workers: int, excluded: Any, args: argparse.Namespace
) -> None:
    repeat = 1 if args.smoke else 3 if workers else 5
    s_sup = startup(lambda: supervised(ds, args, workers, excluded), repeat)
    s_plain = startup(lambda: plain(ds, args, workers), repeat) if n <= 10**8 else None
    per: dict[str, list[float]] = {"plain": [], "supervised": []}
    wall, cpu = [], []  # one overhead per repeat: fresh loaders, interleaved blocks
    for _ in range(args.repeat):
        lds = {"plain": plain(ds, args, workers), "supervised": supervised(ds, args, workers, excluded)}
        times = per_batch(lds, args)
        for ld in lds.values():
            close(ld)
        del lds
        wall.append(paired(times["supervised"], times["plain"]))
        cpu.append(paired(times["supervised/cpu"], times["plain/cpu"]))
        for k in per:
            per[k] += times[k]
    plain_start = f"{s_plain * 1e3:.1f} ms" if s_plain is not None else "not run (8 GB randperm)"
    pm, sm = statistics.median(per["plain"]), statistics.median(per["supervised"])
    print(f"| 1e{len(str(n)) - 1} | {count:,} | {workers} | {plain_start} | {s_sup * 1e3:.1f} ms | "
          f"{pm * 1e3:.3f} / {sm * 1e3:.3f} ms | {spread(wall)} | {spread(cpu)} |", flush=True)  # fmt: skip


def paired(sup: list[float], plain: list[float]) -> float:
    """Median over rounds of each supervised block against the plain block run just before it, - 1:
    load that drifts over seconds hits both blocks of a pair alike and cancels."""
    return statistics.median(s / p for s, p in zip(sup, plain, strict=True)) - 1


def spread(xs: list[float]) -> str:
    """Median over repeats, with the range: ``+1.2% [-0.4, +2.0]``."""
    return f"{statistics.median(xs) * 100:+.1f}% [{min(xs) * 100:+.1f}, {max(xs) * 100:+.1f}]"


if __name__ == "__main__":
    main()

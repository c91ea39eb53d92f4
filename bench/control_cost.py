"""What the directive path costs rank 0 per step, at 2 to 16 real ranks (issue 26, point 3).

Before: at every boundary rank 0 broadcast an 8-byte length word to every rank over a gloo
group (``control.BroadcastChannel``), then the payload when there was one. After: the ranks
agree through the rendezvous store on the boundary where rank 0's directives take effect
(``control.AgreedChannel``, ``sdk/agreement.py``), touching nothing on a boundary where nothing
is being agreed. Both run in the same processes, in alternating blocks, with the calls the
steering makes at each boundary (``arrive``, ``due``, ``propose``, ``depart``) and a 1-float
all-reduce as each step's training collective; a no-op directive every ``--every`` steps.

    python bench/control_cost.py [--ranks 2,4,8,16] [--steps 200] [--rounds 4] [--every 50]

The figure is rank 0's time inside those calls, per step (median and mean over all steps of a
path, directive steps included in the mean), the CPU time of its thread inside them (on a
machine with fewer cores than ranks, wall time also counts the time the scheduler gave to other
ranks), beside the CPU time of the same calls on a ``LocalChannel`` (one rank's own list, no
other rank involved: what any such call costs on that machine at that load), and the wall time
per step of each block.
Last line: ``control_cost: ranks R, broadcast X us/step, agreed Y us/step (Zx)`` for the largest R.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, steps: int, rounds: int, every: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from supervisor.sdk.control import AgreedChannel, BroadcastChannel, LocalChannel, rendezvous_store
    from supervisor.sdk.directives import Continue

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))  # fmt: skip
    channels: dict[str, Any] = {
        "broadcast": BroadcastChannel(rank, world),
        "agreed": AgreedChannel(rank, world, rendezvous_store()),
        "local": LocalChannel(),  # the same calls on one rank's own list: what any call costs here
    }
    x = torch.ones(1)
    cost: dict[str, list[float]] = {name: [] for name in channels}
    cpu: dict[str, list[float]] = {name: [] for name in channels}
    wall: dict[str, list[float]] = {name: [] for name in channels}
    applied: dict[str, int] = dict.fromkeys(channels, 0)
    failed = 0  # directives rank 0 gave up agreeing on (none expected)
    for rnd in range(rounds):
        order = list(channels) if rnd % 2 == 0 else list(reversed(channels))  # the drift cancels
        for name in order:
            ch = channels[name]
            dist.barrier()
            started = time.perf_counter()
            for i in range(steps):
                t0, c0 = time.perf_counter(), time.thread_time()
                ch.arrive()
                got = ch.due()
                if rank == 0 or name == "local":
                    ch.propose([Continue(id=f"{name}-{rnd}-{i}")] if i % every == every - 1 else [])
                while more := ch.depart():
                    got += more
                cost[name].append(time.perf_counter() - t0)
                cpu[name].append(time.thread_time() - c0)
                applied[name] += len(got)
                failed += len(ch.failed())
                dist.all_reduce(x)  # the step's own collective
            wall[name].append((time.perf_counter() - started) / steps)
    # Unmeasured: the agreed path's last directives take effect (a retry after an abort looks
    # further ahead each time), until rank 0 has applied or given up every one it proposed.
    ch, proposed = channels["agreed"], rounds * (steps // every)
    more_steps = torch.ones(1)
    for _ in range(1024):
        ch.arrive()
        applied["agreed"] += len(ch.due())
        while more := ch.depart():
            applied["agreed"] += len(more)
        if rank == 0:
            failed += len(ch.failed())
            more_steps.fill_(float(applied["agreed"] + failed < proposed))
        dist.all_reduce(more_steps, op=dist.ReduceOp.MAX)
        if not more_steps.item():
            break
    channels["agreed"].close()
    dist.barrier()
    if rank == 0:
        res = {"cost": cost, "cpu": cpu, "wall": wall, "applied": applied, "failed": failed}
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def measure(world: int, steps: int, rounds: int, every: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/rank0.json"
        mp.spawn(_rank, args=(world, _free_port(), steps, rounds, every, out), nprocs=world, join=True)
        return dict(json.loads(Path(out).read_text()))


def _us(xs: list[float]) -> tuple[float, float]:
    return statistics.median(xs) * 1e6, statistics.fmean(xs) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4,8,16", help="comma-separated rank counts")
    ap.add_argument("--steps", type=int, default=200, help="steps per block")
    ap.add_argument("--rounds", type=int, default=4, help="blocks per path (alternating order)")
    ap.add_argument("--every", type=int, default=50, help="a no-op directive every N steps")
    ap.add_argument("--smoke", action="store_true", help="2 ranks, a few steps (seconds)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(r) for r in args.ranks.split(",")]
    except ValueError:
        print(
            f"control_cost: --ranks: not a comma-separated list of integers: {args.ranks!r}", file=sys.stderr
        )
        return 2
    if args.smoke:
        sizes, args.steps, args.rounds, args.every = [2], 30, 2, 10
    print(f"control cost on rank 0 per step: gloo, 1 torch thread per rank, a 1-float all-reduce per step, "
          f"{args.rounds} blocks x {args.steps} steps per path, a directive every {args.every} steps; "
          f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("| ranks | broadcast us/step (median / mean) | agreed us/step (median / mean) | broadcast / agreed "
          "(median) | CPU us/step broadcast / agreed / local (median) | step wall broadcast / agreed (ms) "
          "| directives applied (each) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    last = ""
    for world in sizes:
        res = measure(world, args.steps, args.rounds, args.every)
        (bm, ba), (am, aa) = _us(res["cost"]["broadcast"]), _us(res["cost"]["agreed"])
        bw, aw = (statistics.median(res["wall"][k]) * 1e3 for k in ("broadcast", "agreed"))
        bc, ac, lc = (statistics.median(res["cpu"][k]) * 1e6 for k in ("broadcast", "agreed", "local"))
        ratio = bm / am if am > 0 else float("inf")
        gave_up = f" ({res['failed']} not agreed)" if res["failed"] else ""
        print(f"| {world} | {bm:,.1f} / {ba:,.1f} | {am:,.1f} / {aa:,.1f} | {ratio:,.0f}x | {bc:,.1f} / {ac:,.1f} / {lc:,.1f} | {bw:.2f} / {aw:.2f} | "
              f"{res['applied']['broadcast']} / {res['applied']['agreed']}{gave_up} |")  # fmt: skip
        last = f"control_cost: ranks {world}, broadcast {bm:,.1f} us/step, agreed {am:,.1f} us/step ({ratio:,.0f}x)"
    print(f"load after {os.getloadavg()[0]:.1f}")
    print(last)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Sustained telemetry into a supervisor actor from many simulated ranks, with nothing lost silently.

Each simulated rank is a Ray actor that produces records (the size of a real one: 8 sample
IDs, 3 sources) as fast as it can for ``--seconds`` through the SDK's ``BatchingTransport``,
whose sink is a call to the supervisor actor (one call in flight per rank, as in the
runtime). The supervisor actor only counts. At the end every produced record is accounted
for: delivered + dropped (counted by the transport) == produced.

    python bench/telemetry_transport.py --ranks 8 --seconds 5
    python bench/telemetry_transport.py --smoke     # 2 ranks for 1 s: the path works (tests/bench)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import ray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@ray.remote(num_cpus=0)
class Supervisor:
    def __init__(self) -> None:
        self.count = 0
        self.calls = 0

    def ingest(self, batch: list[dict[str, Any]]) -> int:
        self.count += len(batch)
        self.calls += 1
        return self.count

    def stats(self) -> tuple[int, int]:
        return self.count, self.calls


@ray.remote(num_cpus=0)
class Rank:
    def __init__(self, rank: int, supervisor: Any, batch_size: int, max_buffer: int) -> None:
        from supervisor.sdk.transport import BatchingTransport

        self.rank = rank
        self.transport = BatchingTransport(
            lambda batch: ray.get(supervisor.ingest.remote(batch)), batch_size=batch_size,
            flush_interval_s=0.05, max_buffer=max_buffer,
        )  # fmt: skip

    def ready(self) -> bool:
        return True

    def produce(self, seconds: float, rate: float) -> dict[str, Any]:
        """Send records for ``seconds`` (at ``rate`` per second, 0: as fast as possible)."""
        rec = {"rank": self.rank, "world_size": 0, "loss": 2.5, "loss_sum": 1280.0, "tokens": 512, "lr": 3e-4,
               "grad_norm": 0.5, "param_norm": 21.0, "update_norm": 0.02, "nonfinite": False,
               "sources": {s: {"tokens": 170, "loss_sum": 420.0} for s in ("code", "docstrings", "tests")},
               "samples": [f"code:email/_header_value_parser.py:{i * 65}" for i in range(8)], "step_time": 0.01}  # fmt: skip
        produced, start = 0, time.perf_counter()
        while (now := time.perf_counter()) - start < seconds:
            if rate and produced >= (now - start) * rate:
                time.sleep(0.0005)  # pacing a simulated training loop, not waiting for a result
                continue
            produced += 1
            self.transport.send([{**rec, "step": produced, "time": time.time()}])
        self.transport.close(10.0)
        s = self.transport.stats
        return {"produced": produced, "sent": s.sent, "dropped": s.dropped, "calls": s.batches}


def run(ranks: int, seconds: float, batch_size: int, rate: float, max_buffer: int) -> dict[str, float]:
    sup = Supervisor.remote()  # type: ignore[attr-defined]
    workers = [Rank.remote(r, sup, batch_size, max_buffer) for r in range(ranks)]  # type: ignore[attr-defined]
    ray.get([w.ready.remote() for w in workers] + [sup.stats.remote()])  # start-up is not part of the figure
    t0 = time.perf_counter()
    results = ray.get([w.produce.remote(seconds, rate) for w in workers])
    elapsed = time.perf_counter() - t0
    count, calls = ray.get(sup.stats.remote())
    produced = sum(r["produced"] for r in results)
    dropped = sum(r["dropped"] for r in results)
    assert count + dropped == produced, f"lost silently: {produced - count - dropped}"
    for w in workers:
        ray.kill(w)
    ray.kill(sup)
    return {"produced": produced, "delivered": count, "dropped": dropped, "calls": calls, "seconds": elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s per rank (0: as fast as possible)")
    ap.add_argument("--max-buffer", type=int, default=10_000)
    ap.add_argument("--smoke", action="store_true", help="2 ranks for 1 s each (too short to judge)")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.seconds = 2, 1.0
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        print(f"{args.ranks} ranks, {args.seconds:.0f} s each, rate={args.rate or 'max'} records/s/rank")
        for batch_size in (1, 100):
            r = run(args.ranks, args.seconds, batch_size, args.rate, args.max_buffer)
            print(f"  batch_size={batch_size:<4} offered {r['produced'] / args.seconds:>9,.0f}/s, delivered {r['delivered'] / r['seconds']:>9,.0f} records/s "
                  f"in {r['calls']:,} calls; produced {r['produced']:,}, dropped (counted) {r['dropped']:,}, "
                  f"lost silently 0")  # fmt: skip
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()

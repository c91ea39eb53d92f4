"""Detection throughput: synthetic records of 1,024 ranks through ``StreamingAnalyzer.observe_step``.

    python bench/detect_throughput.py [--ranks 1024] [--steps 300]

Reports rank-records per second on one core (target >= 200,000) and the per-step decision
latency (p50 / p99 / max), for the full record (per-source splits, samples, fingerprints) and
side by side for a minimal record (step, loss, loss_sum, tokens, grad norm) — the ratio shows
what the optional fields cost. Records are built before timing starts.
"""

from __future__ import annotations

import argparse
import gc
import time

from supervisor.core.analysis import StreamingAnalyzer, group_steps
from supervisor.core.records import Record
from supervisor.traces.synthetic import synthetic_records

TARGET = 200_000


def build(ranks: int, steps: int, full: bool) -> list[tuple[int, list[Record]]]:
    recs = synthetic_records(steps, ranks, seed=0, samples_per_rank=4 if full else 0)
    for r in recs:
        if full:
            half = (r.tokens or 0) // 2
            r.sources = {
                "web": {"tokens": half, "loss_sum": (r.loss_sum or 0) / 2},
                "code": {"tokens": half, "loss_sum": (r.loss_sum or 0) / 2},
            }
        else:
            r.param_checksum = r.update_norm = r.param_norm = r.lr = None
    return list(group_steps(recs))


def measure(steps: list[tuple[int, list[Record]]]) -> dict[str, float]:
    analyzer = StreamingAnalyzer()
    lat: list[float] = []
    gc.collect()
    gc.disable()  # a collection pause is not the detector's cost; report it separately if needed
    try:
        t0 = time.perf_counter()
        for step, batch in steps:
            s = time.perf_counter()
            analyzer.observe_step(step, batch)
            lat.append(time.perf_counter() - s)
        total = time.perf_counter() - t0
    finally:
        gc.enable()
    n = sum(len(b) for _, b in steps)
    lat.sort()
    return {
        "records_per_s": n / total,
        "p50_ms": 1e3 * lat[len(lat) // 2],
        "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "max_ms": 1e3 * lat[-1],
        "incidents": float(len(analyzer.finish().incidents)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    results: dict[str, dict[str, float]] = {}
    for label, full in (("full record", True), ("minimal record", False)):
        results[label] = measure(build(args.ranks, args.steps, full))
    print(f"{args.ranks} ranks x {args.steps} steps, one core")
    for label, r in results.items():
        ok = "ok" if r["records_per_s"] >= TARGET else "BELOW TARGET"
        print(
            f"  {label:15} {r['records_per_s']:>10,.0f} rank-records/s ({ok}); per-step decision "
            f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.2f} ms; incidents {r['incidents']:.0f}"
        )
    ratio = results["full record"]["records_per_s"] / results["minimal record"]["records_per_s"]
    print(f"  full / minimal throughput ratio: {ratio:.2f}")


if __name__ == "__main__":
    main()

"""Detection throughput: synthetic records of 1,024 ranks through ``StreamingAnalyzer.observe_step``.

    python bench/detect_throughput.py [--ranks 1024] [--steps 300]
    python bench/detect_throughput.py --against REV [--rounds 5]   # this tree vs git REV, side by side
    python bench/detect_throughput.py --against REV --trace FILE    # the same on a recorded trace
    python bench/detect_throughput.py --smoke                       # seconds: 8 ranks (tests/bench)

Reports rank-records per second on one core (target >= 200,000) and the per-step decision
latency (p50 / p99 / max), for the full record (per-source splits, samples, fingerprints) and
side by side for a minimal record (step, loss, loss_sum, tokens, grad norm) — the ratio shows
what the optional fields cost. Records are built before timing starts.

``--against REV`` compares this tree's detector with the one at git revision REV (exported with
``git archive`` to a temporary folder): the two run in alternating subprocesses, ``--rounds`` times
each, on the same records, and the ratio of their median CPU-time throughputs is printed. CPU time
(``time.process_time``) is what the detector itself spends; on a loaded machine wall time also
counts the waits for a core.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

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
        t0, c0 = time.perf_counter(), time.process_time()
        for step, batch in steps:
            s = time.perf_counter()
            analyzer.observe_step(step, batch)
            lat.append(time.perf_counter() - s)
        total, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        gc.enable()
    n = sum(len(b) for _, b in steps)
    lat.sort()
    return {
        "records_per_s": n / total,
        "cpu_records_per_s": n / max(cpu, 1e-9),
        "p50_ms": 1e3 * lat[len(lat) // 2],
        "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "max_ms": 1e3 * lat[-1],
        "incidents": float(len(analyzer.finish().incidents)),
    }


def export_tree(rev: str, into: Path) -> Path:
    """``supervisor/`` and ``bench/`` as they were at ``rev``, unpacked under ``into``."""
    root = Path(__file__).resolve().parents[1]
    tar = into / "tree.tar"
    with tar.open("wb") as fh:
        subprocess.run(["git", "archive", rev, "supervisor", "bench"], cwd=root, stdout=fh, check=True)
    with tarfile.open(tar) as tf:
        tf.extractall(into / "tree", filter="data")
    return into / "tree"


def from_trace(path: str) -> list[tuple[int, list[Record]]]:
    from supervisor.traces import read_trace

    return list(group_steps(read_trace(path).records))


def _one_round(tree: Path, ranks: int, steps: int, trace: str | None) -> dict[str, float]:
    """One measurement in a fresh interpreter importing the detector from ``tree``: the full
    synthetic record, or ``trace`` (read with this tree's readers, scored by ``tree``'s detector)."""
    here = Path(__file__).resolve().parents[1]
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); sys.path.insert(1, sys.argv[2]);"
        "import detect_throughput as b;"
        "steps = b.from_trace(sys.argv[5]) if sys.argv[5] else b.build(int(sys.argv[3]), int(sys.argv[4]), True);"
        "print(json.dumps(b.measure(steps)))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", code, str(tree), str(here / "bench"), str(ranks), str(steps), trace or ""],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def compare(rev: str, ranks: int, steps: int, rounds: int, trace: str | None = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old, new = export_tree(rev, Path(tmp)), Path(__file__).resolve().parents[1]
        runs: dict[str, list[dict[str, float]]] = {"this tree": [], rev: []}
        for _ in range(rounds):  # alternate, so that a busy spell on the machine hits both
            runs["this tree"].append(_one_round(new, ranks, steps, trace))
            runs[rev].append(_one_round(old, ranks, steps, trace))
    what = trace or f"{ranks} ranks x {steps} steps, full record"
    print(f"{what}, {rounds} alternating rounds each")
    med = {}
    for label, rs in runs.items():
        med[label] = statistics.median(r["cpu_records_per_s"] for r in rs)
        p50 = statistics.median(r["p50_ms"] for r in rs)
        print(
            f"  {label:12} {med[label]:>10,.0f} rank-records per CPU-second (median); per-step p50 {p50:.2f} ms"
        )
    print(f"  this tree / {rev}: {med['this tree'] / med[rev]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--against", metavar="REV", help="compare with the detector at this git revision")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trace", help="with --against: a recorded trace instead of synthetic records")
    ap.add_argument("--smoke", action="store_true", help="seconds: 8 ranks x 120 steps (too few to judge)")
    args = ap.parse_args()
    if args.smoke:
        args.ranks, args.steps = 8, 120
    if args.against:
        trace = str(Path(args.trace).resolve()) if args.trace else None
        compare(args.against, args.ranks, args.steps, args.rounds, trace)
        return
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

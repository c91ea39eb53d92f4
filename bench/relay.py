"""Real ranks reporting straight to the supervisor or through their node's relay, side by side.

    python -m bench.relay [--ranks 16] [--steps 160] [--rounds 2]
    python -m bench.relay --smoke     # 4 ranks, 60 steps, one run each (tests/bench/test_relay_smoke.py)

The same clean job (the real-ranks bench's: ``--ranks`` DDP ranks over gloo on a local Ray, each a
Ray actor with one torch thread training a one-layer 16-wide TinyLM) runs with
``runtime.relay_from_ranks: 0`` (every rank's link calls the supervisor) and with it at ``--ranks``
(one relay per node, ``supervisor/ranks/relay.py``), alternately, ``--rounds`` times each. From the
supervisor's ``status`` every 0.5 s: its process's CPU and the record batches it received, per step
over the steady part of the run (step 30 to 20 before the end). The last line:

    relay: ranks R, supervisor X ms CPU/step direct, Y relayed (Z x), calls/step A direct, B relayed
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.relay", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each side, alternating")
    ap.add_argument("--smoke", action="store_true", help="4 ranks, 60 steps, one run each: the path works")
    args = ap.parse_args(argv)
    if args.smoke:
        args.ranks, args.steps, args.rounds = 4, 60, 1
    return args


def _job(args: argparse.Namespace, root: Path, relay: bool, index: int) -> Any:
    from bench.real_ranks import JOB
    from supervisor.config.job import JobSpec
    from supervisor.drills.scenario import _merge, find_scenarios

    (clean,) = find_scenarios(["clean"])
    over = {
        "name": f"relay-{'on' if relay else 'off'}-{index}",
        "storage": {"path": str(root / f"run-{index}-{relay}")},
        "resources": {"num_workers": args.ranks, "cpus_per_worker": 0.25},
        "max_steps": args.steps,
        "runtime": {**JOB["runtime"], "relay_from_ranks": args.ranks if relay else 0},
        "faults": [],
    }
    return JobSpec.model_validate(_merge(_merge(clean.job_data, JOB), over))


def _run(job: Any) -> dict[str, float]:
    import ray

    from supervisor.client import api
    from supervisor.config.runtime import settings_for

    handle = api.launch(job, settings_for(job))
    samples: list[dict[str, Any]] = []
    try:
        while True:
            st = api.status(handle, timeout_s=60)
            samples.append(st)
            if st["terminal"]:
                break
            time.sleep(0.5)
    finally:
        ray.kill(handle)
    final = samples[-1]
    if final["phase"] != "finished":
        raise SystemExit(f"{job.name}: ended {final['phase']}: {final.get('reason')}")
    lo, hi = 30, job.max_steps - 20
    # The two read-outs that span the steady part (the nearest outside it when a fast run left
    # none inside): the last at or before step lo, the first at or after step hi.
    a = next((s for s in reversed(samples) if s["step"] <= lo), samples[0])
    b = next((s for s in samples if s["step"] >= hi), samples[-1])
    steps = max(1, b["step"] - a["step"])
    return {
        "cpu_ms_per_step": (b["cpu_s"] - a["cpu_s"]) * 1000 / steps,
        "calls_per_step": (b["record_calls"] - a["record_calls"]) / steps,
        "lost": final["records_lost"],
        "missing": final["records_missing"],
    }


def main(argv: list[str] | None = None) -> int:
    import ray

    from supervisor.client.cluster import needed_cpus
    from supervisor.ranks.names import NAMESPACE

    args = _parse(argv)
    runs: dict[str, list[dict[str, float]]] = {"direct": [], "relayed": []}
    with tempfile.TemporaryDirectory(prefix="bench-relay-") as tmp:
        root = Path(tmp)
        ray.init(address="local", num_cpus=needed_cpus(_job(args, root, False, 0)), namespace=NAMESPACE,
                 include_dashboard=False, log_to_driver=False)  # fmt: skip
        try:
            for r in range(args.rounds):
                for side in ("direct", "relayed"):
                    figures = _run(_job(args, root, side == "relayed", r))
                    runs[side].append(figures)
                    print(f"{side:8} round {r + 1}: {figures['cpu_ms_per_step']:.2f} ms CPU/step, "
                          f"{figures['calls_per_step']:.2f} calls/step, lost {figures['lost']}, "
                          f"missing {figures['missing']}", flush=True)  # fmt: skip
        finally:
            ray.shutdown()
    med = {side: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for side, rs in runs.items()}
    d, r = med["direct"], med["relayed"]
    print(f"relay: ranks {args.ranks}, supervisor {d['cpu_ms_per_step']:.2f} ms CPU/step direct, "
          f"{r['cpu_ms_per_step']:.2f} relayed ({r['cpu_ms_per_step'] / d['cpu_ms_per_step']:.2f}x), "
          f"calls/step {d['calls_per_step']:.2f} direct, {r['calls_per_step']:.2f} relayed")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

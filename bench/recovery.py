"""Recovery time: in-place rollback vs raw checkpoint read vs a full worker-group restart.

One run on a local Ray, real tinylm training (2 workers), a real injected spike:

1. an oversized update at step 150 is detected; the supervisor freezes, blocks `latest`,
   rolls back in place to a healthy checkpoint, lowers the LR and resumes.
   **in-place** = wall time from the `detected` event to the record of the first step after
   the rollback target (the first healthy step);
2. **raw read** = reading every file of that same checkpoint (all ranks) with plain reads;
3. later a worker is SIGKILLed: the supervisor replaces the whole group from the newest
   verified checkpoint. **full restart** = wall time from the `worker_restarted` event (the
   death already noticed) to the record of the first step after the resume checkpoint.

    python bench/recovery.py [--d-model 128 --layers 2] [--readme]   # --readme: also print a bench/README.md row
    python bench/recovery.py --smoke        # one worker, 220 steps, no restart: the path works (tests/bench)

Targets (issue 7): in-place <= 1.5 x raw read + 2 s, and >= 5 x faster than a full restart.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from supervisor.client import api
from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings
from supervisor.core.policy.loader import load_policy
from supervisor.incidents import EventKind
from supervisor.incidents.paths import open_incident_store
from supervisor.ranks.names import NAMESPACE
from supervisor.runtime.group import WorkerGroup

POLICY = """
version: 1
name: bench
description: the in-place recovery path only (no snapshot, short observation).
defaults: {max_attempts: 2, cooldown_steps: 500, max_observation_failures: 2, on_failure: escalate}
rules:
  - name: recover
    match: {phenotype: [divergence, slow_recovery, transient]}
    actions:
      - freeze
      - block_latest
      - rollback: {margin_steps: MARGIN}
      - apply: {lr_scale: 0.1, warmup_steps: 10}
      - observe: {steps: OBSERVE, pass: {loss_within_mads: 50.0, grad_norm_ratio_max: 50.0, update_ratio_max: 50.0, throughput_min_ratio: 0.1}}
      - resume
fallback: [alert]
"""


#: Run sizes: the full bench, and the smoke run (the same in-place path on one worker, few steps,
#: one Ray start, no group restart). The smoke run keeps the full run's model: its steps (~50 ms)
#: stay slower than the supervisor takes to read a step on a loaded machine, as in a real run.
#: With faster steps the fault's records arrived in the same batch as the healthy window of the
#: checkpoint before it: the plan was decided with that checkpoint not yet healthy (escalated).
FULL = {"max_steps": 400, "seq_len": 64, "data_bytes": 300_000, "after_rollback": 60, "workers": 2,
        "fault_step": 150, "every": 25, "margin": 25, "observe": 50, "min_history": 50, "window": 200}  # fmt: skip
SMOKE = {"max_steps": 220, "seq_len": 64, "data_bytes": 100_000, "after_rollback": 5, "workers": 1,
         "fault_step": 120, "every": 25, "margin": 25, "observe": 50, "min_history": 40, "window": 100}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument(
        "--readme", action="store_true", help="Also print the figures as a row of bench/README.md's table."
    )
    ap.add_argument("--smoke", action="store_true", help="One worker, a short run (no figures to keep).")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-recovery-"))
    try:
        rows = measure(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(rows, indent=1))
    if args.readme:
        print(readme_row(rows))


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    size = SMOKE if args.smoke else FULL
    policy = POLICY.replace("MARGIN", str(size["margin"])).replace("OBSERVE", str(size["observe"]))
    (work / "policy.yaml").write_text(policy)
    load_policy(str(work / "policy.yaml"))  # refused here in one line, not in the supervisor actor
    job = JobSpec.model_validate({
        "name": "bench-recovery", "entrypoint": "examples.tinylm.train:main", "max_steps": size["max_steps"],
        "config": {"model": {"d_model": args.d_model, "n_layers": args.layers, "n_heads": 4,
                             "seq_len": size["seq_len"]},
                   "data": {"max_bytes_per_source": size["data_bytes"]}, "probe": {"freeze_poll_s": 0.02}},
        "resources": {"num_workers": size["workers"]}, "storage": {"path": str(work / "store")},
        "checkpoint": {"every_steps": size["every"], "keep": 1000},  # the rollback target is read back at the end
        "policy": str(work / "policy.yaml"),
        "telemetry": {"min_history": size["min_history"], "window": size["window"], "hang_timeout_s": 120},
        "faults": [{"kind": "oversized_update", "step": size["fault_step"], "factor": 300.0}],
    })  # fmt: skip
    settings = RuntimeSettings.model_validate(
        {"healthy_after_steps": 5, "trace_path": str(work / "trace.jsonl")}
    )
    ray.init(address="local", num_cpus=4, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False)
    try:
        handle = api.launch(job, settings)
        store = open_incident_store(job)
        limit = 240 if args.smoke else 900
        rollback = _wait_event(store, job.name, EventKind.ROLLED_BACK, limit, handle)
        resumed_at = rollback.result["to_step"] + size["after_rollback"]
        _wait(lambda: api.status(handle)["step"] >= resumed_at, limit, handle, f"step {resumed_at}")
        restart = None
        if not args.smoke:  # the smoke run skips the group restart: a minute on a busy machine
            group = WorkerGroup.find(job, settings)
            assert group is not None
            os.kill(group.pids()[1], signal.SIGKILL)
            restart = _wait_event(store, job.name, EventKind.WORKER_RESTARTED, 900, handle)
        final = api.wait(handle, 1800)
    finally:
        ray.shutdown()
    records = _records(settings.trace_path, job.resources.num_workers)
    detected = next(e for e in store.timeline(rollback.incident_id) if e.kind is EventKind.DETECTED)
    target = int(rollback.result["to_step"])
    in_place = _first_step_after(records, target, rollback.wall_time) - detected.wall_time
    plan_at = next(e.wall_time for e in store.timeline(rollback.incident_id) if e.kind is EventKind.NOTE)
    full_restart = None
    if restart is not None:
        resume = int(restart.result["resume_step"])
        full_restart = _first_step_after(records, resume, restart.wall_time) - restart.wall_time
    raw, nbytes = _raw_read(work / "store" / job.name / "checkpoints" / f"step_{target:08d}")
    rows = {
        "model": f"tinylm d_model={args.d_model} layers={args.layers}, {size['workers']} worker(s) (gloo, CPU)",
        "checkpoint_mb": round(nbytes / 2**20, 1),
        "in_place_s": round(in_place, 3),
        "raw_read_s": round(raw, 4),
        "full_restart_s": None if full_restart is None else round(full_restart, 3),
        "in_place_limit_s": round(1.5 * raw + 2.0, 3),
        "restart_over_in_place": None if full_restart is None else round(full_restart / in_place, 1),
        "detect_to_decision_s": round(plan_at - detected.wall_time, 3),
        "decision_to_first_step_s": round(in_place - (plan_at - detected.wall_time), 3),
        "median_step_s": round(_median_step(records), 3),
        "detect_to_freeze_s": round(
            _done_at(store, rollback.incident_id, EventKind.FROZE) - detected.wall_time, 3
        ),
        "rollback_load_s": round((rollback.finished_at or rollback.wall_time) - rollback.wall_time, 3),
        "job": final["phase"],
    }
    return rows


def _records(trace: str | None, world_size: int) -> list[dict[str, Any]]:
    """Every rank's records: the run writes one trace per rank (``trace.rank0.jsonl``, ...), as
    ``sdk.context.trace_path`` names them (reading ``trace.jsonl`` itself found no file)."""
    from supervisor.sdk.context import trace_path

    out = []
    for rank in range(world_size):
        out += [
            json.loads(x) for x in trace_path(trace, rank, world_size).read_text().splitlines() if x.strip()
        ]
    return out


def _wait(pred: Any, timeout_s: float, handle: Any, what: str) -> None:
    """Poll ``pred`` until true; a job that ends first, or the deadline, stops the bench with the
    job's last status (a run that never reaches the condition does not hang the bench)."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        st = api.status(handle, timeout_s=60)
        if st.get("terminal") or time.monotonic() > deadline:
            shown = {k: st.get(k) for k in ("phase", "step", "reason", "incident")}
            raise SystemExit(
                f"recovery.py: {what} not reached ({'job ended' if st.get('terminal') else 'timeout'}): {shown}"
            )
        time.sleep(0.2)


def _wait_event(store: Any, job: str, kind: EventKind, timeout_s: float, handle: Any) -> Any:
    found: list[Any] = []

    def done() -> bool:
        found[:] = [e for i in store.list_incidents(job=job) for e in store.timeline(i.id)
                    if e.kind is kind and e.status.value == "done"]  # fmt: skip
        return bool(found)

    _wait(done, timeout_s, handle, f"event {kind.value}")
    return found[0]


def _done_at(store: Any, incident_id: int, kind: EventKind) -> float:
    e = next(e for e in store.timeline(incident_id) if e.kind is kind)
    return float(e.finished_at or e.wall_time)


def _first_step_after(records: list[dict[str, Any]], step: int, since: float) -> float:
    """Wall time of the first record of ``step + 1`` produced after ``since`` (any rank)."""
    times = [r["time"] for r in records if r.get("step") == step + 1 and r.get("time", 0) >= since]
    if not times:
        raise RuntimeError(f"no record of step {step + 1} after the recovery")
    return float(min(times))


def _median_step(records: list[dict[str, Any]]) -> float:
    return float(statistics.median(r["step_time"] for r in records if r.get("step_time")))


def _raw_read(directory: Path) -> tuple[float, int]:
    """Median of 3 plain reads of every file of the checkpoint (page cache warm, as for the load)."""
    if not directory.is_dir():
        raise SystemExit(f"recovery.py: {directory}: the rollback target is gone (retention collected it?)")
    files = [p for p in directory.rglob("*") if p.is_file()]  # DCP shards sit in a dcp-<id>/ folder
    times, total = [], 0
    for _ in range(3):
        t0, total = time.perf_counter(), 0
        for p in files:
            with open(p, "rb", buffering=0) as fh:
                while chunk := fh.read(8 << 20):
                    total += len(chunk)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), total


def readme_row(r: dict[str, Any]) -> str:
    """The bench/README.md table row of these figures (printed: that file is edited by hand)."""
    restart = r["full_restart_s"]
    ratio = "" if restart is None else f" vs full restart {restart} s ({r['restart_over_in_place']}x)"
    meets = "meets" if r["in_place_s"] <= r["in_place_limit_s"] else "MISSES"
    figure = (
        f"in-place rollback {r['in_place_s']} s{ratio}; raw read {r['raw_read_s']} s, limit "
        f"{r['in_place_limit_s']} s ({meets}); {r['model']}, checkpoint {r['checkpoint_mb']} MB"
    )
    goal = "in-place <= 1.5x raw read + 2 s; restart >= 5x in-place"
    return f"| recovery time | `python bench/recovery.py` | {figure} | {goal} | {time.strftime('%Y-%m-%d')} | | |"


if __name__ == "__main__":
    main()

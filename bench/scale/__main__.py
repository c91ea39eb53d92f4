"""The real supervisor actor driven by emulated ranks: what its costs do as the job grows.

    python -m bench.scale --ranks 1024 [--steps 300] [--hosts 1] [--step-time 0.5]
    python -m bench.scale --smoke            # 16 ranks, 100 steps, seconds (tests/bench/test_scale_smoke.py)

The supervisor is the real ``SupervisorActor`` (controller, detector, policy engine, incident store,
checkpoint store, state file) on a local Ray; its worker group is the rank emulator
(``supervisor/drills/emulator.py``): hosts that each play many ranks over the real transport and
directive protocol. The run has two parts: the first ``--free-steps`` steps go as fast as the
supervisor takes them (the ingest rate), the rest at ``--step-time`` per step with a non-finite
step on every rank at ``--fault-step``, which the bench policy (bench/scale/policy.yaml) handles
with freeze, snapshot, block latest, rollback, re-warm, observe, resume.

Printed: ingest rate (records analysed per second of the free part), ingest lag p50/p99 (record
made -> accepted by the supervisor; and -> durably acknowledged), supervisor CPU per step of the
paced part, its RSS, detection -> every rank frozen (seconds and steps), rollback directive -> every
rank acknowledged it, state-file and incident-store write costs, records produced / delivered /
lost. The last line:

    scale: ranks R, ingest X records/s, supervisor Y ms CPU/step, frozen in Z s (W steps), acked in V s, lost L

``--against REV`` runs the same bench on this tree and on git revision REV (exported with ``git
archive``), one after the other, ``--rounds`` times each, and prints each side's medians and
their ratios: the figures of one machine at one time, side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--hosts", type=int, default=1, help="emulator processes (ranks split between them)")
    ap.add_argument("--step-time", type=float, default=0.5, help="seconds per paced step")
    ap.add_argument("--free-steps", type=int, default=100, help="first steps as fast as the supervisor takes")
    ap.add_argument("--fault-step", type=int, default=None, help="non-finite step (default: 2/3 of --steps)")
    ap.add_argument("--no-fault", action="store_true", help="a clean run (the long-run figures)")
    ap.add_argument(
        "--ahead", type=int, default=1000, help="running free: records a rank may have unacknowledged"
    )
    ap.add_argument("--restore-s", type=float, default=0.5, help="seconds a rank takes to restore")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--profile", type=Path, default=None, help="py-spy the supervisor into this file (raw)")
    ap.add_argument("--keep", action="store_true", help="keep the run's storage (its path is printed)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--smoke", action="store_true", help="16 ranks, 100 steps: the path works")
    ap.add_argument(
        "--against", metavar="REV", help="this tree and git revision REV, alternating: the ratios"
    )
    ap.add_argument("--rounds", type=int, default=1, help="with --against: runs of each side")
    args = ap.parse_args(argv)
    if args.smoke:
        args.ranks, args.steps, args.free_steps, args.step_time = 16, 100, 30, 0.08
    if args.fault_step is None and not args.no_fault:
        args.fault_step = max(args.free_steps + 10, args.steps * 2 // 3)
    return args


def _job(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    return {
        "name": f"scale-{args.ranks}",
        "entrypoint": "supervisor.drills.emulator:EmulatorHost",
        "max_steps": args.steps,
        "resources": {"num_workers": args.ranks},
        "storage": {"path": str(root / "store")},
        "policy": str(HERE / "policy.yaml"),
        "checkpoint": {"every_steps": 25},
        "telemetry": {"min_history": 20, "window": 200, "hang_timeout_s": 300},
    }


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.against:
        return _compare(args)
    import ray

    from supervisor.config.runtime import RuntimeSettings
    from supervisor.drills.emulator import EmulatorConfig, ScaleSupervisor, start_host
    from supervisor.ranks.names import NAMESPACE, supervisor_options

    root = Path(tempfile.mkdtemp(prefix="scale-"))
    job = _job(args, root)
    cfg = EmulatorConfig(ranks=args.ranks, hosts=args.hosts, step_time_s=args.step_time,
                         free_steps=args.free_steps, fault_step=None if args.no_fault else args.fault_step,
                         restore_s=args.restore_s, checkpoint_every=25, ahead=args.ahead)  # fmt: skip
    settings = RuntimeSettings.model_validate({"healthy_after_steps": 5, "step_deadline_s": 30.0,
                                               "directive_timeout_s": 300.0, "startup_timeout_s": 300.0,
                                               "log_level": "warning"})  # fmt: skip
    ray.init(address="local", num_cpus=4, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(HERE.parents[1])}})  # fmt: skip
    try:
        hosts = [start_host(job, cfg, i) for i in range(args.hosts)]
        ray.get([h.ready.remote() for h in hosts], timeout=300)
        started = time.time()
        sup = (
            ray.remote(ScaleSupervisor)
            .options(**supervisor_options(job["name"], settings.niceness))
            .remote(job, settings.model_dump(), False, args.hosts)
        )
        spy = _profile(sup, args.profile) if args.profile else None
        samples, status = _follow(sup, args)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        stats = ray.get([h.stats.remote() for h in hosts], timeout=60)
        probe = ray.get(sup.probe.remote(), timeout=60)
        probe["analysed"] = ray.get(sup.analysed.remote(), timeout=60)
        figures = _figures(args, job, root, samples, stats, probe, status, started)
    finally:
        ray.shutdown()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    _print(args, figures)
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0 if figures["ok"] else 1


def _compare(args: argparse.Namespace) -> int:
    """This tree and ``args.against``, alternating, each run in a fresh process of its own tree."""
    from bench.detect_throughput import export_tree

    same = ["--ranks", str(args.ranks), "--steps", str(args.steps), "--hosts", str(args.hosts),
            "--step-time", str(args.step_time), "--free-steps", str(args.free_steps), "--ahead", str(args.ahead),
            "--restore-s", str(args.restore_s), "--timeout", str(args.timeout),
            *(["--no-fault"] if args.no_fault else ["--fault-step", str(args.fault_step)])]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": HERE.parents[1], args.against: export_tree(args.against, Path(tmp))}
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
        for r in range(args.rounds):  # alternate, so that a busy spell on the machine hits both
            for i, (label, tree) in enumerate(trees.items()):
                out = Path(tmp) / f"run-{r}-{i}.json"
                env = {**os.environ, "PYTHONPATH": str(tree)}
                cmd = [sys.executable, "-m", "bench.scale", *same, "--json", str(out)]
                subprocess.run(cmd, cwd=tree, env=env, check=False, stdout=subprocess.DEVNULL)
                if not out.exists():
                    print(f"{label}: the run wrote no figures (its bench.scale failed)", file=sys.stderr)
                    return 1
                runs[label].append(json.loads(out.read_text()))
    print(
        f"scale against {args.against}: ranks {args.ranks}, {args.rounds} alternating run(s) each (medians)"
    )
    med: dict[str, dict[str, float | None]] = {}
    for label, rs in runs.items():
        med[label] = {k: _median([x.get(k) for x in rs]) for k in ("cpu_ms_per_step", "loop_ms_per_step",
                      "ingest_ms_per_step", "cpu_s_total", "ingest_records_per_s", "frozen_s", "frozen_steps", "acked_s", "lost", "wall_s")}  # fmt: skip
        m = med[label]
        print(f"  {label:12} supervisor {_fmt(m['cpu_ms_per_step'])} ms CPU/step (loop {_fmt(m['loop_ms_per_step'])}, "
              f"ingest calls {_fmt(m['ingest_ms_per_step'])}, "
              f"{_fmt(m['cpu_s_total'])} s in "
              f"all), ingest {_fmt(m['ingest_records_per_s'], '.0f')} records/s, frozen in {_fmt(m['frozen_s'])} s "
              f"({_fmt(m['frozen_steps'], '.0f')} steps), acked in {_fmt(m['acked_s'])} s, lost "
              f"{_fmt(m['lost'], '.0f')}, wall {_fmt(m['wall_s'], '.0f')} s")  # fmt: skip
    a, b = med["this tree"], med[args.against]
    ratios = ", ".join(f"{what} {_fmt(_ratio(a[k], b[k]))}" for what, k in (
        ("CPU per paced step", "cpu_ms_per_step"), ("the loop's", "loop_ms_per_step"), ("CPU in all", "cpu_s_total"),
        ("ingest", "ingest_records_per_s"), ("detection -> frozen", "frozen_s")))  # fmt: skip
    print(f"  this tree / {args.against}: {ratios}")
    return 0


def _median(xs: list[Any]) -> float | None:
    vals = [float(x) for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _profile(sup: Any, out: Path) -> Any:
    """py-spy on the supervisor actor's process (stopped with SIGINT at the end, by its pid)."""
    import ray

    pid = ray.get(sup.probe.remote(), timeout=300)["pid"]
    spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "40", "--format", "raw",
                             "--output", str(out), "--nonblocking", "--threads"])  # fmt: skip


def _follow(sup: Any, args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(time, supervisor CPU, RSS, analysed step) every 0.5 s until the job ends."""
    import ray

    deadline = time.monotonic() + args.timeout
    samples: list[dict[str, Any]] = []
    while True:
        probe = ray.get(
            sup.probe.remote(), timeout=120
        )  # one call: the read-out is not the supervisor's cost
        status = probe["status"]
        samples.append({"t": time.time(), "cpu_s": probe["cpu_s"], "loop_cpu_s": probe["loop_cpu_s"],
                        "ingest_cpu_s": probe["ingest_cpu_s"],
                        "rss": probe["rss"], "step": probe["watermark"],
                        "frozen": status["frozen"], "state_bytes": probe["costs"]["state_file"]["bytes"]})  # fmt: skip
        if status["terminal"] or time.monotonic() > deadline:
            return samples, status
        time.sleep(0.25 if args.smoke else 0.5)


def _incident_times(root: Path) -> dict[str, Any]:
    """Detected (time, step) and the rollback action's start (time) from the incident store."""
    db = root / "store" / "incidents.sqlite"
    out: dict[str, Any] = {}
    if not db.exists():
        return out
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "SELECT kind, wall_time, step, status, finished_at FROM events ORDER BY id"
        ).fetchall()
    finally:
        con.close()
    for kind, wall, step, _status, finished in rows:
        if kind == "detected" and "detected_t" not in out:
            out["detected_t"], out["detected_step"] = wall, step
        if kind == "rolled_back" and "rollback_t" not in out:
            out["rollback_t"], out["rollback_done_t"] = wall, finished
    out["events"] = len(rows)
    out["db_bytes"] = db.stat().st_size
    return out


def _figures(args: argparse.Namespace, job: dict[str, Any], root: Path, samples: list[dict[str, Any]],
             stats: list[dict[str, Any]], probe: dict[str, Any], status: dict[str, Any],
             started: float) -> dict[str, Any]:  # fmt: skip
    ranks = args.ranks
    produced = sum(s["produced"] for s in stats)
    dropped = sum(s["dropped"] for s in stats)
    unacked = sum(s["unacked"] for s in stats)
    delivered = sum(s["acked"] for s in stats)
    lost = produced - delivered  # every record made is either durably accepted or lost
    # Ingest: the free steps' records over the time from the first one made to the last one analysed.
    analysed, first = probe["analysed"], stats[0]["first_record"]
    ingest = 0.0
    if args.free_steps in analysed and first is not None and analysed[args.free_steps] > first:
        ingest = args.free_steps * ranks / (analysed[args.free_steps] - first)
    # CPU per step in the paced part before the fault (the steady state a real job lives in).
    fault = args.fault_step or args.steps
    before = []  # the samples until the fault's step was reached (a rollback then moves the step back)
    for s in samples:
        if s["step"] >= fault - 1:
            break
        before.append(s)
    paced = [s for s in before if s["step"] >= args.free_steps + 5]
    cpu_per_step = loop_per_step = ingest_per_step = None
    if len(paced) >= 2 and paced[-1]["step"] > paced[0]["step"]:
        a, b = paced[0], paced[-1]
        cpu_per_step = (b["cpu_s"] - a["cpu_s"]) / (b["step"] - a["step"])
        ingest_per_step = (b["ingest_cpu_s"] - a["ingest_cpu_s"]) / (b["step"] - a["step"])
        if a["loop_cpu_s"] is not None and b["loop_cpu_s"] is not None:
            loop_per_step = (b["loop_cpu_s"] - a["loop_cpu_s"]) / (b["step"] - a["step"])
    inc = _incident_times(root)
    segments = _segments(samples)
    ev = stats[0]["events"]
    freeze = next((e for e in ev if e[0] == "freeze_acked"), None)
    rollback = next((e for e in ev if e[0] == "rollback_acked"), None)
    frozen_s = frozen_steps = acked_s = None
    if freeze and "detected_t" in inc:
        frozen_s = freeze[1] - inc["detected_t"]
        frozen_steps = freeze[2] - (inc["detected_step"] or 0)
    if rollback and "rollback_t" in inc:
        acked_s = rollback[1] - inc["rollback_t"]
    state_file = root / "store" / "runtime" / f"{job['name']}.json"
    costs = probe["costs"]
    lag = {k: max((s[k] for s in stats if s[k] is not None), default=None)
           for k in ("accept_p50", "accept_p99", "ack_p50", "ack_p99")}  # fmt: skip
    ok = status.get("phase") == "finished" and lost == 0 and not any(s["error"] for s in stats)
    return {
        "ranks": ranks, "steps": args.steps, "root": str(root), "hosts": args.hosts, "step_time_s": args.step_time,
        "phase": status.get("phase"), "reason": status.get("reason"), "wall_s": round(time.time() - started, 1),
        "ingest_records_per_s": round(ingest), "lag_s": lag,
        "cpu_ms_per_step": None if cpu_per_step is None else round(cpu_per_step * 1000, 2),
        "loop_ms_per_step": None if loop_per_step is None else round(loop_per_step * 1000, 2),
        "ingest_ms_per_step": None if ingest_per_step is None else round(ingest_per_step * 1000, 2),
        "cpu_s_total": round(probe["cpu_s"], 2), "rss_mb": round(probe["rss"] / 2**20, 1),
        "rss_mb_max": round(max(s["rss"] for s in samples) / 2**20, 1),
        "frozen_s": frozen_s, "frozen_steps": frozen_steps, "acked_s": acked_s, "detected_step": inc.get("detected_step"),
        "produced": produced, "delivered": delivered, "dropped": dropped, "unacked_at_end": unacked, "lost": lost,
        "records_lost_supervisor": status.get("records_lost"), "records_missing": status.get("records_missing"),
        "calls": sum(s["calls"] for s in stats), "state_file_bytes": state_file.stat().st_size if state_file.exists() else None,
        "state_file": costs["state_file"], "state_dump": costs["state_dump"], "incident_store": costs["incident_store"],
        "incident_db_bytes": inc.get("db_bytes"), "incident_events": inc.get("events"),
        "errors": [s["error"] for s in stats if s["error"]], "ok": ok, "segments": segments, "samples": samples,
    }  # fmt: skip


def _segments(samples: list[dict[str, Any]], parts: int = 4) -> list[dict[str, Any]]:
    """The run in ``parts`` spans of steps: CPU per step, RSS and state-file size at each span's end
    (flat over a long run, or growing: point 4 of the scale issue)."""
    moving = [s for s in samples if s["step"] > 0]
    if len(moving) < parts + 1:
        return []
    out = []
    for i in range(parts):
        a, b = moving[len(moving) * i // parts], moving[min(len(moving) - 1, len(moving) * (i + 1) // parts)]
        steps = b["step"] - a["step"]
        out.append({"steps": f"{a['step']}-{b['step']}", "rss_mb": round(b["rss"] / 2**20, 1),
                    "state_bytes": b["state_bytes"],
                    "cpu_ms_per_step": round((b["cpu_s"] - a["cpu_s"]) * 1000 / steps, 2) if steps > 0 else None})  # fmt: skip
    return out


def _ms(cost: dict[str, Any]) -> str:
    calls = cost["calls"] or 1
    return f"{cost['calls']} writes, {cost['seconds'] * 1000 / calls:.2f} ms each (max {cost['max_s'] * 1000:.1f} ms)"


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def _print(args: argparse.Namespace, f: dict[str, Any]) -> None:
    lag = f["lag_s"]
    if args.keep:
        print(f"storage kept in {f['root']}")
    print(f"ranks {f['ranks']}  steps {f['steps']}  hosts {f['hosts']}  step time {f['step_time_s']} s  "
          f"phase {f['phase']} ({f['reason']})  wall {f['wall_s']} s")  # fmt: skip
    print(
        f"  ingest (free steps)     {f['ingest_records_per_s']:,} records/s, {f['calls']} ingest_packed calls"
    )
    print(f"  ingest lag              made->accepted p50 {_fmt(lag['accept_p50'], '.3f')} s p99 "
          f"{_fmt(lag['accept_p99'], '.3f')} s; made->durable p50 {_fmt(lag['ack_p50'], '.3f')} s p99 "
          f"{_fmt(lag['ack_p99'], '.3f')} s")  # fmt: skip
    parts = (f["cpu_ms_per_step"], f["loop_ms_per_step"], f["ingest_ms_per_step"])
    rest = None if None in parts else parts[0] - parts[1] - parts[2]  # type: ignore[operator]
    print(f"  supervisor CPU          {_fmt(f['cpu_ms_per_step'])} ms per paced step: the control loop "
          f"{_fmt(f['loop_ms_per_step'])}, the ingest calls (decode, receipts) {_fmt(f['ingest_ms_per_step'])}, "
          f"the rest (Ray's transport and threads, the bench's read-outs) {_fmt(rest)}; {f['cpu_s_total']} s in all")  # fmt: skip
    print(f"  supervisor RSS          {f['rss_mb']} MB at the end, {f['rss_mb_max']} MB max")
    print(f"  detection -> frozen     {_fmt(f['frozen_s'], '.3f')} s, {f['frozen_steps']} steps "
          f"(detected at step {f['detected_step']})")  # fmt: skip
    print(f"  rollback -> all acked   {_fmt(f['acked_s'], '.3f')} s (restore takes {args.restore_s} s)")
    print(f"  state file              {f['state_file_bytes']} bytes; {_ms(f['state_file'])}; "
          f"serialising {_ms(f['state_dump'])}")  # fmt: skip
    print(f"  incident store          {_ms(f['incident_store'])}; {f['incident_events']} events, "
          f"{f['incident_db_bytes']} bytes")  # fmt: skip
    print(f"  records                 produced {f['produced']:,}, durably accepted {f['delivered']:,}, "
          f"dropped {f['dropped']}, lost {f['lost']} (supervisor counts {f['records_lost_supervisor']} lost, "
          f"{f['records_missing']} missing)")  # fmt: skip
    for seg in f["segments"]:
        print(f"  steps {seg['steps']:>13}   CPU {_fmt(seg['cpu_ms_per_step'])} ms/step, RSS {seg['rss_mb']} MB, "
              f"state file {seg['state_bytes']} bytes")  # fmt: skip
    for e in f["errors"]:
        print(f"  emulator error: {e}")
    print(f"scale: ranks {f['ranks']}, ingest {f['ingest_records_per_s']} records/s, supervisor "
          f"{_fmt(f['cpu_ms_per_step'])} ms CPU/step, frozen in {_fmt(f['frozen_s'])} s ({f['frozen_steps']} steps), "
          f"acked in {_fmt(f['acked_s'])} s, lost {f['lost']}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

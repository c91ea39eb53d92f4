"""The supervisor's per-record path without Ray: where a step's CPU goes, phase by phase.

    python -m bench.scale.path --ranks 1024 [--steps 120] [--batch-steps K [--behind]] [--against REV [--rounds 3]]

The real ``Controller`` (detector, policy, incident store, state file) is fed the rank emulator's
records (``drills/emulator.py``: the same record per rank, numbered per link) as the emulator
sends them, one packed batch per step (``sdk/wire.py``; ``--batch-steps K``: every link's run of K
steps in one batch, as a fast run or a supervisor catching up gets them; ``--behind``: rank 0's link a
step behind the others in every batch, as real ranks' records reach a relay out of step), and after every batch
its loop runs once and writes its state, as it does once per 0.5-s step through the actor. Timed per step, in CPU
time of this one thread: ``unpack`` (the wire decode), ``queue`` (``ingest_frame``: receipts and
the inbox), ``loop`` (``Controller.iterate``: bookkeeping, analysis, metrics, the state write).
What it leaves out is Ray: the call's transport and the actor's threads (``python -m bench.scale``
measures those with it). The last line:

    path: ranks R, X ms CPU/step (unpack U, queue Q, loop L), Y records/s

``--against REV`` runs this tree and git revision REV alternately, ``--rounds`` times each, in
fresh processes, and prints the medians and their ratios.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PHASES = ("unpack", "queue", "loop")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.scale.path", description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=30, help="steps not timed (the detector's baselines form)")
    ap.add_argument(
        "--batch-steps", type=int, default=1, help="steps per packed batch (every link's run of them)"
    )
    ap.add_argument("--behind", action="store_true", help="rank 0's link a step behind in every batch")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("--against", metavar="REV", help="this tree and git revision REV, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="with --against: runs of each side")
    return ap.parse_args(argv)


class _Workers:
    """The worker group as the controller sees it: always there, never an event."""

    def __init__(self, ranks: int) -> None:
        self.world_size = ranks

    def find(self) -> bool:
        return False

    def exists_on_cluster(self) -> bool:
        return False

    def launch(self, *args: Any, **kw: Any) -> None:
        return None

    def watch(self, silent_ranks: list[int]) -> None:
        return None

    def link_acks(self) -> list[Any]:
        return []

    def rollback_target(self, max_step: int, min_mark: str) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def replay(self, step: int, suspects: list[str], numeric: bool) -> Any:
        raise RuntimeError("no replay here")

    @staticmethod
    def ray_result(ref: Any) -> None:
        return None


def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="scale-path-") as tmp:  # the run's stores go with it
        return _run(args, Path(tmp))


def _run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from supervisor.config.job import JobSpec
    from supervisor.config.runtime import RuntimeSettings
    from supervisor.drills.emulator import EmulatorConfig, EmulatorHost, _Link
    from supervisor.runtime import controller as controller_mod
    from supervisor.runtime.actor import GC_YOUNG
    from supervisor.runtime.controller import Controller
    from supervisor.sdk import wire

    unpack_frame = getattr(wire, "unpack_frame", lambda batch: None)  # as the actor decodes (REV may lack it)

    job = {
        "name": f"path-{args.ranks}", "entrypoint": "supervisor.drills.emulator:EmulatorHost",
        "max_steps": args.warmup + args.steps + 10, "resources": {"num_workers": args.ranks},
        "storage": {"path": str(root / "store")}, "policy": str(HERE / "policy.yaml"),
        "telemetry": {"min_history": 20, "window": 200, "hang_timeout_s": 300},
    }  # fmt: skip
    settings = RuntimeSettings.model_validate({"step_deadline_s": 30.0, "log_level": "warning"})
    host = EmulatorHost(job, vars(EmulatorConfig(ranks=args.ranks, checkpoint_every=0)), 0)
    host.links = [_Link(r, "bench") for r in range(args.ranks)]
    host.lr_scale, host.pending_events = 1.0, []
    ctl = Controller(JobSpec.model_validate(job), settings, workers=_Workers(args.ranks))
    ctl.boot()
    gc.freeze()  # as the supervisor actor sets its collector (runtime/actor.py)
    gc.set_threshold(GC_YOUNG, 20, 20)
    controller_mod.PERSIST_INTERVAL_S = 0.0  # one state write per step, as at 0.5-s steps
    cpu = time.thread_time
    spent: dict[str, list[float]] = {k: [] for k in PHASES}
    started = None
    k = max(1, args.batch_steps)
    for last in range(k, args.warmup + args.steps + 1, k):
        if last > args.warmup and started is None:
            started = time.perf_counter()
        for step in range(last - k + 1, last + 1):
            host.step = step
            host._produce(False)
        calls = []
        for x in host.links:
            batch = list(x.backlog)
            x.backlog.clear()
            if args.behind and x.rank == 0:  # its newest step goes out in the next batch
                x.backlog.append(batch.pop())
            calls.append(
                (x.rank, x.id, (batch[0][0], batch[-1][0]), [s for s, _ in batch], [r for _, r in batch])
            )
        batch = host.pack(calls) if hasattr(host, "pack") else wire.pack(calls)  # as the host sends it
        t0 = cpu()
        packed = unpack_frame(batch)
        groups = wire.unpack(batch) if packed is None else []
        t1 = cpu()
        ctl.ingest_groups(groups) if packed is None else ctl.ingest_frame(packed)  # as ingest_wire does
        t2 = cpu()
        ctl.iterate()
        t3 = cpu()
        if last - k >= args.warmup:
            for name, v in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                spent[name].append(v * 1000 / k)
    wall = time.perf_counter() - (started or 0.0)
    last_sent = (args.warmup + args.steps) // k * k - (1 if args.behind else 0)
    assert ctl.assembler.watermark == last_sent, "every step analysed"
    assert not ctl.state.incident_keys, "a clean run opened an incident"
    med = {k: statistics.median(v) for k, v in spent.items()}
    total = statistics.median([sum(x) for x in zip(*spent.values(), strict=True)])
    return {"ranks": args.ranks, "steps": args.steps, "batch_steps": k, "cpu_ms_per_step": total, **{f"{k}_ms": v for k, v in med.items()},
            "records_per_s_cpu": args.ranks * 1000 / total, "wall_s": wall}  # fmt: skip


def _line(f: dict[str, Any]) -> str:
    return (f"path: ranks {f['ranks']}, {f['cpu_ms_per_step']:.2f} ms CPU/step (unpack {f['unpack_ms']:.2f}, "
            f"queue {f['queue_ms']:.2f}, loop {f['loop_ms']:.2f}), {f['records_per_s_cpu']:,.0f} records/s")  # fmt: skip


def _compare(args: argparse.Namespace) -> int:
    from bench.detect_throughput import export_tree

    same = ["--ranks", str(args.ranks), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--batch-steps", str(args.batch_steps), *(["--behind"] if args.behind else [])]  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": HERE.parents[1], args.against: export_tree(args.against, Path(tmp))}
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
        for r in range(args.rounds):
            for i, (label, tree) in enumerate(trees.items()):
                out = Path(tmp) / f"run-{r}-{i}.json"
                # This file measures both sides (REV may predate it); only the package differs.
                env = {**os.environ, "PYTHONPATH": str(tree)}
                cmd = [sys.executable, str(Path(__file__).resolve()), *same, "--json", str(out)]
                done = subprocess.run(cmd, cwd=tmp, env=env, check=False, capture_output=True, text=True)
                if not out.exists():
                    print(f"{label}: no figures ({done.stderr.strip()[-400:]})", file=sys.stderr)
                    return 1
                runs[label].append(json.loads(out.read_text()))
    print(f"path against {args.against}: ranks {args.ranks}, {args.batch_steps} step(s) a batch"
          f"{', rank 0 a step behind' if args.behind else ''}, {args.rounds} "
          "alternating run(s) each (medians)")  # fmt: skip
    keys = ("cpu_ms_per_step", *(f"{k}_ms" for k in PHASES), "records_per_s_cpu")
    med = {label: {k: statistics.median(x[k] for x in rs) for k in keys} | {"ranks": args.ranks}
           for label, rs in runs.items()}  # fmt: skip
    for label, m in med.items():
        print(f"  {label:12} {_line(m)}")
    a, b = med["this tree"], med[args.against]
    print(
        f"  this tree / {args.against}: "
        + ", ".join(f"{k.removesuffix('_ms')} {a[k] / b[k]:.2f}x" for k in keys[:-1])
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.against:
        return _compare(args)
    figures = run(args)
    if args.json is not None:
        args.json.write_text(json.dumps(figures))
    print(_line(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run sampled cells through the real runtime and judge them: ``python -m bench.sampler``.

    python -m bench.sampler                          # fresh seed: 20 fault cells on 5 clean bases
    python -m bench.sampler --seed 1234 --cells 4 --clean 1
    python -m bench.sampler --cell 81234:5521        # one cell again (and its clean reference)

Each run goes through ``supervisor.client.api.launch`` on one local Ray, under the *default*
policy, with the job's ``runtime:`` knobs (as ``supervisor launch`` does), like bench/matrix: the
matrix's Ray start-up, spinning core, bytecode compile and incident read-back are reused here.
Verdicts (README.md): a fault cell passes when the job finishes (``lr_persistent``: escalates
and says why), and its final loss is at most 1.05x its clean run's; a clean cell passes when it
finishes with no incident of severity medium or higher.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.sampler.space import (
    BAD_SOURCE,
    MAX_STEPS,
    OVERFLOW_MODULE,
    WARMUP_STEPS,
    Cell,
    cell_from_id,
    draw,
    fresh_seed,
    summary_line,
)

LOSS_TOLERANCE = 0.05
FINAL_SPAN = 10
RUNTIME = {"loop_interval_s": 0.2, "poll_interval_s": 0.25}
"""job.yaml ``runtime:`` knobs any user can set, as in bench/matrix (cells.RUNTIME)."""
MICRO_BATCH = {1: 16, 2: 8, 3: 6, 4: 4}
"""Rows per micro-batch for each accumulation: 16-18 rows per rank per optimizer step."""
SERIOUS = ("medium", "high", "critical")


def job_name(cell: Cell) -> str:
    return f"sampler-{cell.base.seed}-{cell.fault.seed if cell.fault else 'clean'}"


def job_dict(cell: Cell, storage: Path) -> dict[str, Any]:
    """The job.yaml of ``cell`` as a dict (validated into a JobSpec by ``job_spec``)."""
    b, f = cell.base, cell.fault
    config: dict[str, Any] = {
        "family": b.family,
        "optimizer": b.optimizer,
        "schedule": b.schedule,
        "accumulation": b.accumulation,
        "precision": b.precision,
        "micro_batch": MICRO_BATCH[b.accumulation],
        "warmup_steps": WARMUP_STEPS,
        "seq_len": 32,
        "d_model": 32,
        "bytes_per_source": 60_000,
        "extra_source": BAD_SOURCE,
        "seed": b.seed % 1000,
    }
    faults: list[dict[str, Any]] = []
    if f is not None:
        if f.kind == "lr_cured":
            faults.append({"kind": "lr_spike", "step": f.step, "factor": f.factor})
        elif f.kind == "lr_persistent":
            config["lr_bug"] = {"step": f.step, "factor": f.factor}
        elif f.kind == "garbage_rank":
            faults.append({"kind": "garbage_batch", "step": f.step, "rank": f.rank})
        elif f.kind == "nan_rank":
            faults.append({"kind": "overflow", "step": f.step, "rank": f.rank, "steps": 1,
                           "module": OVERFLOW_MODULE[b.family]})  # fmt: skip
        elif f.kind == "bad_source":
            config["bad_source"] = {"source": BAD_SOURCE, "step": f.step}
        elif f.kind == "oversized_update":
            faults.append({"kind": "oversized_update", "step": f.step, "factor": f.factor})
        elif f.kind == "optimizer_lost":
            faults.append({"kind": "resume_without_optimizer", "step": f.step})
        elif f.kind == "recurring_shard":
            faults.append({"kind": "periodic_garbage", "step": f.step, "rank": f.rank, "period": f.period,
                           "fraction": f.fraction})  # fmt: skip
        elif f.kind == "logging_bug":
            faults.append({"kind": "logging_bug", "step": f.step, "steps": f.span, "mode": f.mode})
        elif f.kind == "logging_then_lr":
            faults.append({"kind": "logging_bug", "step": f.logged_from, "steps": b.max_steps - f.logged_from + 1,
                           "mode": f.mode})  # fmt: skip
            faults.append({"kind": "lr_spike", "step": f.step, "factor": f.factor})
        elif f.kind == "mixture_shift":
            faults.append({"kind": "mixture_shift", "step": f.step, "weights": dict(f.weights)})
        elif f.kind == "worker_kill":
            if f.corrupt_step:  # another rank's shard: the kill's own rank restarts like the others
                faults.append(
                    {"kind": "corrupt_checkpoint", "step": f.corrupt_step, "rank": (f.rank + 1) % b.ranks}
                )
            faults.append({"kind": "worker_kill", "step": f.step, "rank": f.rank})
        else:
            raise ValueError(f"unknown fault {f.kind!r}")
    return {
        "name": job_name(cell),
        "entrypoint": "bench.sampler.job:main",
        "config": config,
        "resources": {"num_workers": b.ranks, "cpus_per_worker": 1},
        "storage": {"path": str(storage)},
        "checkpoint": {"every_steps": b.checkpoint_every, "keep": 12},
        "policy": "default",
        "max_steps": b.max_steps,
        "faults": faults,
        "runtime": RUNTIME,
    }


def job_spec(cell: Cell, storage: Path) -> Any:
    from supervisor.config.job import JobSpec

    return JobSpec.model_validate(job_dict(cell, storage))


@dataclass
class Result:
    id: str
    name: str
    clean: bool
    fault: str
    command: str
    phase: str | None = None
    reason: str = ""
    final_loss: float | None = None
    """Median of the last 10 steps' token-weighted loss; `bad_source`: on the other sources."""
    final_loss_good: float | None = None
    """The same without the source `bad_source` breaks (what that cell is compared with)."""
    reference_loss: float | None = None
    incidents: list[dict[str, Any]] = field(default_factory=list)
    rank: int | None = None
    """`worker_kill`: the rank killed (the one its incident must name)."""
    corrupted: int | None = None
    """`worker_kill` after a corrupted save: that checkpoint's step (the restart must go further back)."""
    resumed_from: int | None = None
    """The step the first restore of the run resumed from (None: no restore)."""
    wall_s: float = 0.0
    error: str | None = None
    verdict: str = ""
    ok: bool = False

    @property
    def loss_ratio(self) -> float | None:
        if self.final_loss is None or not self.reference_loss:
            return None
        return self.final_loss / self.reference_loss


def final_loss(
    records: list[dict[str, Any]], world_size: int, max_steps: int, without: str | None = None
) -> float | None:
    """Median over the last ``FINAL_SPAN`` steps of the timeline that finished of the token-weighted
    loss over the ranks (``without``: that source's tokens left out). A median, so one step whose
    batch was garbage (a fault in the last 5% of the run) or was skipped as non-finite does not
    stand for the model; None unless at least 8 of those steps are there and finite."""
    last = {(int(r["step"]), int(r.get("rank", 0))): r for r in records}
    values = []
    for step in range(max_steps - FINAL_SPAN + 1, max_steps + 1):
        recs = [last.get((step, rank)) for rank in range(world_size)]
        if any(r is None for r in recs):
            continue
        loss_sum = tokens = 0.0
        for r in recs:
            assert r is not None
            if without is None:
                loss_sum += float(r.get("loss_sum") or math.nan)
                tokens += float(r.get("tokens") or 0)
                continue
            for name, part in (r.get("sources") or {}).items():
                if name != without:
                    loss_sum += float(part.get("loss_sum") or 0)
                    tokens += float(part.get("tokens") or 0)
        value = loss_sum / tokens if tokens else math.nan
        if math.isfinite(value):
            values.append(value)
    return statistics.median(values) if len(values) >= FINAL_SPAN - 2 else None


def run_cell(cell: Cell, out: Path, timeout_s: float) -> Result:
    from bench.matrix.run import _incidents, _release
    from supervisor.client import api
    from supervisor.config.runtime import settings_for
    from supervisor.drills import series

    work = (out / job_name(cell)).resolve()
    shutil.rmtree(work, ignore_errors=True)
    job = job_spec(cell, work / "storage")
    f = cell.fault
    res = Result(cell.id, cell.name, f is None, f.kind if f else "clean", cell.command(),
                 rank=f.rank if f is not None and f.kind == "worker_kill" else None,
                 corrupted=(f.corrupt_step or None) if f is not None else None)  # fmt: skip
    t0 = time.monotonic()
    handle = None
    try:
        handle = api.launch(job, settings_for(job))
        status = api.wait(handle, timeout_s=timeout_s)
        if not status.get("terminal"):
            res.error = f"not finished after {timeout_s:.0f}s (phase {status.get('phase')}, step {status.get('step')})"
            api.stop(handle, "sampler timeout")
            status = api.wait(handle, timeout_s=60)
        res.phase, res.reason = status.get("phase"), str(status.get("reason") or "")
    except Exception as exc:  # a cell that cannot run is a failed cell, not a crashed sampler
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        _release(handle)
    res.wall_s = round(time.monotonic() - t0, 1)
    ws = job.resources.num_workers
    records = series.read_trace(Path(job.storage.path), job.name, ws)
    res.final_loss_good = final_loss(records, ws, job.max_steps, without=BAD_SOURCE)
    res.final_loss = (
        res.final_loss_good if res.fault == "bad_source" else final_loss(records, ws, job.max_steps)
    )
    res.incidents = _incidents(job)
    res.resumed_from = series.first_resume(records)
    return res


def judge(res: Result, escalates: bool) -> None:
    """Set ``ok`` and a one-line ``verdict``."""
    serious = [i for i in res.incidents if i.get("severity") in SERIOUS]
    plans = sum(len(i.get("rules", [])) for i in res.incidents)
    if res.error:
        res.ok, res.verdict = False, res.error
    elif res.clean:
        res.ok = res.phase == "finished" and not serious
        res.verdict = (
            "finished, no incident >= medium"
            if res.ok
            else f"{res.phase}; {len(serious)} incident(s) >= medium: "
            + ", ".join(
                f"{i.get('severity')} {i.get('phenotype')}/{i.get('top_cause')} at {i.get('onset')}"
                for i in serious
            )
        )
    elif escalates:
        why = next((i["escalation"] for i in res.incidents if i.get("escalation")), None) or res.reason
        res.ok = res.phase == "escalated" and bool(why)
        res.verdict = f"{res.phase} after {plans} plan(s): {why or res.reason or 'no reason given'}"
    elif res.fault == "mixture_shift":  # other data: its loss is no reference
        res.ok, res.verdict = res.phase == "finished", str(res.phase)
        _judge_benign(res, serious)
    else:
        ratio = res.loss_ratio
        within = ratio is not None and ratio <= 1 + LOSS_TOLERANCE
        res.ok = res.phase == "finished" and within
        shown = f"{ratio:.3f}" if ratio is not None else "n/a"
        res.verdict = f"{res.phase}; loss {shown} x clean" + (
            "" if res.phase == "finished" else f" ({res.reason})"
        )
        if res.fault == "bad_source":
            kept_out = any(BAD_SOURCE in i.get("excluded_sources", []) for i in res.incidents)
            samples = sum(int(i.get("excluded_samples") or 0) for i in res.incidents)
            res.ok = res.ok and (kept_out or samples > 0)
            res.verdict += (
                f" on the other sources; `{BAD_SOURCE}` excluded" if kept_out
                else f" on the other sources; {samples} samples excluded" if samples
                else f" on the other sources; `{BAD_SOURCE}` never excluded"
            )  # fmt: skip
        if res.fault == "logging_bug":
            _judge_benign(res, [i for i in serious if i.get("top_cause") != "metric_artifact"])
        if res.fault == "worker_kill":
            _judge_restart(res)
        if res.fault == "logging_then_lr":  # the LR stays raised until a rollback: loss alone proves nothing
            cured = any(i.get("rollbacks") and i.get("top_cause") != "metric_artifact" for i in res.incidents)
            res.ok = res.ok and cured
            res.verdict += "; the LR fault rolled back" if cured else "; the LR fault **never rolled back**"
        if not res.ok and res.phase == "finished" and serious:
            res.verdict += "; incidents: " + ", ".join(
                f"{i.get('severity')} {i.get('phenotype')}/{i.get('top_cause')} at {i.get('onset')} [{i.get('state')}]"
                for i in serious
            )


def _judge_benign(res: Result, wrong: list[dict[str, Any]]) -> None:
    """A fault after which training is sound (``BENIGN``): on top of ``res``'s verdict so far,
    nothing was rolled back, kept out or escalated, and no incident is in ``wrong`` (those of
    severity medium or more it may not have opened)."""
    acted = [i for i in res.incidents
             if i.get("rollbacks") or i.get("excluded_sources") or i.get("excluded_samples") or i.get("escalation")]  # fmt: skip
    named = sorted({str(i.get("top_cause")) for i in res.incidents if i.get("top_cause")})
    res.ok = res.ok and not acted and not wrong
    res.verdict += (
        f"; acted on a benign fault: {', '.join('+'.join(i.get('rules') or ['-']) for i in acted)}" if acted
        else f"; {len(wrong)} incident(s) >= medium not named a metric artifact" if wrong
        else f"; nothing done (incidents: {', '.join(named) or 'none'})"
    )  # fmt: skip


def _judge_restart(res: Result) -> None:
    """A killed worker: its incident blames the distributed machinery and names that rank; after a
    corrupted save, the restart went back past it."""
    named = [
        i for i in res.incidents if i.get("top_cause") == "distributed" and i.get("first_rank") == res.rank
    ]
    past = res.corrupted is None or (res.resumed_from is not None and res.resumed_from < res.corrupted)
    res.ok = res.ok and bool(named) and past
    res.verdict += f"; rank {res.rank} " + ("named" if named else "**not named**")
    if res.corrupted is not None:
        res.verdict += f"; resumed from {res.resumed_from} (corrupted save: {res.corrupted})"


def cost(cell: Cell) -> float:
    """Relative CPU of a cell: ranks x (recoveries re-run steps) — the longest start first."""
    extra = {
        "lr_persistent": 3.0,
        "lr_cured": 2.0,
        "logging_then_lr": 2.0,
        "nan_rank": 1.5,
        "bad_source": 1.5,
        "worker_kill": 1.5,
    }
    return (
        cell.base.ranks
        * cell.base.max_steps
        / MAX_STEPS
        * extra.get(cell.fault.kind if cell.fault else "", 1.0)
    )


def run_all(
    clean: list[Cell], faulty: list[Cell], out: Path, jobs: int, timeout_s: float, busy: bool
) -> tuple[list[Result], list[Result], float | None]:
    import ray

    from bench.matrix.run import BusyCore, start_ray
    from supervisor.drills.glue import TRACE_ENV
    from supervisor.ranks.names import NAMESPACE

    os.environ[TRACE_ENV] = "1"  # before ray.init: the workers inherit it and write the loss trace
    start_ray(4 * jobs + 2, NAMESPACE)  # logical CPUs: up to 4 ranks per job, room for replay tasks
    (out / "cells.jsonl").unlink(missing_ok=True)
    spinner = BusyCore() if busy else None
    results: dict[str, Result] = {}
    try:
        if spinner:
            spinner.__enter__()
        order = sorted([*clean, *faulty], key=lambda c: -cost(c))
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_cell, c, out, timeout_s) for c in order]
            for done in as_completed(futures):
                res = done.result()
                results[res.id] = res
                with (out / "cells.jsonl").open("a", encoding="utf-8") as f:  # what finished, as it finishes
                    f.write(json.dumps(asdict(res)) + "\n")
                print(f"  {res.id} {res.name}: {res.phase} in {res.wall_s:.0f}s", file=sys.stderr, flush=True)
    finally:
        if spinner:
            spinner.__exit__()
        ray.shutdown()
    judged = judge_all(clean, faulty, results)
    return (*judged, spinner.cores if spinner else None)


def judge_all(
    clean: list[Cell], faulty: list[Cell], results: dict[str, Result]
) -> tuple[list[Result], list[Result]]:
    """Verdicts of the cells that have a result, each fault cell against its base's clean run."""
    for cell in clean:
        if cell.id in results:
            judge(results[cell.id], escalates=False)
    for cell in faulty:
        if cell.id not in results:
            continue
        res, ref = results[cell.id], results.get(str(cell.base.seed))
        if ref is not None:
            res.reference_loss = ref.final_loss_good if res.fault == "bad_source" else ref.final_loss
        judge(res, cell.escalates)
    return [results[c.id] for c in clean if c.id in results], [
        results[c.id] for c in faulty if c.id in results
    ]


def rejudge(out: Path) -> tuple[list[Result], list[Result]]:
    """The verdicts of the cells an interrupted invocation finished (``<out>/cells.jsonl``)."""
    results: dict[str, Result] = {}
    for line in (out / "cells.jsonl").read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        results[data["id"]] = Result(**data)
    cells = [cell_from_id(i) for i in results]
    # A fault cell whose clean run did not finish has no reference yet: not judged (the persistent LR
    # bug needs none).
    faulty = [c for c in cells if c.fault is not None and (c.escalates or str(c.base.seed) in results)]
    return judge_all([c for c in cells if c.fault is None], faulty, results)


def report(clean_res: list[Result], fault_res: list[Result], seed: int | str) -> int:
    """Print the table, the failing cells with their commands, and the last line; the exit code."""
    print(table([*clean_res, *fault_res]))
    failing = [r for r in [*clean_res, *fault_res] if not r.ok]
    if failing:
        print(f"\n{len(failing)} failing cell(s):")
        for r in failing:
            print(f"- seed {r.id} ({r.name}): {r.verdict}\n  {r.command}")
    passed, clean_ok = sum(r.ok for r in fault_res), sum(r.ok for r in clean_res)
    print(summary_line(passed, len(fault_res), clean_ok, len(clean_res), seed))
    return 0 if not failing else 1


def table(results: list[Result]) -> str:
    rows = ["| cell | seed | outcome | final loss | vs clean | incidents (severity phenotype: rules [state]) | wall s | ok |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        incs = "; ".join(
            f"{i.get('severity')} {i.get('phenotype')}: {'+'.join(i.get('rules') or ['-'])} [{i.get('state')}]"
            for i in r.incidents
            if "error" not in i
        )
        loss = f"{r.final_loss:.3f}" if r.final_loss is not None else "n/a"
        ratio = f"{r.loss_ratio:.3f}" if r.loss_ratio is not None else "-" if r.clean else "n/a"
        rows.append(f"| {r.name} | {r.id} | {r.verdict.replace('|', '/')} | {loss} | {ratio} | {incs or 'none'} | "
                    f"{r.wall_s:.0f} | {'yes' if r.ok else '**no**'} |")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sampler", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=None, help="Invocation seed (default: a fresh one).")
    ap.add_argument("--cells", type=int, default=20, help="Fault cells (default 20).")
    ap.add_argument(
        "--clean", type=int, default=5, help="Clean cells: the bases the fault cells run on (default 5)."
    )
    ap.add_argument(
        "--busy", action="store_true", help="Keep one core busy (another process spinning) throughout."
    )
    ap.add_argument("--cell", action="append", default=[], metavar="BASE[:FAULT]",
                    help="Run this cell (and its clean base) instead of drawing; repeatable.")  # fmt: skip
    ap.add_argument("--jobs", type=int, default=3, help="Jobs at once (each 2-4 ranks and a supervisor).")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="Per cell.")
    ap.add_argument("--out", type=Path, default=Path("runs/sampler"))
    ap.add_argument("--dry-run", action="store_true", help="Print the drawn cells and exit.")
    ap.add_argument("--rejudge", type=Path, default=None, metavar="OUT",
                    help="Judge the cells an interrupted invocation finished (OUT/cells.jsonl) and exit.")  # fmt: skip
    args = ap.parse_args(argv)
    if args.rejudge is not None:
        if not (args.rejudge / "cells.jsonl").is_file():
            print(f"error: --rejudge: no {args.rejudge / 'cells.jsonl'}", file=sys.stderr)
            return 2
        seed_file = args.rejudge / "seed"
        return report(
            *rejudge(args.rejudge), seed_file.read_text().strip() if seed_file.is_file() else "unknown"
        )
    load = "busy" if args.busy else "idle"
    try:
        if args.cell:
            picked = [cell_from_id(c, load) for c in args.cell]
            seed: int | str = ",".join(c.id for c in picked)
            bases = {c.base.seed: Cell(c.base, None, load) for c in picked}
            clean, faulty = list(bases.values()), [c for c in picked if c.fault is not None]
        else:
            if args.cells < 0 or args.clean < 0:
                raise ValueError("--cells and --clean must be >= 0")
            seed = args.seed if args.seed is not None else fresh_seed()
            clean, faulty = draw(int(seed), args.cells, args.clean, load)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"sampler: seed {seed}, {len(faulty)} fault cells on {len(clean)} clean cells, load {load}")
    for c in [*clean, *faulty]:
        print(f"  {c.id:>14}  {c.name}")
    if args.dry_run:
        print(summary_line(0, len(faulty), 0, len(clean), seed))
        return 0
    from bench.matrix.run import write_bytecode

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "seed").write_text(f"{seed}\n", encoding="utf-8")
    t0 = time.monotonic()
    write_bytecode()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    clean_res, fault_res, spinner_cores = run_all(
        clean, faulty, args.out, max(1, args.jobs), args.timeout_s, args.busy
    )
    wall = time.monotonic() - t0
    meta = {"started": started, "seed": seed, "wall_s": round(wall), "cores": os.cpu_count(), "load": load,
            "loadavg_before": [round(x, 1) for x in load_before],
            "loadavg_after": [round(x, 1) for x in os.getloadavg()], "jobs": args.jobs,
            "spinner_cores": spinner_cores}  # fmt: skip
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "cells": [c.to_dict() for c in [*clean, *faulty]],
                    "results": [asdict(r) for r in [*clean_res, *fault_res]]}, indent=1),
        encoding="utf-8",
    )  # fmt: skip
    print(
        f"sampler {started}: {len(clean_res) + len(fault_res)} runs in {wall / 60:.1f} min on {meta['cores']} cores, "
        f"load average before {meta['loadavg_before'][0]}, after {meta['loadavg_after'][0]}"
        + (f"; the spinning process took {spinner_cores} cores" if spinner_cores else "")
    )
    return report(clean_res, fault_res, seed)


if __name__ == "__main__":
    raise SystemExit(main())

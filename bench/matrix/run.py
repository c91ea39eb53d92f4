"""Run the scenario matrix through the real runtime and print the table.

    python -m bench.matrix                          # everything: 3 families x 2 optimizers x 6 faults x idle/busy
    python -m bench.matrix --families gru --faults clean,lr_cured --loads idle --jobs 2

1. One local Ray for the whole matrix; ``--jobs`` jobs run at once (each has 2 workers).
2. ``busy`` cells run while another process (started here, killed by its PID afterwards)
   keeps one core busy; ``idle`` cells run without it.
3. Each cell: ``client.api.launch`` of its job under the *default* policy, wait for a
   terminal phase, then read back what the system recorded: the job's phase and reason, the
   incident store (incidents, severities, plans, escalations), and the loss curve of the
   records every rank sent (drills' trace, ``SUPERVISOR_DRILL_TRACE``).
4. Verdicts: clean runs finish with no incident of severity >= medium; the persistent LR bug
   escalates (with its reason); every other cell finishes with a final loss within 5% of
   the clean run of the same family, optimizer and load.

Results go to ``<out>/results.json`` and the table to stdout (Markdown with ``--markdown``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.matrix.cells import BAD_SOURCE, FAMILIES, FAULTS, LOADS, MAX_STEPS, OPTIMIZERS, Cell, cells

LOSS_TOLERANCE = 0.05
#: Ray system settings for the matrix's local Ray (environment variables, before ``ray.init``).
RAY_QUIET = {"RAY_enable_metrics_collection": "0", "RAY_task_events_report_interval_ms": "0"}


@dataclass
class Result:
    cell: str
    family: str
    optimizer: str
    fault: str
    load: str
    phase: str | None = None
    reason: str = ""
    final_loss: float | None = None
    """Mean loss of the last 10 steps; in the `bad_source` cell, on the other sources only."""
    reference_loss: float | None = None
    final_loss_good: float | None = None
    """The same without the source that turns bad in `bad_source` (what that cell is compared with)."""
    incidents: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0
    error: str | None = None
    verdict: str = ""
    ok: bool = False

    @property
    def loss_ratio(self) -> float | None:
        if self.final_loss is None or not self.reference_loss:
            return None
        return self.final_loss / self.reference_loss


def run_cell(cell: Cell, out: Path, max_steps: int, timeout_s: float) -> Result:
    from supervisor.client import api
    from supervisor.config.runtime import settings_for

    work = (out / cell.name).resolve()
    shutil.rmtree(work, ignore_errors=True)
    job = cell.job(work / "storage", max_steps)
    res = Result(cell.name, cell.family, cell.optimizer, cell.fault, cell.load)
    t0 = time.monotonic()
    handle = None
    try:
        handle = api.launch(job, settings_for(job))  # as `supervisor launch` does: job.yaml's `runtime:`
        status = api.wait(handle, timeout_s=timeout_s)
        if not status.get("terminal"):
            res.error = f"not finished after {timeout_s:.0f}s (phase {status.get('phase')}, step {status.get('step')})"
            api.stop(handle, "matrix timeout")
            status = api.wait(handle, timeout_s=60)
        res.phase, res.reason = status.get("phase"), str(status.get("reason") or "")
    except Exception as exc:  # a cell that cannot run is a failed cell, not a crashed matrix
        res.error = f"{type(exc).__name__}: {exc}"
    finally:
        _release(handle)
    res.wall_s = round(time.monotonic() - t0, 1)
    res.final_loss_good = _final_loss(job, without=BAD_SOURCE)
    res.final_loss = res.final_loss_good if cell.fault == "bad_source" else _final_loss(job)
    res.incidents = _incidents(job)
    return res


def _release(handle: Any) -> None:
    if handle is None:
        return
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # already gone: nothing to release
        return


def _final_loss(job: Any, without: str | None = None) -> float | None:
    """Loss of the last 10 steps of the timeline that finished, token-weighted over the ranks;
    ``without``: leaving that source's tokens out (the records' per-source split), token-weighted
    over the 10 steps (a rank's batch may hold no other source at some step)."""
    from supervisor.drills import series

    ws = job.resources.num_workers
    records = series.read_trace(Path(job.storage.path), job.name, ws)
    if without is None:
        return series.final_loss(series.step_losses(records, ws, "last"), job.max_steps)
    last = {(int(r["step"]), int(r.get("rank", 0))): r for r in records}  # the timeline that finished
    window = range(job.max_steps - 9, job.max_steps + 1)
    if any((step, rank) not in last for step in window for rank in range(ws)):
        return None
    parts = [
        part
        for step in window
        for rank in range(ws)
        for name, part in (last[(step, rank)].get("sources") or {}).items()
        if name != without
    ]
    tokens = sum(float(p.get("tokens") or 0) for p in parts)
    return sum(float(p.get("loss_sum") or 0) for p in parts) / tokens if tokens else None


def _incidents(job: Any) -> list[dict[str, Any]]:
    from supervisor.incidents.paths import open_for_job

    out = []
    try:
        with open_for_job(job) as store:
            for inc in reversed(store.list_incidents(job=job.name)):
                plans = [a for a in store.artifacts(inc.id) if a.kind == "plan"]
                made = [a.meta.get("plan") or {} for a in plans]
                rules = [p.get("rule") for p in made]
                escalation = next(
                    (p["escalate_reason"] for p in reversed(made) if p.get("escalate_reason")), None
                )
                excludes = [
                    (a.get("params") or {}).get("exclude") or {}
                    for p in made
                    for a in p.get("actions", [])
                    if a.get("name") == "apply"
                ]
                out.append(
                    {
                        "id": inc.id,
                        "state": inc.state.value,
                        "severity": inc.severity,
                        "phenotype": inc.phenotype,
                        "top_cause": inc.top_cause,
                        "onset": inc.onset_step,
                        "rules": [r or "fallback" for r in rules],
                        "escalation": escalation,
                        "excluded_sources": sorted({s for e in excludes for s in e.get("sources") or []}),
                        "excluded_samples": sum(len(e.get("samples") or []) for e in excludes),
                        "rollbacks": sum(
                            any(a.get("name") == "rollback" for a in p.get("actions", [])) for p in made
                        ),
                        "first_rank": diagnosis.first_rank if (diagnosis := inc.diagnosis) else None,
                    }
                )
    except Exception as exc:  # no store (the job never started): reported as no incidents, with why
        out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


def judge(res: Result) -> None:
    """Set ``ok`` and a one-line ``verdict`` from the matrix's criteria."""
    fault = FAULTS[res.fault]
    serious = [i for i in res.incidents if i.get("severity") in ("medium", "high", "critical")]
    if res.error:
        res.ok, res.verdict = False, res.error
    elif fault.name == "clean":
        res.ok = res.phase == "finished" and not serious
        res.verdict = "finished" if res.ok else f"{res.phase}; {len(serious)} incident(s) >= medium"
    elif fault.escalates:
        attempts = sum(len(i.get("rules", [])) for i in res.incidents)
        why = next((i["escalation"] for i in res.incidents if i.get("escalation")), None) or res.reason
        res.ok = res.phase == "escalated" and bool(why)
        res.verdict = f"{res.phase} after {attempts} plan(s): {why}"
    else:
        ratio = res.loss_ratio
        within = ratio is not None and abs(ratio - 1) <= LOSS_TOLERANCE
        if fault.name == "bad_source" and ratio is not None:
            # Judged on the other sources, which get every step once the bad one is kept out:
            # a lower loss there is the expected effect of the fix, only a higher one is harm.
            within = ratio <= 1 + LOSS_TOLERANCE
        res.ok = res.phase == "finished" and within
        shown = f"{ratio:.3f}" if ratio is not None else "n/a"
        res.verdict = f"{res.phase}; loss {shown} x clean" + (
            "" if res.phase == "finished" else f" ({res.reason})"
        )
        if fault.name == "bad_source":
            # Finishing near the clean loss is not enough: the supervisor must have seen the
            # source and kept it (or its samples) out.
            kept_out = [i for i in res.incidents if BAD_SOURCE in i.get("excluded_sources", [])]
            some = [i for i in res.incidents if i.get("excluded_samples")]
            res.ok = res.ok and bool(kept_out or some)
            res.verdict += (
                f" on the other sources; source `{BAD_SOURCE}` excluded"
                if kept_out
                else f" on the other sources; {sum(i['excluded_samples'] for i in some)} samples excluded"
                if some
                else f" on the other sources; **`{BAD_SOURCE}` never excluded** ({len(res.incidents)} incident(s))"
            )


class BusyCore:
    """Another process spinning on one core, started and killed by its PID. It runs at the
    matrix's own priority, as the ranks do (`runtime.niceness` 0): ``cores`` says how much CPU it
    actually took while the cells ran (1.0: a whole core)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.cores: float | None = None

    #: Spins while its parent (the PID given, so a parent gone before it started counts) lives: a
    #: bench killed before ``__exit__`` must not leave a core busy under whatever runs next. One
    #: parent check per ~100k iterations.
    SPIN = "import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n    for _ in range(100_000):\n        pass\n"

    def __enter__(self) -> BusyCore:
        self.proc = subprocess.Popen([sys.executable, "-c", self.SPIN, str(os.getpid())])
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError, ValueError, IndexError):  # gone already: no figure
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu_s = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
            self.cores = round(cpu_s / max(time.monotonic() - self.started, 1e-9), 2)
        self.proc.kill()  # by PID: only the process started here
        self.proc.wait(timeout=10)


def start_ray(num_cpus: int, namespace: str) -> None:
    """A fresh local Ray. Retried: on a loaded host the raylet gives up when its dashboard agent
    takes more than a hard-coded 15 s to start (ray-project/ray#65983), and a retry succeeds."""
    import ray
    from tenacity import retry, stop_after_attempt, wait_fixed

    # On a loaded host the raylet registers with the GCS late; Ray's own hint is to wait longer.
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "180")
    # Ray's metrics export and per-task event reports feed the dashboard and the state API, which
    # the matrix does not use; every Ray process pays for them every few seconds (each setting is
    # Ray's own and can be set the same way for any run).
    for name, value in RAY_QUIET.items():
        os.environ.setdefault(name, value)

    @retry(stop=stop_after_attempt(4), wait=wait_fixed(5), reraise=True)
    def init() -> None:
        before = _children()
        try:
            ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                namespace=namespace,
            )
        except Exception:
            # A node that timed out leaves its GCS (and maybe a raylet) running, and ray.shutdown()
            # does not know them: end the processes this attempt started, by PID, before the next.
            for pid in _children() - before:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise

    init()


def _children() -> set[int]:
    """PIDs of this process's children (Linux /proc)."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):  # gone meanwhile, or not readable
            continue
        if ppid == me:
            out.add(int(entry.name))
    return out


def run_matrix(
    selected: list[Cell], out: Path, jobs: int, max_steps: int, timeout_s: float
) -> tuple[list[Result], float | None]:
    """The cells' results, and the cores the spinning process took during the busy cells."""
    import ray

    from supervisor.drills.glue import TRACE_ENV
    from supervisor.ranks.names import NAMESPACE

    os.environ[TRACE_ENV] = "1"  # before ray.init: the workers inherit it and write the loss trace
    start_ray(2 * jobs + 2, NAMESPACE)  # logical CPUs: 2 workers per job, room for replay tasks
    results: dict[str, Result] = {}
    spinner_cores = None
    try:
        for load in LOADS:
            batch = [c for c in selected if c.load == load]
            if not batch:
                continue
            busy = BusyCore() if load == "busy" else None
            if busy:
                busy.__enter__()
            # Longest cells first (recoveries re-run steps): the jobs still running at the end of
            # the batch are short ones, so the cores stay busy until the load changes.
            batch.sort(key=lambda c: -FAULTS[c.fault].cost)
            try:
                with ThreadPoolExecutor(max_workers=jobs) as pool:
                    futures = [pool.submit(run_cell, c, out, max_steps, timeout_s) for c in batch]
                    for done in as_completed(futures):
                        res = done.result()
                        results[res.cell] = res
                        print(f"  {res.cell}: {res.phase} in {res.wall_s:.0f}s", file=sys.stderr, flush=True)
            finally:
                if busy:
                    busy.__exit__()
                    spinner_cores = busy.cores
    finally:
        ray.shutdown()
    for res in results.values():
        ref = results.get(Cell(res.family, res.optimizer, "clean", res.load).name)
        if ref is not None:
            res.reference_loss = ref.final_loss_good if res.fault == "bad_source" else ref.final_loss
        judge(res)
    return [results[c.name] for c in selected if c.name in results], spinner_cores


def table(results: list[Result]) -> str:
    head = "| cell | outcome | final loss | vs clean | incidents (severity: rules) | wall s | ok |"
    rows = [head, "|---|---|---|---|---|---|---|"]
    for r in results:
        incs = "; ".join(
            f"{i.get('severity')}/{i.get('phenotype')}: {'+'.join(i.get('rules') or ['-'])} [{i.get('state')}]"
            for i in r.incidents
            if "error" not in i
        )
        loss = f"{r.final_loss:.3f}" if r.final_loss is not None else "n/a"
        ratio = f"{r.loss_ratio:.3f}" if r.loss_ratio is not None else "n/a"
        rows.append(
            f"| {r.cell} | {r.verdict.replace('|', '/')} | {loss} | {ratio} | {incs or 'none'} | {r.wall_s:.0f} | "
            f"{'yes' if r.ok else '**no**'} |"
        )
    passed = sum(r.ok for r in results)
    rows.append(f"\n{passed}/{len(results)} cells pass.")
    return "\n".join(rows)


def write_bytecode() -> None:
    """Compile the supervisor's, the examples' and the benches' sources once, here: where
    PYTHONDONTWRITEBYTECODE is set (as on CI machines) or the checkout is an editable install,
    each of the matrix's ~250 processes (ranks, supervisors, replay tasks) would otherwise compile
    what it imports again (~0.4 CPU-s per rank). Up-to-date files are left alone."""
    import compileall

    import supervisor

    root = Path(__file__).resolve().parents[2]
    for tree in (Path(supervisor.__file__).parent, root / "examples", root / "bench"):
        if tree.is_dir():
            compileall.compile_dir(str(tree), quiet=2, workers=0)


def _csv(value: str, valid: tuple[str, ...], what: str) -> tuple[str, ...]:
    items = tuple(v for v in value.split(",") if v)
    bad = [v for v in items if v not in valid]
    if bad:
        raise SystemExit(f"error: --{what}: unknown {', '.join(bad)} (valid: {', '.join(valid)})")
    return items


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.matrix", description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--loads", default=",".join(LOADS))
    ap.add_argument(
        "--jobs",
        type=int,
        default=4,
        help="Jobs running at once (each has 2 workers and a supervisor): 4 keep 2 cores busy; more only "
        "stretch every job's wall time, and Ray's and the supervisor's polling grow with it.",
    )
    ap.add_argument("--max-steps", type=int, default=MAX_STEPS, help="Steps per run; the fault at half.")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="Per cell.")
    ap.add_argument("--out", type=Path, default=Path("runs/matrix"))
    ap.add_argument("--markdown", action="store_true", help="Print the table as Markdown only.")
    args = ap.parse_args(argv)
    selected = cells(
        _csv(args.families, FAMILIES, "families"),
        _csv(args.optimizers, OPTIMIZERS, "optimizers"),
        _csv(args.faults, tuple(FAULTS), "faults"),
        _csv(args.loads, LOADS, "loads"),
    )
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    write_bytecode()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()
    results, spinner_cores = run_matrix(selected, args.out, max(1, args.jobs), args.max_steps, args.timeout_s)
    wall = time.monotonic() - t0
    meta = {
        "started": started,
        "wall_s": round(wall),
        "cores": os.cpu_count(),
        "loadavg_before": [round(x, 1) for x in load_before],
        "loadavg_after": [round(x, 1) for x in os.getloadavg()],
        "jobs": args.jobs,
        "max_steps": args.max_steps,
        "spinner_cores": spinner_cores,
    }
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1), encoding="utf-8"
    )
    print(
        f"matrix {started}: {len(results)} cells in {wall / 60:.1f} min on {meta['cores']} cores, "
        f"load average before {meta['loadavg_before'][0]}, after {meta['loadavg_after'][0]}"
        + (
            f"; the spinning process took {spinner_cores} cores during the busy cells"
            if spinner_cores
            else ""
        )
    )
    print(table(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())

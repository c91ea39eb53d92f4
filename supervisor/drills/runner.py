"""Run drill scenarios under the supervisor on one local Ray, then check each against its expectations.

    results = run_drills(find_scenarios(["all"]), out_dir=Path("runs/drills"))

1. Every worker of the session appends the records it sends to a trace (``glue.TRACE_ENV``,
   set before Ray starts so the workers inherit it).
2. The clean reference: the final loss of the fault-free scenario, cached per config hash
   under ``<out>/reference/`` (run once, first, when a selected drill needs it).
3. Each scenario: fresh storage under ``<out>/<name>/``, ``client.api.launch``, wait for a
   terminal phase (bounded by the scenario's ``timeout_s``), then the checks.

``concurrency`` runs that many scenarios at once on the same Ray (each its own job name,
storage and fault markers; the references start first, and a drill's checks wait for the
reference loss they compare against). A tinylm drill leaves part of a 2-core machine idle (Ray
starting actors, checkpoint verification, the supervisor's polls), which a second drill fills;
the kill drills poll and kill their own job's actors only.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.drills import series
from supervisor.drills.check import Check, Checker, RunOutcome
from supervisor.drills.glue import TRACE_ENV
from supervisor.drills.scenario import LoadedScenario, find_scenarios
from supervisor.logging import get_logger

log = get_logger("drills")
REFERENCE = "clean"


@dataclass
class DrillResult:
    name: str
    description: str
    checks: list[Check]
    wall_s: float
    phase: str | None
    reports: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.ok is not False for c in self.checks)

    @property
    def failed_checks(self) -> list[Check]:
        return [c for c in self.checks if c.ok is False]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "passed": self.passed,
            "wall_s": round(self.wall_s, 1),
            "phase": self.phase,
            "error": self.error,
            "reports": self.reports,
            "checks": [{"name": c.name, "ok": c.ok, "detail": c.detail} for c in self.checks],
        }


def run_drills(
    scenarios: list[LoadedScenario],
    *,
    out_dir: Path,
    on_result: Callable[[DrillResult], None] | None = None,
    num_cpus: int | None = None,
    concurrency: int = 1,
) -> list[DrillResult]:
    """Run ``scenarios`` on one local Ray session, ``concurrency`` at a time; one result per scenario,
    in the order given. ``num_cpus`` (logical) defaults to what that many jobs ask for, at least 4."""
    import ray

    previous = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = "1"  # before ray.init: the workers inherit the driver's environment
    started = not ray.is_initialized()
    if not started and previous is None:
        log.warning(
            "trace_may_be_missing", why=f"Ray was started before {TRACE_ENV} was set: loss checks may fail"
        )
    if started:
        from supervisor.ranks.names import NAMESPACE

        _start_ray(num_cpus or _cpus_for(scenarios, concurrency), NAMESPACE)
    try:
        return _Batch(scenarios, out_dir, on_result, max(1, concurrency)).run()
    finally:
        if started:
            ray.shutdown()
        if previous is None:
            os.environ.pop(TRACE_ENV, None)


def _start_ray(num_cpus: int, namespace: str) -> None:
    """A fresh local Ray of the drills' own (``address="local"``: never the head the last
    ``ray start`` on this machine wrote down, which Ray's default would join and where
    ``num_cpus`` is refused); started again (up to 3 times) when its raylet misses Ray's fixed
    30 s registration deadline, as it can on a saturated 2-core machine."""
    import ray
    from tenacity import retry, retry_if_exception, stop_after_attempt

    def slow_start(exc: BaseException) -> bool:
        if "timed out during startup" not in str(exc):
            return False
        log.warning("ray_start_retry", why=str(exc)[:200])
        ray.shutdown()
        return True

    @retry(retry=retry_if_exception(slow_start), stop=stop_after_attempt(3), reraise=True)
    def start() -> None:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,
            namespace=namespace,
        )

    start()


def _cpus_for(scenarios: list[LoadedScenario], concurrency: int) -> int:
    """Logical CPUs for ``concurrency`` of the largest selected jobs, each with what a job's own local
    Ray gets (``cluster.needed_cpus``: its workers plus room for a replay task, which needs a CPU
    while the workers hold theirs)."""
    from supervisor.client.cluster import needed_cpus

    largest = max((needed_cpus(s.job_spec(Path("."))) for s in scenarios), default=4)
    return largest * concurrency


class _Batch:
    """The scenarios of one ``run_drills`` call, run ``concurrency`` at a time.

    1. Each training-config hash that a selected drill compares its final loss against gets a
       reference: cached under ``<out>/reference/``, or a clean run submitted first.
    2. Every other scenario is submitted in the order given; a finished run is checked once its
       reference loss is known (the reference's own future), so a slow reference never blocks a
       pool slot.
    """

    def __init__(
        self,
        scenarios: list[LoadedScenario],
        out_dir: Path,
        on_result: Callable[[DrillResult], None] | None,
        concurrency: int,
    ) -> None:
        self.scenarios, self.out_dir, self.on_result = scenarios, out_dir, on_result
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="drill")
        self.report_lock = threading.Lock()
        self.losses: dict[str, Future[float | None]] = {}

    def run(self) -> list[DrillResult]:
        try:
            ran = self._submit_references()
            futures = {
                sc.name: ran.get(sc.name) or self.pool.submit(self._run_and_check, sc)
                for sc in self.scenarios
            }
            results = [futures[sc.name].result() for sc in self.scenarios]
        except BaseException:
            # Ctrl-C (or a bug): start nothing more and do not wait for the runs in flight; the
            # caller's ray.shutdown() ends them, and their threads return on the lost actors.
            self.pool.shutdown(wait=False, cancel_futures=True)
            raise
        self.pool.shutdown()
        return results

    def _submit_references(self) -> dict[str, Future[DrillResult]]:
        selected = {s.name: s for s in self.scenarios}
        clean = selected.get(REFERENCE) or next(iter(find_scenarios([REFERENCE])), None)
        ran: dict[str, Future[DrillResult]] = {}
        for sc in self.scenarios:
            h = sc.config_hash()
            if sc.expect.final_loss_tolerance is None or h in self.losses:
                continue
            cache = self.out_dir / "reference" / f"{h}.json"
            if cache.exists():
                done: Future[float | None] = Future()
                self.losses[h] = done
                done.set_result(json.loads(cache.read_text())["final_loss"])
                continue
            base = (
                clean
                if clean is not None and clean.config_hash() == h
                else sc.without_faults(f"reference_{h[:8]}")
            )
            loss: Future[float | None] = Future()
            self.losses[h] = loss
            future = self.pool.submit(self._reference, base, h, loss)
            if base.name in selected:
                ran[base.name] = future
        return ran

    def _reference(self, base: LoadedScenario, h: str, loss: Future[float | None]) -> DrillResult:
        try:
            result = run_one(base, self.out_dir, None)
            value = _final_loss(base, self.out_dir)
        except BaseException:
            loss.set_result(None)  # the drills that wait for it fail their loss check, not hang
            raise
        loss.set_result(value)
        if value is not None and result.passed:
            cache = self.out_dir / "reference" / f"{h}.json"
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"final_loss": value, "scenario": base.name, "config_hash": h}))
        self._report(result)
        return result

    def _run_and_check(self, sc: LoadedScenario) -> DrillResult:
        reference = self.losses.get(sc.config_hash())
        result = run_one(sc, self.out_dir, reference_loss=reference.result if reference else None)
        self._report(result)
        return result

    def _report(self, result: DrillResult) -> None:
        if self.on_result:
            with self.report_lock:  # one progress line at a time
                self.on_result(result)


def run_one(
    sc: LoadedScenario,
    out_dir: Path,
    reference_loss: float | None | Callable[[], float | None],
) -> DrillResult:
    """Run one scenario and check it; ``reference_loss`` may be a callable, asked once the run ended."""
    from supervisor.client import api
    from supervisor.incidents.paths import open_for_job

    work = (out_dir / sc.name).resolve()
    shutil.rmtree(work, ignore_errors=True)
    job = sc.job_spec(work / "storage")
    bound = log.bind(drill=sc.name, job=job.name)
    bound.info("drill_started", faults=[f.kind for f in sc.faults])
    t0 = time.monotonic()
    status: dict[str, Any] = {}
    error = None
    handle = None
    killed = None
    try:
        kill = sc.scenario.kill
        # A kill drill runs the supervisor as in production: with --detach it is restarted by Ray;
        # in the foreground a new supervisor attaches after the kill.
        handle = api.launch(job, detached=kill is not None and kill.mode == "detach")
        if kill is not None:
            from supervisor.drills.kill import kill_at, wait_through_restarts

            killed, handle = kill_at(handle, job, kill, sc.scenario.timeout_s)
            status = wait_through_restarts(handle, sc.scenario.timeout_s)
        else:
            status = api.wait(handle, timeout_s=sc.scenario.timeout_s)
        if not status.get("terminal"):
            error = f"not finished after {sc.scenario.timeout_s:.0f}s (phase {status.get('phase')})"
            api.stop(handle, "drill timeout")
            status = api.wait(handle, timeout_s=60)
    except Exception as exc:  # a drill that cannot run is a failed drill, not a crashed suite
        error = f"{type(exc).__name__}: {exc}"
    finally:
        _release(handle)
    wall = time.monotonic() - t0
    reference = reference_loss() if callable(reference_loss) else reference_loss
    outcome = RunOutcome(sc, job, status, wall, work, reference, error, killed=killed)
    with open_for_job(job) as store:
        checks = Checker(outcome, store).checks()
    res = DrillResult(sc.name, sc.scenario.description, checks, wall, status.get("phase"),
                      [str(p) for p in outcome.reports], error)  # fmt: skip
    (work / "result.json").write_text(json.dumps(res.to_json(), indent=1), encoding="utf-8")
    bound.info(
        "drill_finished", passed=res.passed, wall_s=round(wall, 1), failed=[c.name for c in res.failed_checks]
    )
    return res


def _release(handle: Any) -> None:
    if handle is None:
        return
    import ray

    try:
        ray.kill(handle, no_restart=True)
    except Exception as exc:  # already gone: nothing to release
        log.debug("release_skipped", error=repr(exc))


def _final_loss(sc: LoadedScenario, out_dir: Path) -> float | None:
    job = sc.job_spec((out_dir / sc.name / "storage").resolve())
    ws = job.resources.num_workers
    records = series.read_trace(Path(job.storage.path), job.name, ws)
    return series.final_loss(series.step_losses(records, ws, "last"), job.max_steps)

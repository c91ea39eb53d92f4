"""Run drill scenarios under the supervisor on one local Ray, then check each against its expectations.

    results = run_drills(find_scenarios(["all"]), out_dir=Path("runs/drills"))

1. Every worker of the session appends the records it sends to a trace (``glue.TRACE_ENV``,
   set before Ray starts so the workers inherit it).
2. The clean reference: the final loss of the fault-free scenario, cached per config hash
   under ``<out>/reference/`` (run once, first, when a selected drill needs it).
3. Each scenario: fresh storage under ``<out>/<name>/``, ``runtime.api.launch``, wait for a
   terminal phase (bounded by the scenario's ``timeout_s``), then the checks.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
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
    num_cpus: int = 4,
) -> list[DrillResult]:
    """Run ``scenarios`` in order on one local Ray session; returns one result per scenario."""
    import ray

    previous = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = "1"  # before ray.init: the workers inherit the driver's environment
    started = not ray.is_initialized()
    if not started and previous is None:
        log.warning(
            "trace_may_be_missing", why=f"Ray was started before {TRACE_ENV} was set: loss checks may fail"
        )
    if started:
        from supervisor.runtime.names import NAMESPACE

        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    try:
        losses, ran = _references(scenarios, out_dir, on_result)
        results = []
        for sc in scenarios:
            if sc.name in ran:
                results.append(ran[sc.name])
                continue
            res = run_one(sc, out_dir, losses.get(sc.config_hash()))
            results.append(res)
            if on_result:
                on_result(res)
        return results
    finally:
        if started:
            ray.shutdown()
        if previous is None:
            os.environ.pop(TRACE_ENV, None)


def run_one(sc: LoadedScenario, out_dir: Path, reference_loss: float | None) -> DrillResult:
    from supervisor.incidents.paths import open_for_job
    from supervisor.runtime import api

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
        # A kill drill runs the supervisor as in production with --detach: restarted by Ray.
        handle = api.launch(job, detached=kill is not None)
        if kill is not None:
            from supervisor.drills.kill import kill_at, wait_through_restarts

            killed = kill_at(handle, job.name, kill, sc.scenario.timeout_s)
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
    outcome = RunOutcome(sc, job, status, wall, work, reference_loss, error, killed=killed)
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


def _references(
    scenarios: list[LoadedScenario], out_dir: Path, on_result: Callable[[DrillResult], None] | None
) -> tuple[dict[str, float | None], dict[str, DrillResult]]:
    """The clean final loss per training-config hash (cached), and the clean runs made for it now.

    A hash is served by the ``clean`` scenario when it matches, else by the scenario itself
    with its faults removed (``reference_<hash>``).
    """
    selected = {s.name: s for s in scenarios}
    clean = selected.get(REFERENCE) or next(iter(find_scenarios([REFERENCE])), None)
    losses: dict[str, float | None] = {}
    ran: dict[str, DrillResult] = {}
    for sc in scenarios:
        h = sc.config_hash()
        if sc.expect.final_loss_tolerance is None or h in losses:
            continue
        cache = out_dir / "reference" / f"{h}.json"
        if cache.exists():
            losses[h] = json.loads(cache.read_text())["final_loss"]
            continue
        base = (
            clean
            if clean is not None and clean.config_hash() == h
            else sc.without_faults(f"reference_{h[:8]}")
        )
        result = run_one(base, out_dir, None)
        if base.name in selected:
            ran[base.name] = result
        if on_result:
            on_result(result)
        losses[h] = loss = _final_loss(base, out_dir)
        if loss is not None and result.passed:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps({"final_loss": loss, "scenario": base.name, "config_hash": h}))
    return losses, ran


def _final_loss(sc: LoadedScenario, out_dir: Path) -> float | None:
    job = sc.job_spec((out_dir / sc.name / "storage").resolve())
    ws = job.resources.num_workers
    records = series.read_trace(Path(job.storage.path), job.name, ws)
    return series.final_loss(series.step_losses(records, ws, "last"), job.max_steps)

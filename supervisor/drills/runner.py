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

    os.environ[TRACE_ENV] = "1"  # before ray.init: the workers inherit the driver's environment
    started = not ray.is_initialized()
    if started:
        from supervisor.runtime.names import NAMESPACE

        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    try:
        reference = _reference(scenarios, out_dir, on_result)
        results = []
        for sc in scenarios:
            if sc.name == REFERENCE and reference.get("ran") is sc:
                results.append(reference["result"])
                continue
            res = run_one(sc, out_dir, reference.get("loss"))
            results.append(res)
            if on_result:
                on_result(res)
        return results
    finally:
        if started:
            ray.shutdown()


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
    try:
        handle = api.launch(job)
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
    outcome = RunOutcome(sc, job, status, wall, work, reference_loss, error)
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


def _reference(
    scenarios: list[LoadedScenario], out_dir: Path, on_result: Callable[[DrillResult], None] | None
) -> dict[str, Any]:
    """The clean run's final loss per config hash: from the cache, else by running `clean` now."""
    needed = [s for s in scenarios if s.expect.final_loss_tolerance is not None]
    selected = {s.name: s for s in scenarios}
    if not needed and REFERENCE not in selected:
        return {}
    hashes = {s.config_hash() for s in needed}
    clean = selected.get(REFERENCE) or next(iter(find_scenarios([REFERENCE])), None)
    if clean is None:
        return {}
    if len(hashes) > 1 or (hashes and clean.config_hash() not in hashes):
        log.warning("reference_mismatch", why="drills differ in training config from the clean scenario")
    cache = out_dir / "reference" / f"{clean.config_hash()}.json"
    if cache.exists() and REFERENCE not in selected:
        return {"loss": json.loads(cache.read_text())["final_loss"]}
    result = run_one(clean, out_dir, None)
    if on_result:
        on_result(result)
    job = clean.job_spec((out_dir / REFERENCE / "storage").resolve())
    losses = series.step_losses(
        series.read_trace(Path(job.storage.path), job.name, job.resources.num_workers),
        job.resources.num_workers,
        "last",
    )
    loss = series.final_loss(losses, job.max_steps)
    if loss is not None and result.passed:
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(
            json.dumps({"final_loss": loss, "max_steps": job.max_steps, "config_hash": clean.config_hash()})
        )
    return {"loss": loss, "ran": clean, "result": result}

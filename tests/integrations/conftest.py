"""Shared pieces for the integration e2e tests: one real local Ray per module, job specs, traces."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.job import JobSpec
from supervisor.config.runtime import RuntimeSettings

ROOT = Path(__file__).resolve().parents[2]
LEAN = str(Path(__file__).parent / "lean.yaml")
#: Small enough for CPU under load, big enough that the detector has a baseline before the fault.
SMALL = "--d-model 32 --layers 1 --data-bytes 150000"


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    from supervisor.ranks.names import NAMESPACE

    # Ray gives its raylet a fixed 30 s to register; on a saturated 2-core machine that can pass.
    for attempt in range(3):
        try:
            ray.init(
                address="local", num_cpus=4, namespace=NAMESPACE, include_dashboard=False, log_to_driver=False
            )
            break
        except Exception as exc:
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    try:
        yield
    finally:
        ray.shutdown()


def command_job(
    tmp_path: Path, name: str, module: str, steps: int, *, extra: str = "", **over: Any
) -> JobSpec:
    # The HF example writes its Trainer output_dir: keep it in the test's folder (under the
    # storage path, so the Trainer's checkpoints are adopted where they are).
    out = f" --output-dir {tmp_path / 'store' / name / 'hf'}" if "hf_trainer" in module else ""
    spec: dict[str, Any] = {
        "name": name,
        "entrypoint": f"python -m {module} --steps {steps} {SMALL}{out} {extra}".rstrip(),
        "max_steps": steps,
        "resources": {"num_workers": 2},
        "storage": {"path": str(tmp_path / "store")},
        "checkpoint": {"every_steps": 20},
        "telemetry": {"min_history": 40, "window": 100, "hang_timeout_s": 90},
        "policy": LEAN,
    }
    spec.update(over)
    return JobSpec.model_validate(spec)


def settings(trace: Path | None = None) -> RuntimeSettings:
    # After a rollback by restart, the fix is acknowledged once the new processes (importing
    # torch and transformers on a loaded machine) reach their first step boundary.
    over: dict[str, Any] = {"healthy_after_steps": 5, "step_deadline_s": 10.0, "directive_timeout_s": 180.0}
    if trace is not None:
        over["trace_path"] = str(trace)
    return RuntimeSettings.model_validate(over)


def plain_torchrun(tmp_path: Path, module: str, steps: int) -> list[Path]:
    """``module`` under plain `torchrun --nproc_per_node 2`: no supervisor, a local trace per rank."""
    trace = tmp_path / "plain" / "trace.jsonl"
    trace.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", module,
           "--steps", str(steps), *SMALL.split(), "--trace", str(trace)]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return sorted(trace.parent.glob("trace.rank*.jsonl"))


def final_loss(trace_glob: list[Path], last: int = 10) -> float:
    """Token-weighted loss of the last ``last`` steps of the kept timeline, over all ranks."""
    by_step: dict[tuple[int, int], dict[str, Any]] = {}
    for path in trace_glob:
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if "loss" in rec and not rec.get("control"):
                by_step[(int(rec["step"]), int(rec.get("rank", 0)))] = rec  # a replayed step: the last one
    steps = sorted({s for s, _ in by_step})[-last:]
    recs = [r for (s, _), r in by_step.items() if s in steps]
    total = sum(r.get("tokens", 1) for r in recs)
    value = sum(r.get("loss_sum", r["loss"]) for r in recs) / total
    assert math.isfinite(value)
    return value

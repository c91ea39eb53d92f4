"""`supervisor launch` end to end, as an operator runs it (issue 18).

One real run of the tiny example on a fresh local Ray: the first line says which Ray, `--set`
reaches the job, `telemetry.trace` makes the supervised run write one JSONL trace per rank
that `analyze` reads, settings from `runtime:` reach the supervisor, and a finished job exits 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

TINY = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "data": {"max_bytes_per_source": 200_000}}


def test_launch_writes_per_rank_traces_and_says_which_ray(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "e2e-ops",
                "entrypoint": "examples.tinylm.train:main",
                "config": TINY,
                "max_steps": 1,  # raised with --set below
                "resources": {"num_workers": 2},
                "ray": {"num_cpus": 4},
                "storage": {"path": str(tmp_path / "store")},
                "checkpoint": {"every_steps": 10},
                "runtime": {"healthy_after_steps": 5, "step_deadline_s": 5, "max_group_restarts": 0},
            }
        )
    )
    trace = tmp_path / "traces" / "run.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_raylet_start_wait_time_s"] = "180"  # a busy 2-core machine starts Ray slowly
    done = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", "launch", str(job),
         "--set", "max_steps=24", "--set", f"telemetry.trace={trace}"],
        capture_output=True, text=True, timeout=600, env=env, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    first = done.stdout.splitlines()[0]
    assert first.startswith("ray: started a fresh local instance for this job (4 CPUs)"), done.stdout[:500]
    assert "e2e-ops: finished at step 24/24" in done.stdout
    for rank in (0, 1):
        path = trace.with_name(f"run.rank{rank}.jsonl")
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert {r["rank"] for r in records} == {rank}
        assert {r["step"] for r in records if "loss" in r} >= set(range(1, 24)), path
    analyzed = subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", "analyze", str(trace.with_name("run.rank0.jsonl")), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert analyzed.returncode == 0, analyzed.stderr[-2000:]

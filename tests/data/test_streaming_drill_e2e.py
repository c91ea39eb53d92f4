"""The garbage-batch drill on the example job reading a streaming dataset with 2 loader workers.

Real local Ray, 2 ranks, real tinylm training on HF ``datasets`` streaming from local JSONL
shards (``examples/tinylm/job_streaming.yaml``), each rank with 2 DataLoader worker processes.
At step 100 rank 1 is fed garbage; the supervisor must diagnose a rank-local data transient
and exclude those samples (``apply``) — the exclusion has to reach the loader's workers, or
the garbage samples come back. The drill machinery (runner, checks) is the shipped one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from supervisor.drills.runner import run_drills
from supervisor.drills.scenario import SCENARIO_DIR, load_scenario

JOB = Path(__file__).resolve().parents[2] / "examples" / "tinylm" / "job_streaming.yaml"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_garbage_batch_drill_on_a_streaming_job_with_loader_workers(tmp_path: Path) -> None:
    shipped = yaml.safe_load((SCENARIO_DIR / "garbage_batch.yaml").read_text())
    drill_base = yaml.safe_load((SCENARIO_DIR / "_base.yaml").read_text())
    scenario = {
        "name": "garbage_batch_streaming",
        "description": shipped["description"] + " Streaming data, 2 loader workers per rank.",
        "base": str(JOB),
        "job": {
            "max_steps": 160,  # the fault at 100, then the data fix and its 50-step observation window
            "checkpoint": drill_base["checkpoint"],
            "telemetry": drill_base["telemetry"],
            "config": {"data": {"max_bytes_per_source": 100_000, "stream_dir": str(tmp_path / "shards")}},
        },
        "faults": shipped["faults"],
        "expect": {**shipped["expect"], "final_loss_tolerance": None},
    }
    path = tmp_path / "garbage_batch_streaming.yaml"
    path.write_text(yaml.safe_dump(scenario))
    sc = load_scenario(path)
    assert (
        sc.job_data["config"]["data"]["streaming"] == "hf"
        and sc.job_data["config"]["data"]["loader_workers"] == 2
    )

    (result,) = run_drills([sc], out_dir=tmp_path / "out")

    missed = [f"{c.name}: {c.detail}" for c in result.failed_checks]
    assert result.error is None, result.error
    assert result.passed, f"{result.phase}, {result.wall_s:.0f}s, missed: " + " | ".join(missed)
    assert any(c.ok for c in result.checks)

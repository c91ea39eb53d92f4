"""``python -m bench.scale --smoke``: the real supervisor actor driven by 16 emulated ranks walks a
non-finite step's whole plan (freeze, snapshot, block latest, rollback, re-warm, observe, resume),
the job finishes, and every record the emulated ranks made was durably accepted (lost 0). The
figures themselves are not judged: smoke sizes are too small and the machine is shared."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_scale_smoke_walks_the_plan_and_loses_no_record(tmp_path: Path) -> None:
    out_json = tmp_path / "scale.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "RAY_raylet_start_wait_time_s": "180",
    }
    proc = subprocess.run([sys.executable, "-m", "bench.scale", "--smoke", "--json", str(out_json)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=420)  # fmt: skip
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both[-3000:]
    assert "Traceback (most recent call last)" not in both, both[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    num = r"[\d.]+"
    pattern = (rf"scale: ranks 16, ingest \d+ records/s, supervisor {num} ms CPU/step, frozen in {num} s "
               rf"\(\d+ steps\), acked in {num} s, lost 0")  # fmt: skip
    assert re.fullmatch(pattern, last), last
    f = json.loads(out_json.read_text())
    assert f["phase"] == "finished" and f["lost"] == 0 and f["produced"] == f["delivered"] > 16 * 100
    assert (
        f["detected_step"] is not None and f["frozen_steps"] >= 0 and f["acked_s"] >= 0.5
    )  # restore takes 0.5 s
    assert f["state_file"]["calls"] > 0 and f["incident_store"]["calls"] > 0
    # The control loop's thread and the ingest calls are parts of the process: together some of its CPU
    # per step (the process's figure counts in 10-ms ticks, hence the margin).
    loop, calls = f["loop_ms_per_step"], f["ingest_ms_per_step"]
    assert loop is not None and loop > 0 and calls > 0 and loop + calls <= f["cpu_ms_per_step"] + 1.0

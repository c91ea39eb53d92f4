"""``python -m bench.scale.path``: the real controller fed the emulator's packed batches, no Ray,
analyses every step of a clean run without an incident and prints its per-phase line. The figures
are not judged (the machine is shared); what could fail is the path itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("batch_steps", [1, 3])
def test_path_bench_analyses_every_step_and_prints_its_line(tmp_path: Path, batch_steps: int) -> None:
    out = tmp_path / "path.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "bench.scale.path", "--ranks", "16", "--steps", "12",
                           "--warmup", "25", "--batch-steps", str(batch_steps), "--json", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=240)  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    num = r"[\d.]+"
    pattern = (
        rf"path: ranks 16, {num} ms CPU/step \(unpack {num}, queue {num}, loop {num}\), [\d,]+ records/s"
    )
    assert re.fullmatch(pattern, last), last
    f = json.loads(out.read_text())
    assert f["ranks"] == 16 and f["steps"] == 12 and f["batch_steps"] == batch_steps
    assert f["cpu_ms_per_step"] > 0 and f["unpack_ms"] + f["queue_ms"] + f["loop_ms"] > 0

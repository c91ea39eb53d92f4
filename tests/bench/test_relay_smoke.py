"""``python -m bench.relay --smoke``: the same clean job at 4 real ranks, straight and through a node
relay, finishes both ways with no record lost or missing, and the relayed run takes fewer record
batches per step. The CPU figures are not judged: the machine is shared and the sizes tiny. (A fault
through the relay: tests/bench/test_real_ranks.py, whose 16 ranks report through one by default.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_relay_smoke_both_paths_finish_and_the_relay_takes_fewer_calls() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "bench.relay", "--smoke"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both[-3000:]
    assert "Traceback (most recent call last)" not in both, both[-3000:]
    runs = re.findall(r"^(direct|relayed) +round 1: .*, lost (\d+), missing (\d+)$", proc.stdout, re.M)
    assert sorted(r[0] for r in runs) == ["direct", "relayed"] and all(r[1:] == ("0", "0") for r in runs), (
        proc.stdout
    )
    last = proc.stdout.strip().splitlines()[-1]
    num = r"([\d.]+)"
    m = re.fullmatch(rf"relay: ranks 4, supervisor {num} ms CPU/step direct, {num} relayed \({num}x\), "
                     rf"calls/step {num} direct, {num} relayed", last)  # fmt: skip
    assert m is not None, last
    assert float(m[5]) < float(m[4]), last

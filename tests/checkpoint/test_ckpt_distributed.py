"""Two real gloo ranks save and restore through one store: per-rank files, rank 0 commits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("ddp_worker.py")


@pytest.mark.slow  # two torch processes + gloo: ~8 s alone, ~20 s on a busy 2-core box
def test_two_ranks_save_commit_restore_and_fail_together(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("a file where rank 1 expects its storage directory")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), "2", str(tmp_path)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["manifest_ranks"] == [0, 1] and r1["manifest_ranks"] is None
    assert r0["params_equal"] and r1["params_equal"]
    assert (r0["cursor"], r1["cursor"]) == (8, 16)  # each rank gets its own data cursor back
    assert r0["report"] == [] and r1["report"] == []
    assert "rank 1:" in r0["failure"] and "rank 1:" in r1["failure"]
    assert r0["steps"] == [2]  # the failed save at step 3 was never committed

"""``python -m bench.real_ranks``: the drills' faults at 16 real torch ranks.

The pure part (which ranks went back where, from the per-rank traces) runs without Ray; the slow
smoke runs one scenario, a garbage batch on rank 11 of 16, through the real supervisor and checks
that the incident opens, names rank 11 and every directive reaches all 16 ranks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.real_ranks import SCENARIOS, regressions, same_step, widened

ROOT = Path(__file__).resolve().parents[2]


def _trace(ranks: int, steps: list[int], *, short: dict[int, list[int]] | None = None) -> list[dict]:
    return [{"rank": r, "step": s, "loss": 1.0} for r in range(ranks) for s in (short or {}).get(r, steps)]


def test_every_rank_back_from_the_same_step_to_the_same_step() -> None:
    steps = [*range(1, 116), *range(101, 181)]  # frozen after 115, rolled back to 100
    backs = regressions(_trace(16, steps))
    assert backs == {r: [(115, 100)] for r in range(16)}
    assert same_step(backs, 16, expected=True, killed=None).ok


def test_a_rank_restored_elsewhere_or_never_fails() -> None:
    steps = [*range(1, 116), *range(101, 181)]
    apart = regressions(_trace(16, steps, short={11: [*range(1, 116), *range(81, 181)]}))
    assert not same_step(apart, 16, expected=True, killed=None).ok
    missing = regressions(_trace(16, steps, short={3: list(range(1, 181))}))
    check = same_step(missing, 16, expected=True, killed=None)
    assert not check.ok and "rank(s) [3] never went back" in check.detail
    assert not same_step(regressions(_trace(2, steps)), 2, expected=False, killed=None).ok


def test_the_killed_rank_may_stop_a_step_early() -> None:
    steps = [*range(1, 110), *range(101, 181)]
    backs = regressions(_trace(16, steps, short={5: [*range(1, 109), *range(101, 181)]}))
    assert same_step(backs, 16, expected=True, killed=5).ok
    assert not same_step(backs, 16, expected=True, killed=None).ok


def test_the_scenarios_keep_the_drills_expectations_with_the_rank_moved() -> None:
    garbage = widened(SCENARIOS["garbage_rank"], 16)
    assert garbage.job_spec(Path("/tmp/x")).resources.num_workers == 16
    assert garbage.expect.first_rank == 11 and "rank_local" in garbage.expect.attributes
    assert "rollback" in garbage.expect.no_actions  # as at 2 ranks: a transient is not rolled back
    assert widened(SCENARIOS["nan_rank"], 16).faults[0].rank == 13
    assert widened(SCENARIOS["kill_rank"], 16).expect.resumed_from == 100
    assert widened(SCENARIOS["garbage_rank"], 16, against_clean=False).expect.final_loss_tolerance is None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_garbage_batch_on_rank_11_of_16(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_raylet_start_wait_time_s": "180"}
    proc = subprocess.run([sys.executable, "-m", "bench.real_ranks", "--smoke", "--out", str(tmp_path)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=540)  # fmt: skip
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert re.match(r"real_ranks: ranks 16, 1/1 scenarios handled", last), last
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| garbage_rank |"))
    assert "| finished |" in row and "| 11 |" in row, row

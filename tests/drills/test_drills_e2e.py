"""The fire drills end to end: real tinylm training on a real local Ray under the default policy.

One Ray session runs the scenarios two at a time (module fixture; ``run_drills(concurrency=2)``:
a drill leaves part of a 2-core machine idle while Ray starts actors, checkpoints are verified
and the supervisor polls), then each drill is its own test so a failure names the drill and the
expectations it missed. `supervisor drill all` runs every scenario; this slice leaves out only
the drills whose behaviour another test asserts through the same path:

- ``lr_spike``: ``kill_supervisor_frozen`` is the same fault with the same expectations (one
  optimizer divergence frozen, rolled back, fixed, observed, resumed, final loss as clean),
  plus the supervisor killed while frozen. Of the kill-anywhere family (``kill_*``) only that
  kill point runs here.
- ``worker_kill``: ``corrupt_checkpoint`` is the same SIGKILL of rank 1 at step 110 (a
  machinery incident, one group restart, no policy action) with the step-100 checkpoint made
  unloadable, so the restart must pick the newest *verified* one; the plain resume-from-newest
  is tests/runtime/test_e2e_machinery.py's worker test.
- ``oversized_update``: tests/runtime/test_e2e_incidents.py's divergence test runs the same fault
  (one optimizer step at many times the LR) through the real runtime to a rollback, a fix, a passed
  window and the run's end; the default policy's plan for it is tests/policy's, and the matrix and
  the sampler run the drill's fault under the default policy on other models.
- ``garbage_batch``: tests/data/test_streaming_drill_e2e.py runs this scenario's fault and
  expectations through the same runner and checks on the example job reading a streaming
  dataset; ``corrupt_shard`` here is the same rank-local data fix on the map-style loader,
  final loss included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.drills.runner import DrillResult, run_drills
from supervisor.drills.scenario import find_scenarios, scenario_paths

COVERED_ELSEWHERE = {"lr_spike", "worker_kill", "garbage_batch", "oversized_update"}
KILL_SLICE = ("kill_supervisor_frozen",)
# The longest drill (a supervisor restart mid-incident) starts first, beside the clean reference.
NAMES = [*KILL_SLICE] + [
    p.stem for p in scenario_paths() if not p.stem.startswith("kill_") and p.stem not in COVERED_ELSEWHERE
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DrillResult]:
    out = tmp_path_factory.mktemp("drills")
    return {r.name: r for r in run_drills(find_scenarios(NAMES), out_dir=Path(out), concurrency=2)}


def test_the_slice_leaves_out_only_drills_covered_elsewhere() -> None:
    every = {p.stem for p in scenario_paths()}
    assert every.issuperset(COVERED_ELSEWHERE | set(KILL_SLICE))  # a renamed drill fails here
    left_out = every - set(NAMES)
    assert left_out == COVERED_ELSEWHERE | {n for n in every if n.startswith("kill_")} - set(KILL_SLICE)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", NAMES)
def test_drill(results: dict[str, DrillResult], name: str) -> None:
    r = results[name]
    missed = [f"{c.name}: {c.detail}" for c in r.failed_checks]
    assert r.error is None, r.error
    assert r.passed, f"drill {name} ({r.phase}, {r.wall_s:.0f}s) missed: " + " | ".join(missed)
    assert any(c.ok for c in r.checks)  # it checked something

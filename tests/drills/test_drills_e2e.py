"""Every fire drill, end to end: real tinylm training on a real local Ray under the default policy.

One Ray session runs the scenarios (module fixture), then each drill is its own test so a
failure names the drill and the expectations it missed. Slow: about 3.5 minutes on 2 cores
(bench/README.md). Of the kill-anywhere family (``kill_*``) only one kill point runs here,
the supervisor killed while frozen (a worker kill is the `worker_kill` drill); `supervisor drill all`
runs the whole family.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.drills.runner import DrillResult, run_drills
from supervisor.drills.scenario import find_scenarios, scenario_paths

KILL_SLICE = ("kill_supervisor_frozen",)
NAMES = [p.stem for p in scenario_paths() if not p.stem.startswith("kill_") or p.stem in KILL_SLICE]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, DrillResult]:
    out = tmp_path_factory.mktemp("drills")
    return {r.name: r for r in run_drills(find_scenarios(NAMES), out_dir=Path(out))}


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", NAMES)
def test_drill(results: dict[str, DrillResult], name: str) -> None:
    r = results[name]
    missed = [f"{c.name}: {c.detail}" for c in r.failed_checks]
    assert r.error is None, r.error
    assert r.passed, f"drill {name} ({r.phase}, {r.wall_s:.0f}s) missed: " + " | ".join(missed)
    assert any(c.ok for c in r.checks)  # it checked something

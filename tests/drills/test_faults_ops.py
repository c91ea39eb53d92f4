"""Operational faults: a wrong logged metric, a killed worker (in a child process), a corrupted shard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.drills.faults import FaultPlan


def test_misreduced_loss_is_multiplied_in_its_window_only() -> None:
    plan = FaultPlan.from_specs([{"kind": "logging_bug", "step": 3, "steps": 2}], rank=0, world_size=2)
    out = [plan.record(s, {"step": s, "loss": 2.0, "loss_sum": 20.0, "tokens": 10}) for s in range(6)]
    assert [r["loss"] for r in out] == [2.0, 2.0, 2.0, 4.0, 4.0, 2.0]
    assert all(r["loss_sum"] == 20.0 and r["tokens"] == 10 for r in out)  # the true quantities stay


def test_padding_dominated_loss() -> None:
    spec = {"kind": "logging_bug", "step": 0, "mode": "padding", "pad_fraction": 0.5, "pad_loss": 10.0}
    plan = FaultPlan.from_specs([spec], rank=0, world_size=2)
    assert plan.record(0, {"step": 0, "loss": 2.0})["loss"] == pytest.approx(6.0)


_KILL = """
import sys
from supervisor.drills.faults import FaultPlan
plan = FaultPlan.from_specs([{"kind": "worker_kill", "step": 3, "rank": 1}], rank=1, world_size=2, state_dir=sys.argv[1])
for step in range(int(sys.argv[2]), 6):
    plan.maybe_crash(step)
    print(step, flush=True)
"""


def _run_worker(state_dir: Path, start: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _KILL, str(state_dir), str(start)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[2])  # fmt: skip


def test_worker_kill_sigkills_once_and_not_after_restart(tmp_path: Path) -> None:
    first = _run_worker(tmp_path, 0)
    assert first.returncode == -9 and first.stdout.split() == ["0", "1", "2"]
    assert len(list(tmp_path.iterdir())) == 1  # the marker
    restarted = _run_worker(tmp_path, 2)  # restarted from a checkpoint before the kill step
    assert restarted.returncode == 0 and restarted.stdout.split() == ["2", "3", "4", "5"]


def test_corrupt_checkpoint_flips_one_byte_of_one_shard_once(tmp_path: Path) -> None:
    def save(step: int) -> Path:
        d = tmp_path / f"step_{step:08d}"
        d.mkdir()
        (d / "model-rank0.pt").write_bytes(bytes(range(256)) * 8)
        (d / "optim-rank0.pt").write_bytes(bytes(100))
        (d / "MANIFEST.json").write_text("{}")
        return d

    plan = FaultPlan.from_specs(
        [{"kind": "corrupt_checkpoint", "step": 20}], rank=0, world_size=2, state_dir=tmp_path / "m"
    )
    for step in (10, 20, 30):
        plan.on_checkpoint_saved(step, [save(step)])
    original = bytes(range(256)) * 8
    for step in (10, 30):
        assert (tmp_path / f"step_{step:08d}" / "model-rank0.pt").read_bytes() == original
    corrupted = (tmp_path / "step_00000020" / "model-rank0.pt").read_bytes()
    diffs = [i for i, (a, b) in enumerate(zip(original, corrupted, strict=True)) if a != b]
    assert diffs == [1024] and corrupted[1024] == original[1024] ^ 0xFF
    assert (tmp_path / "step_00000020" / "optim-rank0.pt").read_bytes() == bytes(100)
    assert (tmp_path / "step_00000020" / "MANIFEST.json").read_text() == "{}"

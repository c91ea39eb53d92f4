"""Every bench script runs: its ``--smoke`` mode (seconds, tiny sizes) ends with exit code 0,
prints no traceback, and prints the table or figures its full run prints. A bench that rots
(a renamed API, a file it no longer finds, a worker that dies noisily) fails here, not the next
time someone measures. The numbers themselves are not judged: smoke sizes are too small.

``bench/gpu_check.py`` and the scenario matrix/sampler have their own tests; the scripts that
start Ray (recovery, telemetry transport) are marked slow."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
NUMBER = r"[-+]?[\d,]+(?:\.\d+)?"


def smoke(script: str, *extra: str, timeout_s: float = 300) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
           "RAY_raylet_start_wait_time_s": "180"}  # a busy 2-core machine starts Ray slowly  # fmt: skip
    proc = subprocess.run([sys.executable, str(BENCH / script), "--smoke", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)  # fmt: skip
    both = proc.stdout + proc.stderr
    assert proc.returncode == 0, both[-3000:]
    assert "Traceback (most recent call last)" not in both, both[-3000:]
    return proc.stdout


#: Not scripts of their own, or smoke-tested elsewhere (the GPU check needs a GPU; the 16-rank
#: smoke is tests/bench/test_real_ranks.py, the relay's tests/bench/test_relay_smoke.py, both slow).
NOT_HERE = {
    "gpu_check.py",
    "checkpoint_io_ablations.py",
    "real_ranks.py",
    "relay.py",
}  # the ablations run in checkpoint_io's smoke


def test_every_bench_script_has_a_smoke_mode() -> None:
    scripts = sorted(p.name for p in BENCH.glob("*.py") if p.name not in NOT_HERE)
    missing = [s for s in scripts if "--smoke" not in (BENCH / s).read_text(encoding="utf-8")]
    assert not missing, f"bench scripts without --smoke: {missing}"
    tested = set(re.findall(r'smoke\("(\w+\.py)"', Path(__file__).read_text(encoding="utf-8")))
    assert set(scripts) <= tested, f"smoke modes without a test here: {sorted(set(scripts) - tested)}"


def test_loader_smoke_prints_the_whole_table_and_no_worker_traceback() -> None:
    out = smoke("loader.py")
    rows = [ln for ln in out.splitlines() if ln.startswith("| 1e6 |")]
    # 1 size x 2 exclusion counts x 2 worker counts, 8 cells each, every timing a number
    assert [(r.split("|")[2].strip(), r.split("|")[3].strip()) for r in rows] == [
        ("0", "0"), ("0", "2"), ("1,000", "0"), ("1,000", "2")]  # fmt: skip
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert len(cells) == 8, r
        assert all(re.search(NUMBER, c) for c in cells[3:]), r


def test_checkpoint_io_smoke_prints_every_row_and_the_ablations() -> None:
    out = smoke("checkpoint_io.py")
    for name in ("raw write+fsync", "save dcp (sync)", "async: blocked", "verify (dcp)", "restore dcp"):
        assert re.search(rf"^  {re.escape(name)}\s+{NUMBER} s ", out, re.M), (name, out)
    assert "ablations on a 16 MiB state dict" in out
    assert len(re.findall(rf"^    .+\s{NUMBER} s\s+{NUMBER}x$", out, re.M)) >= 10, out


def test_detect_throughput_smoke_prints_both_records_and_their_ratio() -> None:
    out = smoke("detect_throughput.py")
    assert out.startswith("8 ranks x 120 steps")
    for label in ("full record", "minimal record"):
        assert re.search(rf"{label}\s+{NUMBER} rank-records/s .*p50 {NUMBER} ms, p99 {NUMBER} ms", out), out
    assert re.search(rf"full / minimal throughput ratio: {NUMBER}", out)


@pytest.mark.slow
def test_telemetry_transport_smoke_accounts_for_every_record() -> None:
    out = smoke("telemetry_transport.py")
    lines = [ln for ln in out.splitlines() if "batch_size=" in ln]
    assert len(lines) == 2, out
    for ln in lines:
        assert "lost silently 0" in ln and re.search(rf"produced {NUMBER}, dropped \(counted\) {NUMBER}", ln)


@pytest.mark.slow
def test_recovery_smoke_measures_the_in_place_rollback() -> None:
    """One small worker, 200 steps, one Ray start, no group restart (about a minute)."""
    out = smoke("recovery.py", timeout_s=420)
    rows = json.loads(out[out.index("{") :])
    for key in ("in_place_s", "raw_read_s", "detect_to_freeze_s", "rollback_load_s", "median_step_s"):
        assert isinstance(rows[key], int | float) and rows[key] >= 0, (key, rows)
    assert rows["full_restart_s"] is None  # the smoke run skips the group restart (a minute)
    assert rows["job"] == "finished", rows


def test_recovery_readme_row_fits_the_table_and_the_readme_is_left_alone() -> None:
    """``--readme`` prints a row of bench/README.md's table (that file is edited by hand)."""
    sys.path.insert(0, str(ROOT))
    from bench.recovery import readme_row

    figures = {"in_place_s": 0.55, "in_place_limit_s": 2.1, "raw_read_s": 0.05, "full_restart_s": 8.2,
               "restart_over_in_place": 14.9, "model": "tinylm d_model=128", "checkpoint_mb": 9.0}  # fmt: skip
    row = readme_row(figures)
    header = next(
        ln
        for ln in (BENCH / "README.md").read_text(encoding="utf-8").splitlines()
        if ln.startswith("| bench |")
    )
    assert row.count("|") == header.count("|"), (row, header)
    assert "0.55 s" in row and "8.2 s (14.9x)" in row and "meets" in row
    assert "MISSES" in readme_row({**figures, "in_place_s": 3.0})
    source = (BENCH / "recovery.py").read_text(encoding="utf-8")
    assert 'open("a"' not in source and "write_text" not in source.replace(
        '(work / "policy.yaml").write_text', ""
    )


def test_incident_export_smoke_prints_one_line_per_rank_count() -> None:
    out = smoke("incident_export.py")
    assert re.fullmatch(
        rf"incident_export: ranks 2, in-loop before {NUMBER} ms/change, after {NUMBER} ms/change, "
        rf"export {NUMBER} KB \({NUMBER}x less\)\n",
        out,
    ), out


def test_probe_overhead_smoke_prints_every_variant_against_the_plain_loop() -> None:
    out = smoke("probe_overhead.py", timeout_s=120)
    assert out.startswith("model: ") and "3 rounds x 2 steps" in out, out
    rows = [ln for ln in out.splitlines() if ln.endswith("(ms/step)")]
    assert [r.split("  ")[1] for r in rows] == [
        "baseline (clip, no probe)", "probe: loss+grad norm+nonfinite", "probe: default (+sampled norms, fingerprint/50)",
        "probe: everything every step (fingerprint/1)", "probe: + canary forward every 10 steps"]  # fmt: skip
    for r in rows:  # the paired median and its confidence interval, of the step
        assert len(re.findall(rf"{NUMBER}%", r)) == 6, r  # and outside forward + backward (CPU)
    assert "+0.00%   [ +0.00%,  +0.00%]" in rows[0]  # the baseline paired with itself
    assert out.count("update-norm sample:") == 4, out


def test_probe_overhead_pairs_rounds_and_brackets_the_median() -> None:
    """The figure is the median of per-round ratios (a drift that slows a whole round cancels),
    and its 95% interval holds the median and widens with the spread of the ratios."""
    sys.path.insert(0, str(BENCH))
    from probe_overhead import paired

    base = [1.0, 2.0, 4.0, 1.5, 3.0] * 8  # the machine's speed swings 4x between rounds
    mid, lo, hi = paired([1.02 * b for b in base], base)
    assert abs(mid - 0.02) < 1e-9 and abs(lo - 0.02) < 1e-9 and abs(hi - 0.02) < 1e-9
    noisy = [b * (1.02 + (0.05 if i % 2 else -0.05)) for i, b in enumerate(base)]
    mid, lo, hi = paired(noisy, base)
    assert lo < mid < hi and lo < 0.0 < hi  # a 2% effect under +-5% noise at 40 rounds: not shown


def test_probe_overhead_refuses_an_unknown_variant_in_one_line() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(BENCH / "probe_overhead.py"), "--variants", "default,fast"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "'fast'" in proc.stderr, (
        proc.stderr
    )


@pytest.mark.slow  # two gloo ranks in their own processes, both control paths: ~15 s
def test_control_cost_smoke_prints_both_paths_and_every_directive_arrives() -> None:
    out = smoke("control_cost.py")
    [row] = [ln for ln in out.splitlines() if ln.startswith("| 2 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 7 and all(re.search(NUMBER, c) for c in cells[1:]), row
    assert cells[6] == "6 / 6", row  # rank 0 applied every directive on both paths
    assert re.search(rf"^control_cost: ranks 2, broadcast {NUMBER} us/step, agreed {NUMBER} us/step \({NUMBER}x\)$",
                     out, re.M), out  # fmt: skip

"""`supervisor policy explain` on a real trace: detection (DETECT's analysis) + this engine.

The trace is an LR-driven divergence written here: 2 ranks, a steady loss for 400 steps, then
an LR override that makes the loss rise and the grad norm explode for 80 steps on all ranks.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli

pytest.importorskip("supervisor.core.analysis", reason="detection (DETECT) has not landed")
pytest.importorskip("supervisor.traces", reason="trace readers (DETECT) have not landed")

ONSET = 400


def write_divergence_trace(path: Path, *, ranks: int = 2, steps: int = 480) -> None:
    rng = random.Random(0)
    lines = []
    for step in range(steps):
        over = max(0, step - ONSET)
        lr = 3e-4 if step < ONSET else 3e-3
        for rank in range(ranks):
            noise = rng.gauss(0, 0.01)
            loss = 3.0 - 0.0005 * min(step, ONSET) + noise + (0.04 * over + 0.002 * over**2 if over else 0.0)
            grad = 1.0 + rng.gauss(0, 0.03) if not over else math.exp(0.08 * over) * (1 + rng.gauss(0, 0.03))
            rec = {
                "step": step,
                "rank": rank,
                "world_size": ranks,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad,
                "param_norm": 100.0,
                "update_norm": lr * 30 * grad,
                "tokens": 4096,
                "tokens_per_s": 50_000.0,
                "events": (["checkpoint_saved"] if step and step % 100 == 0 else [])
                + (["lr_override"] if step == ONSET else []),
            }
            lines.append(json.dumps(rec))
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "divergence.jsonl"
    write_divergence_trace(path)
    return path


def test_explain_divergence_prints_the_procedure(trace: Path) -> None:
    res = CliRunner().invoke(cli, ["policy", "explain", "default", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "incident 1: divergence" in out and "rule 'optimizer_state' matched" in out
    assert "evidence: " in out and "_jump (" in out  # the plan follows the LR/update jump, not the curve
    steps = [line.split()[1] for line in out.splitlines() if line.strip()[:2].rstrip(".").isdigit()]
    assert steps[:8] == [
        "alert",
        "freeze",
        "snapshot",
        "block_latest",
        "rollback",
        "apply",
        "observe",
        "resume",
    ]
    rollback = next(line for line in out.splitlines() if " rollback " in line)
    assert "target step 200" in rollback or "target step 300" in rollback
    # optimizer_state: the LR dates the onset, so no margin (rollback lr_dated_margin_steps: 0)
    assert "margin 0 steps" in rollback and "where the LR left its level" in rollback
    assert "then: resume if the observation window passes, else escalate" in out


def test_explain_json(trace: Path) -> None:
    res = CliRunner().invoke(cli, ["policy", "explain", "default", "--trace", str(trace), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    first = data["incidents"][0]
    assert first["diagnosis"]["phenotype"] == "divergence"
    assert ONSET - 5 <= first["diagnosis"]["onset_step"] <= ONSET + 30
    plan = first["plan"]
    assert plan["rule"] == "optimizer_state" and plan["escalate_reason"] is None
    assert {"lr_jump", "update_jump"} & set(plan["evidence"]) and plan["recovery"] == "in_place"
    rollback = next(a for a in plan["actions"] if a["name"] == "rollback")
    assert rollback["params"]["margin_steps"] == 0  # the margin applied: the LR dates the onset
    assert rollback["params"]["target_step"] < first["diagnosis"]["onset_step"]
    assert data["checkpoints"]["source"] == "checkpoint_saved events"


def test_explain_conservative_escalates(trace: Path) -> None:
    res = CliRunner().invoke(cli, ["policy", "explain", "conservative", "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "escalates: Deciding to escalate: rule 'hold' says so" in res.stdout


def test_explain_missing_trace_is_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["policy", "explain", "default", "--trace", str(tmp_path / "nope.jsonl")])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_explain_shows_the_job_values_and_the_recovery_mode(trace: Path) -> None:
    args = [
        "policy",
        "explain",
        "default",
        "--trace",
        str(trace),
        "--grad-clip",
        "1.0",
        "--supervision",
        "observe",
    ]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    # Detected at the LR jump itself (an LR 10x every LR the run used): the job's LR is the one it
    # ran before the fault.
    assert "job runs: lr 0.0003, grad clip 1, median grad norm" in res.stdout
    assert "supervision observe, recovery restart" in res.stdout
    steps = [line.split()[1] for line in res.stdout.splitlines() if line.strip()[:2].rstrip(".").isdigit()]
    assert "freeze" not in steps and "rollback" in steps
    assert "note: freeze dropped: an observe-level job" in res.stdout


def test_explain_weighs_the_re_warm_against_the_run_left(trace: Path) -> None:
    """The live supervisor drops a re-warm longer than the run has left after the onset
    (``JobState.max_steps``); `policy explain --max-steps` plans with the same knowledge."""

    def apply_params(*extra: str) -> tuple[dict, list[str]]:
        args = ["policy", "explain", "default", "--trace", str(trace), "--json", *extra]
        res = CliRunner().invoke(cli, args)
        assert res.exit_code == 0, res.output
        plan = json.loads(res.stdout)["incidents"][0]["plan"]
        applies = [a["params"] for a in plan["actions"] if a["name"] == "apply"]
        return (applies[0] if applies else {}), plan["notes"]

    unknown, _ = apply_params()
    assert unknown.get("warmup_steps"), unknown  # the run's length unknown: the re-warm is kept
    short, notes = apply_params("--max-steps", str(ONSET + 10))
    assert not short.get("warmup_steps"), short
    assert any("max_steps=" in n for n in notes), notes

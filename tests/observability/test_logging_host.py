"""The SDK never reconfigures the logging of the process it runs in (the user's training script)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("host_logging.py")


def _run(mode: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), mode],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.mark.slow
def test_a_bare_host_keeps_unconfigured_logging_and_still_sees_sdk_warnings() -> None:
    out, stderr = _run("bare")
    assert out["after"] == out["before"]
    assert out["after"]["root_handlers"] == [] and out["after"]["structlog_configured"] is False
    assert out["after"]["supervisor_handlers"] == 0
    # Python's last-resort handler prints the SDK's warning: a problem is never silent.
    warnings = [json.loads(line) for line in stderr.splitlines() if "directive_poll_failed" in line]
    assert warnings and warnings[0]["level"] == "warning" and "control channel down" in warnings[0]["error"]
    assert out["steps"] == [1, 2, 3]  # the SDK did run and report


@pytest.mark.slow
def test_a_configured_host_keeps_its_setup_and_receives_sdk_lines() -> None:
    out, stderr = _run("configured")
    assert out["after"] == out["before"]  # same root handlers and level, same structlog config
    assert out["after"]["structlog_configured"] is True and out["after"]["root_level"] == 20
    events = [json.loads(m) for m in out["seen"]]
    assert {e["event"] for e in events} == {"directive_poll_failed"}
    assert all(e["transport"] == "telemetry" for e in events)
    assert "directive_poll_failed" not in stderr  # it went to the host's handler, not around it
    assert out["steps"] == [1, 2, 3]

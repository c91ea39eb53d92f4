"""Exit codes of every command: 0 done, 1 failed/escalated, 2 bad input, 3 supervisor/Ray/storage failed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from ray.exceptions import ActorDiedError

from supervisor.cli.main import SupervisorGroup, cli
from supervisor.errors import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN,
    ConfigError,
    IncidentStoreError,
    RuntimeBackendError,
    StorageError,
)
from supervisor.runtime.state import JobPhase


def _group_raising(exc: BaseException) -> click.Group:
    @click.group(cls=SupervisorGroup)
    def root() -> None:
        """Test root."""

    @root.command()
    def boom() -> None:
        """Raise."""
        raise exc

    return root


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("bad", source="job.yaml", field="max_steps"), EXIT_BAD_INPUT),
        (IncidentStoreError("no incident 7"), EXIT_BAD_INPUT),
        (RuntimeBackendError("the supervisor does not answer: ActorDiedError"), EXIT_BROKEN),
        (StorageError("bucket unreachable"), EXIT_BROKEN),
        (IncidentStoreError("database vanished", exit_code=EXIT_BROKEN), EXIT_BROKEN),
        # The reported case: a dead supervisor actor escaping a command exited 2 (bad input).
        (ActorDiedError(), EXIT_BROKEN),
    ],
)
def test_each_failure_has_its_exit_code_and_one_line(exc: BaseException, code: int) -> None:
    res = CliRunner().invoke(_group_raising(exc), ["boom"])
    assert res.exit_code == code, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in res.output


def test_a_bug_keeps_its_traceback() -> None:
    res = CliRunner().invoke(_group_raising(KeyError("bug")), ["boom"])
    assert isinstance(res.exception, KeyError)


def test_job_phases_map_to_0_and_1() -> None:
    assert JobPhase.FINISHED.exit_code == 0
    assert {JobPhase.FAILED.exit_code, JobPhase.ESCALATED.exit_code, JobPhase.STOPPED.exit_code} == {1}


def test_bad_input_and_version_through_the_real_entry_point(tmp_path: Path) -> None:
    exe = [sys.executable, "-m", "supervisor.cli.main"]
    bad = subprocess.run([*exe, "validate", str(tmp_path / "missing.yaml")], capture_output=True, text=True)
    assert bad.returncode == EXIT_BAD_INPUT and bad.stderr.count("\n") == 1 and "file not found" in bad.stderr
    ver = subprocess.run([*exe, "--version"], capture_output=True, text=True)
    assert ver.returncode == 0 and ver.stdout.startswith("supervisor ") and ver.stdout.split()[1][0].isdigit()
    usage = CliRunner().invoke(cli, ["validate"])
    assert usage.exit_code == EXIT_BAD_INPUT

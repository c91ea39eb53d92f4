"""`incidents report -o FIFO` with nobody reading: one line, never a wait (issue 29, 8)."""

from __future__ import annotations

import os
from pathlib import Path

from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.incidents import IncidentStore
from tests.incidents.builders import full_incident


def test_report_to_a_fifo_nobody_reads_does_not_hang(tmp_path: Path) -> None:
    """Reported (issue 29): `incidents report -o FIFO` waited forever for a reader."""
    path = tmp_path / "incidents.sqlite"
    with IncidentStore(path) as store:
        full_incident(store)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    result = CliRunner().invoke(
        cli, ["incidents", "report", "1", "--db", str(path), "--format", "md", "-o", str(fifo)]
    )
    assert result.exit_code == 2 and "is a FIFO nobody reads" in result.stderr, result.output

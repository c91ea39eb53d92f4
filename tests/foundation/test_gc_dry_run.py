"""`checkpoints gc --dry-run` says "would delete" everywhere: output, JSON and log (issue 18).

Reported: the dry run logged `"deleted": [50, 100, 150, 200]` although nothing was deleted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from supervisor.checkpoint.store import CheckpointStore
from supervisor.cli.main import cli
from supervisor.storage import open_backend


def test_dry_run_says_would_delete_and_deletes_nothing(tmp_path: Path) -> None:
    from tests.checkpoint.conftest import save_plain  # the checkpoint tests' real (tiny torch) saver

    root = tmp_path / "storage"
    store = CheckpointStore(open_backend(str(root)), "job1")
    for step in (50, 100, 150, 200):
        save_plain(store, step)
    for step in (50, 100, 150, 200):
        assert CliRunner().invoke(cli, ["checkpoints", "verify", str(root), str(step)]).exit_code == 0
        marked = ["checkpoints", "mark", str(root), str(step), "healthy", "--reason", "test"]
        assert CliRunner().invoke(cli, marked).exit_code == 0
    exe = [sys.executable, "-m", "supervisor.cli.main", "--log-json"]  # a real process: its log is on stderr
    dry = subprocess.run(
        [*exe, "checkpoints", "gc", str(root), "--keep", "1", "--dry-run"], capture_output=True, text=True
    )
    assert dry.returncode == 0 and dry.stdout.startswith("would delete [50, 100, 150]; kept [200]"), (
        dry.stdout
    )
    logged = [json.loads(line) for line in dry.stderr.splitlines() if line.startswith("{")]
    retention = [e for e in logged if "retention" in e.get("event", "")]
    assert retention and all("deleted" not in e and e["would_delete"] == [50, 100, 150] for e in retention)
    assert store.steps() == [50, 100, 150, 200]

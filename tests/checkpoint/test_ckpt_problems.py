"""Damaged pointers and manifests are shown as problems; a checkpoint that fails a check is quarantined (issue 29, 5 and 8)."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.checkpoint import CheckpointStore, verify
from supervisor.cli.main import cli
from supervisor.core.model import HealthMark
from supervisor.errors import CheckpointError
from supervisor.storage import open_backend
from tests.checkpoint.conftest import save_plain


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--log-level", "error", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def local(tmp_path: Path) -> tuple[Path, CheckpointStore]:
    root = tmp_path / "storage"
    store = CheckpointStore(open_backend(str(root)), "job1")
    for step in (100, 200, 300):
        save_plain(store, step)
        assert verify(store, step).ok
    return root, store


def _latest_file(root: Path) -> Path:
    return root / "job1" / "checkpoints" / "latest"


@pytest.mark.parametrize(
    "pointer",
    ['{"step": 1e400}', "[" * 100_000 + "]" * 100_000, '{"step": -3}', '{"step": 2.5}', "x" * 10_000, ""],
    ids=["1e400", "deep", "negative", "fraction", "text", "empty"],
)
def test_an_unreadable_latest_is_a_problem_not_a_traceback(
    local: tuple[Path, CheckpointStore], pointer: str
) -> None:
    root, store = local
    _latest_file(root).write_text(pointer)
    with pytest.raises(CheckpointError, match="unreadable latest pointer"):
        store.latest()
    code, out, _ = _run("checkpoints", "list", str(root), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["latest"] is None and [r["step"] for r in doc["checkpoints"]] == [100, 200, 300]
    assert len(doc["problems"]) == 1 and "unreadable latest pointer" in doc["problems"][0]


def test_a_garbage_manifest_and_a_dangling_latest_are_shown(local: tuple[Path, CheckpointStore]) -> None:
    root, store = local
    (root / "job1" / "checkpoints" / "step_00000200" / "MANIFEST.json").write_text("[" * 50_000)
    _latest_file(root).write_text('{"step": 900}')
    code, out, _ = _run("checkpoints", "list", str(root))
    assert code == 0
    text = " ".join(out.split())
    assert "problem: " in text and "step 200: " in text and "corrupt manifest" in text
    assert "names step 900, no such checkpoint" in text
    problems = store.problems()
    assert len(problems) == 2 and problems[0].startswith("step 200: ")


def test_quarantine_moves_latest_off_and_is_never_a_target(local: tuple[Path, CheckpointStore]) -> None:
    """Reported: a checkpoint whose file and checksum were rewritten to match passed verification,
    failed the restore check twice and stayed healthy and `latest`."""
    from supervisor.checkpoint.lifecycle import select_restart_target

    _, store = local
    for step in (100, 200, 300):
        store.mark(step, HealthMark.HEALTHY, "window clean")
    assert store.latest() == 300
    m = store.quarantine(300, "restore check failed: parameter fingerprint differs")
    assert m.health is HealthMark.QUARANTINED and store.manifest(300).health is HealthMark.QUARANTINED
    assert store.latest() == 200
    assert select_restart_target(store, expected_world_size=1, verify_unverified=False).step == 200  # type: ignore[union-attr]
    store.quarantine(300, "again")  # idempotent: one history entry
    assert [h.to for h in store.manifest(300).history].count(HealthMark.QUARANTINED) == 1
    store.quarantine(100, "older one too")  # latest is not touched when it names a newer good step
    assert store.latest() == 200


def test_mark_refuses_a_huge_reason_at_once(local: tuple[Path, CheckpointStore]) -> None:
    """Reported: `checkpoints mark --reason` with 100 kB of text took 57 s."""
    root, store = local
    code, _, err = _run("checkpoints", "mark", str(root), "100", "healthy", "--reason", "x" * 100_000)
    assert code == 2 and "--reason: longer than 4,000 characters" in err
    assert store.manifest(100).health is HealthMark.VERIFIED


def test_list_of_the_root_directory_is_one_line(tmp_path: Path) -> None:
    """Reported: `checkpoints list /` walked the file system into a PermissionError traceback."""
    code, _, err = _run("checkpoints", "list", "/")
    assert code == 2 and err.startswith("error: /: ")


def test_a_huge_manifest_is_refused_by_its_size(local: tuple[Path, CheckpointStore]) -> None:
    """Reported (issue 29): any 1 GiB input cost 2.1 GB of memory before it was refused."""
    root, store = local
    with open(root / "job1" / "checkpoints" / "step_00000200" / "MANIFEST.json", "r+b") as f:
        f.truncate(1 << 30)  # sparse
    with open(_latest_file(root), "r+b") as f:
        f.truncate(1 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    problems = store.problems()
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) < 100 << 10  # KiB: never read
    assert any("step 200: " in p and "larger than" in p for p in problems)
    assert any("unreadable latest pointer" in p for p in problems)
    assert [m.step for m in store.manifests()] == [100, 300]

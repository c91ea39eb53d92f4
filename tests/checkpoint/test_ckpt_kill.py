"""A writer SIGKILLed at every point of a save leaves earlier checkpoints and `latest` intact."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.checkpoint import CheckpointStore, collect_garbage, verify
from supervisor.checkpoint.store import StoreSettings
from supervisor.storage import open_backend
from tests.checkpoint.conftest import save_plain
from tests.s3support import fast_s3_settings, make_bucket

WRITER = Path(__file__).with_name("kill_writer.py")
ROOT = Path(__file__).parents[2]


def _run_and_kill(storage: str, endpoint: str, stop_at: str, tmp_path: Path) -> None:
    ready = tmp_path / f"ready-{stop_at}"
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), storage, endpoint, stop_at, str(ready)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():  # poll the writer's own signal, with a deadline
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"writer never reached {stop_at}: {proc.communicate()[1][-2000:]}")
        time.sleep(0.02)
    assert ready.read_text() == str(proc.pid), ready.read_text()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def _check_after_kill(store: CheckpointStore, stop_at: str) -> None:
    assert store.latest() == 100
    assert verify(store, 100, record=False).ok
    if stop_at == "after_manifest":
        assert store.steps() == [100, 200]  # committed, just not yet `latest`
        assert verify(store, 200, record=False).ok
    else:
        assert store.steps() == [100]
    save_plain(store, 300)  # the next save works and moves latest on
    assert store.latest() == 300
    cleaner = CheckpointStore(store.backend, store.job, StoreSettings(stale_uncommitted_s=0))
    report = collect_garbage(cleaner, keep=5)
    assert report.uploads_aborted == (1 if stop_at == "during_upload" else 0)
    leftovers = [o.key for o in store.backend.list(store.root) if ".tmp-" in o.key]
    assert leftovers == []
    if stop_at != "after_manifest":
        assert 200 not in store.step_dirs()


@pytest.mark.parametrize("stop_at", ["during_shard", "before_manifest", "during_manifest", "after_manifest"])
def test_local_writer_killed(stop_at: str, tmp_path: Path) -> None:
    storage = str(tmp_path / "storage")
    store = CheckpointStore(open_backend(storage), "job1")
    save_plain(store, 100)
    _run_and_kill(storage, "-", stop_at, tmp_path)
    _check_after_kill(store, stop_at)


@pytest.mark.parametrize("stop_at", ["during_upload", "before_manifest", "after_manifest"])
def test_s3_writer_killed(stop_at: str, s3_endpoint: str, tmp_path: Path) -> None:
    storage = make_bucket(s3_endpoint) + "/runs"
    store = CheckpointStore(open_backend(storage, settings=fast_s3_settings(s3_endpoint)), "job1")
    save_plain(store, 100)
    _run_and_kill(storage, s3_endpoint, stop_at, tmp_path)
    _check_after_kill(store, stop_at)

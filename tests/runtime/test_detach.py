"""`launch --detach` leaves the supervisor as a detached actor on a `ray start` cluster;
`status` and `stop` reach it from other processes (as from any shell on the cluster)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import yaml

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "supervisor"), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _stop_cluster_under(root: str) -> None:
    """Stop the `ray start` head whose files live under `root`: its daemons (found by that path
    on their command lines) and everything they started, by PID. `ray stop` would kill every
    Ray process on the machine, other people's included."""
    daemons = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == os.getpid():
            continue
        with contextlib.suppress(psutil.Error):
            if any(root in part for part in proc.info["cmdline"] or ()):
                daemons.append(proc)
    procs = {p.pid: p for d in daemons for p in [d, *_children(d)]}
    for proc in procs.values():
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    # A draining raylet can take Ray's whole 16-s stop grace; the test's cluster has nothing to keep.
    _, alive = psutil.wait_procs(list(procs.values()), timeout=3)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=15)


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


@pytest.fixture()
def private_cluster_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Ray's files (and so its `ray start` head, found through them) in a directory of this test's
    own: the CLI processes start and join only that head, and the test stops only that one."""
    root = tempfile.mkdtemp(prefix="rdt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    monkeypatch.setenv("RAY_TMPDIR", root)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    try:
        yield root
    finally:
        _stop_cluster_under(root)
        shutil.rmtree(root, ignore_errors=True)


def test_detached_supervisor_is_followed_and_stopped_from_other_processes(
    tmp_path: Path, private_cluster_dir: str
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "name": "detached",
                "entrypoint": "examples.tinylm.train:main",
                "config": {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2},
                           "data": {"max_bytes_per_source": 100_000}},
                "resources": {"num_workers": 2},
                "storage": {"path": str(tmp_path / "store")},
                "checkpoint": {"every_steps": 20},
                "max_steps": 120,
            }
        )
    )  # fmt: skip
    started = _cli("launch", str(job), "--detach")
    assert started.returncode == 0, started.stderr
    assert "running (detached)" in started.stdout
    deadline = time.monotonic() + 240
    while True:
        st = _cli("status", "detached", "--json", timeout=60)
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        if status["terminal"] or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert status["phase"] == "finished" and status["step"] == 120, status
    listed = _cli("status", "--json", timeout=60)
    assert "detached" in {s["job"] for s in json.loads(listed.stdout)}
    stopped = _cli("stop", "detached", timeout=180)
    assert stopped.returncode == 0 and "finished at step 120" in stopped.stdout, stopped.stderr
    gone = _cli("status", "detached", "--json", timeout=60)
    assert gone.returncode == 2 and "no supervisor running" in gone.stderr

"""`launch --detach` joins the head the last `ray start` wrote down, never whatever Ray process
Ray's `auto` happens to find on the machine (seen: a detach test joined a benchmark's private
Ray instance and ran its job there)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from supervisor.client import cluster
from supervisor.errors import RuntimeBackendError


def test_no_address_file_means_no_head_and_a_stale_one_starts_a_new_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster._last_started_head() is None  # whatever other Ray runs here
    started: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        started.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "refused by the test\n")

    monkeypatch.setattr(cluster.subprocess, "run", fake_run)
    with pytest.raises(RuntimeBackendError, match="ray start --head"):
        cluster._ensure_local_head(4)
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:1")  # nothing listens there
    assert cluster._last_started_head() == "127.0.0.1:1"
    with pytest.raises(RuntimeBackendError, match="ray start --head"):
        cluster._ensure_local_head(4)
    assert len(started) == 2 and all("--head" in c for c in started)


def test_a_head_started_here_takes_a_free_port_when_rays_default_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Redis server (or another user's head) on 6379 made `ray start --head` fail, and with it
    `launch --detach` on that machine."""
    import socket

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        started.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(cluster.subprocess, "run", fake_run)
    with socket.socket() as held, socket.socket() as free:
        held.bind(("", 0))
        held.listen()
        monkeypatch.setattr(cluster, "GCS_PORT", held.getsockname()[1])  # another program listens there
        assert cluster._ensure_local_head(4)
        free.bind(("", 0))
        port = free.getsockname()[1]
    monkeypatch.setattr(cluster, "GCS_PORT", port)  # nothing listens there now
    assert cluster._ensure_local_head(4)
    assert "--port=0" in started[0] and not any(c.startswith("--port") for c in started[1])

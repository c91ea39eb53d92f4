"""`launch --detach` joins the head the last `ray start` wrote down, never whatever Ray process
Ray's `auto` happens to find on the machine (seen: a detach test joined a benchmark's private
Ray instance and ran its job there)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from supervisor.errors import RuntimeBackendError
from supervisor.runtime import cluster


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

"""`launch --detach` leaves the supervisor as a detached actor on a `ray start` cluster;
`status` and `stop` reach it from other processes (as from any shell on the cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "supervisor"), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture()
def no_running_cluster() -> Iterator[None]:
    """This test starts (and at the end stops) the machine's `ray start` head: never someone else's."""
    probe = subprocess.run([str(BIN / "ray"), "status"], capture_output=True, text=True, check=False)
    if probe.returncode == 0:
        pytest.skip("a Ray cluster started with `ray start` is already running here; not touching it")
    try:
        yield
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, check=False)


def test_detached_supervisor_is_followed_and_stopped_from_other_processes(
    tmp_path: Path, no_running_cluster: None
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

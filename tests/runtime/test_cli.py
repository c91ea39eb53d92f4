"""`supervisor launch / status / stop` as a person uses them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from tests.runtime.conftest import FAST, make_job, wait_for


def test_launch_bad_job_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nentrypoint: examples.tinylm.train:main\nmax_steps: 0\nstorage: {path: /tmp}\n")
    result = CliRunner().invoke(cli, ["launch", str(bad)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [f"error: {bad}: max_steps: must be >= 1 (got 0)"]


def test_attach_without_file_or_cluster_job_is_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["launch"])
    assert result.exit_code == 2


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_status_and_stop_from_the_cli(tmp_path: Path) -> None:
    from supervisor.client import api

    job = make_job(tmp_path, "clistop", max_steps=5000)
    handle = api.launch(job, FAST)
    wait_for(lambda: api.status(handle), lambda s: s["step"] >= 10, 240)
    result = CliRunner().invoke(cli, ["status", "clistop", "--json"])
    assert result.exit_code == 0, result.output
    st = json.loads(result.output)
    assert st["job"] == "clistop" and st["phase"] == "running" and st["max_steps"] == 5000
    result = CliRunner().invoke(cli, ["stop", "clistop", "--timeout", "120"])
    assert result.exit_code == 0, result.output
    assert "clistop: stopped" in result.output
    assert api.list_jobs() == []


# A foreground `supervisor launch job.yaml` that finishes and exits 0 is run end to end by
# tests/foundation/test_ray_address.py::test_launch_runs_on_a_fresh_local_ray_beside_the_head
# (the same subprocess and code path: a fresh in-process local Ray whether or not a head runs).

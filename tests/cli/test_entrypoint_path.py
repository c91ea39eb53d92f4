"""A relative `entrypoint:` is relative to the directory `supervisor launch` runs in, where the
ranks start -- not to the job file. `validate` accepted a script that was only next to the job
file, and the ranks then failed with "script not found"."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.errors import ConfigError
from supervisor.ranks.entrypoint import resolve


def test_relative_to_where_launch_runs_not_to_the_job_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "train.py").write_text("def main(config, ctx):\n    return 'trained'\n")
    job = sub / "job.yaml"
    job.write_text(f"name: j\nentrypoint: train.py\nmax_steps: 5\nstorage: {{path: {tmp_path / 's'}}}\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="script not found: train.py"):  # what a rank does here
        resolve("train.py")
    res = CliRunner().invoke(cli, ["validate", str(job)])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "next to the job file" in res.stderr and "name the script as sub/train.py" in res.stderr
    job.write_text(job.read_text().replace("entrypoint: train.py", "entrypoint: sub/train.py"))
    assert CliRunner().invoke(cli, ["validate", str(job)]).exit_code == 0
    assert resolve("sub/train.py")({}, None) == "trained"  # and the ranks find it
    monkeypatch.chdir(sub)  # or launch from the script's folder
    assert resolve("train.py")({}, None) == "trained"

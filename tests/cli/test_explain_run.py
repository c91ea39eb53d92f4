"""`policy explain` reads a run as `analyze` does: every rank file given (``--trace`` repeated),
or the run's folder. A second ``--trace`` used to replace the first silently, and a folder was
refused although `analyze` takes it."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from supervisor.cli.main import cli
from tests.policy.test_explain_cli import write_divergence_trace


def _rank_files(folder: Path) -> list[Path]:
    """One divergence run of 2 ranks, written as the runtime writes it: one file per rank."""
    both = folder / "both.jsonl"
    write_divergence_trace(both)
    rows = [json.loads(x) for x in both.read_text().splitlines()]
    both.unlink()
    out = []
    for rank in (0, 1):
        path = folder / f"run.rank{rank}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows if r["rank"] == rank))
        out.append(path)
    return out


def _explain(*args: str) -> dict:
    res = CliRunner().invoke(cli, ["--log-level", "error", "policy", "explain", "default", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _analyze(*args: str) -> dict:
    res = CliRunner().invoke(cli, ["--log-level", "error", "analyze", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_every_rank_file_is_read_and_a_folder_like_analyze(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    r0, r1 = _rank_files(run)
    total = sum(len(p.read_text().splitlines()) for p in (r0, r1))  # independent count
    two = _explain("--trace", str(r0), "--trace", str(r1))
    assert two["trace"]["records"] == total
    assert two["trace"]["paths"] == [str(r0), str(r1)]
    folder = _explain("--trace", str(run))
    assert folder["trace"]["records"] == total
    # The same incidents analyze finds on the same run.
    onsets = [i["diagnosis"]["onset_step"] for i in folder["incidents"]]
    assert onsets and onsets == [d["onset_step"] for d in _analyze(str(run))["incidents"]]
    assert [i["diagnosis"]["onset_step"] for i in two["incidents"]] == onsets

"""`supervisor analyze`: the JSON contract, the human table, the plot, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.traces.synthetic import at, set_loss, synthetic_records

CONTRACT = {
    "onset_step", "peak_step", "end_step", "phenotype", "period", "nonfinite", "nonfinite_at", "rank_local",
    "first_rank", "after_resume", "source_local", "causes", "suspect_samples", "severity",
}  # fmt: skip


def _trace(tmp_path: Path) -> Path:
    recs = synthetic_records(300, 2, seed=1)
    (bad,) = at(recs, 250, rank=1)
    set_loss(bad, 9.0)
    for r in at(recs, 250):
        r.grad_norm = (r.grad_norm or 1.0) * 12
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in recs) + "garbage line\n")
    return path


def test_json_output_is_the_contract(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["analyze", "--json", str(_trace(tmp_path))])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert set(out) == {"incidents", "benign_shifts", "skipped_lines"}
    assert out["skipped_lines"] == 1
    (inc,) = out["incidents"]
    assert set(inc) >= CONTRACT
    assert isinstance(inc["onset_step"], int) and inc["severity"] in ("low", "medium", "high", "critical")
    assert inc["first_rank"] == 1 and inc["suspect_samples"] == ["s250r1i0", "s250r1i1"]
    for c in inc["causes"]:
        assert set(c) == {"cause", "score", "evidence"} and isinstance(c["score"], float)


def test_human_output_has_a_table_with_evidence(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["analyze", str(_trace(tmp_path))])
    assert res.exit_code == 0, res.output
    assert "1 incident(s)" in res.output and "transient" in res.output
    assert "rank 1 loss 9" in res.output  # evidence with numbers


def test_plot_writes_a_png(tmp_path: Path) -> None:
    png = tmp_path / "plot.png"
    res = CliRunner().invoke(cli, ["analyze", str(_trace(tmp_path)), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_or_unparsable_trace_is_one_line_exit_2(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["analyze", str(tmp_path / "absent.jsonl")])
    assert res.exit_code == 2
    assert res.output.strip().count("\n") == 0 and "absent.jsonl: file not found" in res.output
    prose = tmp_path / "notes.md"
    prose.write_text("no iterations here\n")
    res = CliRunner().invoke(cli, ["analyze", str(prose)])
    assert res.exit_code == 2 and "no parsable line" in res.output


def test_format_can_be_forced(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(f"iter {i}: loss {3.0 - i * 0.001:.4f}, time 10.0ms\n" for i in range(100)))
    res = CliRunner().invoke(cli, ["analyze", "--json", "--format", "nanogpt", str(log)])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["incidents"] == []
    res = CliRunner().invoke(cli, ["analyze", "--json", "--format", "megatron", str(log)])
    assert res.exit_code == 2


def test_fail_on_exit_codes(tmp_path: Path) -> None:
    trace = _trace(tmp_path)  # one rank-local bad batch: an incident of medium or more
    found = CliRunner().invoke(cli, ["analyze", "--json", "--fail-on", "medium", str(trace)])
    assert found.exit_code == 1, found.output
    assert json.loads(found.output)["incidents"]  # the report is printed before the exit
    above = CliRunner().invoke(cli, ["analyze", "--fail-on", "critical", str(trace)])
    assert above.exit_code == 0, above.output
    bad = CliRunner().invoke(cli, ["analyze", "--fail-on", "low", str(tmp_path / "absent.jsonl")])
    assert bad.exit_code == 2


def test_rank_files_and_a_directory_are_one_run(tmp_path: Path) -> None:
    recs = json.loads("[" + ",".join(_trace(tmp_path).read_text().splitlines()[:-1]) + "]")
    run = tmp_path / "run"
    run.mkdir()
    for rank in (0, 1):
        (run / f"rank{rank}.jsonl").write_text("\n".join(json.dumps(r) for r in recs if r["rank"] == rank))
    files = CliRunner().invoke(cli, ["analyze", "--json", str(run / "rank0.jsonl"), str(run / "rank1.jsonl")])
    folder = CliRunner().invoke(cli, ["analyze", "--json", str(run)])
    assert files.exit_code == folder.exit_code == 0, files.output + folder.output
    a, b = json.loads(files.output), json.loads(folder.output)
    assert a == b and a["incidents"][0]["first_rank"] == 1


def test_map_option_names_the_loss_column(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,objective\n" + "".join(f"0,{i},{2.0 + (i % 3) * 0.01}\n" for i in range(80)))
    res = CliRunner().invoke(cli, ["analyze", "--json", "--map", "loss=objective", str(path)])
    assert res.exit_code == 0, res.output
    bad = CliRunner().invoke(cli, ["analyze", "--map", "loss", str(path)])
    assert bad.exit_code == 2 and "FIELD=NAME" in bad.output

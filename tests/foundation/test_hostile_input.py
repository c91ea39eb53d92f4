"""Hostile input a new user hands the CLI (session 5 audit): one line naming file and field,
exit code 2, no traceback, bounded time and memory. Fast: every command runs in this process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.config.loader import parse_yaml
from supervisor.errors import ConfigError

JOB = "name: t\nentrypoint: m:f\nstorage: {path: runs}\nmax_steps: 10\n"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    res = CliRunner().invoke(cli, list(args), prog_name="supervisor")
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return subprocess.CompletedProcess(list(args), res.exit_code, "", res.output)


def _one_error_line(done: subprocess.CompletedProcess[str], needle: str) -> str:
    assert done.returncode == 2, done.stderr[-1500:]
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], done.stderr[-1500:]
    return lines[0]


def test_duplicate_keys_are_refused_with_their_path(tmp_path: Path) -> None:
    top = tmp_path / "top.yaml"
    top.write_text("name: a\n" + JOB)  # PyYAML alone keeps the last `name` silently
    line = _one_error_line(_run("validate", str(top)), f"{top}: name: duplicate key at line 2, column 1")
    assert "already set at line 1" in line
    nested = tmp_path / "nested.yaml"
    nested.write_text(JOB + "resources:\n  num_workers: 1\n  num_workers: 2\n")
    _one_error_line(_run("validate", str(nested)), "resources.num_workers: duplicate key at line 7")
    _one_error_line(_run("policy", "validate", str(top)), "name: duplicate key")
    in_list = "faults:\n  - {kind: lr_spike, step: 3, step: 4}\n"
    with pytest.raises(ConfigError, match=r"faults\.0\.step: duplicate key"):
        parse_yaml(in_list, source="j.yaml")
    # a merge key's values may still be overridden by the mapping's own keys
    merged = parse_yaml("b: &b {lr: 1, wd: 2}\nc:\n  <<: *b\n  lr: 3\n", source="j.yaml")
    assert merged["c"] == {"lr": 3, "wd": 2}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["validate", "{tmp}"], "is a directory. (see 'supervisor validate --help')"),
        (["launch"], "give a job file, or --attach JOB"),
        (["incidents", "list", "--limit", "abc"], "'abc' is not a valid integer"),
        (["--log-level", "loud", "validate", "x"], "'loud' is not one of"),
        (["policy", "nosuch"], "No such command 'nosuch'"),
        (["analyze"], "Missing argument 'TRACES...'"),
    ],
)
def test_click_usage_errors_are_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    """click prints usage, a hint and the error on three lines; the bar is one line, exit 2."""
    _one_error_line(_run(*[a.replace("{tmp}", str(tmp_path)) for a in args]), needle)


def test_a_bare_group_still_prints_its_help() -> None:
    done = _run("policy")
    assert done.returncode == 2 and "Commands:" in done.stderr and "explain" in done.stderr


def test_a_huge_line_in_a_trace_is_skipped_not_parsed(tmp_path: Path) -> None:
    """A 1 GB single line took minutes and ~10 GB (format regexes, json.loads); now each line over
    MAX_LINE_CHARS is skipped and counted, and a file of only such lines is one line, exit 2."""
    from supervisor.traces import MAX_LINE_CHARS, parse_text

    huge = '{"step": 5, "loss": 1.0, "x": [' + "0," * (MAX_LINE_CHARS // 2) + "0]}"
    good = [f'{{"step": {i}, "loss": {2.0 - i / 100}}}' for i in range(1, 61)]
    data = parse_text("\n".join(good[:30] + [huge] + good[30:]) + "\n", "auto", "t.jsonl")
    assert [r.step for r in data.records] == list(range(1, 61))
    assert data.skipped_lines == 1 and any("longer than" in n for n in data.notes)
    only = tmp_path / "only.jsonl"
    only.write_text(huge + "\n" + huge[:-5])  # and a truncated last line
    _one_error_line(_run("analyze", str(only)), f"{only}: no parsable line")
    assert "lines longer than 1,048,576 characters are skipped" in _run("analyze", str(only)).stderr


def test_analyze_of_a_huge_tree_or_a_symlink_loop_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`analyze /` walked the whole filesystem (/proc included) looking for TensorBoard files."""
    from supervisor.traces import tensorboard

    monkeypatch.setattr(tensorboard, "MAX_WALK_ENTRIES", 50)
    tree = tmp_path / "home"
    for i in range(8):
        (tree / f"d{i}").mkdir(parents=True)
        for j in range(8):
            (tree / f"d{i}" / f"f{j}.txt").write_text("x")
    _one_error_line(_run("analyze", str(tree)), f"{tree}: more than 50 entries under this directory")
    _one_error_line(_run("analyze", "--format", "tensorboard", str(tree)), "more than 50 entries")
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    _one_error_line(_run("analyze", str(loop)), f"{loop}: cannot read: Too many levels of symbolic links")
    _one_error_line(_run("validate", str(loop)), f"{loop}: cannot read: Too many levels of symbolic links")


def test_incident_report_never_overwrites_the_database(tmp_path: Path) -> None:
    """`incidents report 1 -o incidents.sqlite` replaced the database with the report (data lost);
    an id or --limit past SQLite's integers was a traceback (OverflowError) or exit 3."""
    import hashlib

    from supervisor.incidents import IncidentStore
    from tests.incidents.builders import full_incident

    db = tmp_path / "incidents.sqlite"
    store = IncidentStore(db)
    inc = full_incident(store)
    store.close()
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("{path: runs}", f"{{path: {tmp_path}}}"))
    other = tmp_path / "other.sqlite"
    other.write_bytes(db.read_bytes())
    before = {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in (db, job, other)}
    reads = "names a file this command reads (the database or the job file); refusing to overwrite it"
    for target, needle in ((db, reads), (Path(f"{db}-wal"), reads), (job, reads),
                           (other, "is a SQLite database; refusing to overwrite it")):  # fmt: skip
        args = ["incidents", "report", str(inc), "--job", str(job), "--format", "md", "-o", str(target)]
        _one_error_line(_run(*args), f"{target}: --output: {needle}")
        if target != job:  # with --db alone the job file is not an input
            args = ["incidents", "report", str(inc), "--db", str(db), "--format", "md", "-o", str(target)]
            _one_error_line(_run(*args), f"{target}: --output: {needle}")
    assert before == {f: hashlib.sha256(f.read_bytes()).hexdigest() for f in before}
    report = tmp_path / "r.md"
    for _ in range(2):  # an existing report of the person's is replaced whole
        done = _run("incidents", "report", str(inc), "--db", str(db), "--format", "md", "-o", str(report))
        assert done.returncode == 0 and report.read_text().startswith(f"# Incident {inc}")
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm")))
    assert left == ["incidents.sqlite", "job.yaml", "other.sqlite", "r.md"]  # no temporary file left
    for args in (["show", str(10**40)], ["report", str(10**40)], ["list", "--limit", str(10**30)]):
        _one_error_line(_run("incidents", *args, "--db", str(db)), "is not in the range 0<=x<=")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        # `gc --keep -1` deleted more healthy checkpoints than the default keeps
        (["checkpoints", "gc", "{tmp}", "--keep", "-1", "--dry-run"], "-1 is not in the range 1<=x<=1000000"),
        (["checkpoints", "verify", "{tmp}", "--world-size", "-1"], "-1 is not in the range 1<="),
        (
            ["checkpoints", "mark", "{tmp}", str(10**30), "healthy", "--reason", "x"],
            "not in the range 0<=x<=",
        ),
        # a job name with '..' reached storage as a key (exit 3: "key escapes the storage root")
        (["checkpoints", "list", "{tmp}", "--job", "../.."], "'../..' is not a job name"),
        (["logs", "{tmp}", "--job", "../../etc"], "'../../etc' is not a job name"),
        (["status", "../x", "--address", "127.0.0.1:1"], "'../x' is not a job name"),
        (["launch", "--attach", "a b"], "'a b' is not a job name"),
        (["status", "--address", "ht!tp://::::"], "is not a Ray address"),  # was exit 3, "unreachable"
        (["stop", "x", "--address", "host:port:9"], "is not a Ray address"),
        # nan passes every range comparison; a negative --interval was a traceback from time.sleep
        (["logs", "{tmp}", "--job", "x", "-f", "--interval", "nan"], "'nan' is not a finite number"),
        (["logs", "{tmp}", "--job", "x", "-f", "--interval", "-1"], "-1.0 is not in the range 0.05<=x<=3600"),
        (["stop", "x", "--timeout", "nan", "--address", "127.0.0.1:1"], "'nan' is not a finite number"),
        (["policy", "explain", "default", "--trace", "t.jsonl", "--grad-clip", "nan"], "not a finite number"),
        (["analyze", "t.jsonl", "--min-history", str(10**30)], "not in the range 2<=x<="),
    ],
)
def test_numbers_and_names_on_the_command_line_are_checked_first(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    """Checked by click before any file, storage or Ray is touched: one line, exit 2."""
    _one_error_line(_run(*[a.replace("{tmp}", str(tmp_path)) for a in args]), needle)
    assert list(tmp_path.iterdir()) == []  # nothing created in the storage folder


def test_odd_characters_in_a_path_stay_on_the_one_line(tmp_path: Path) -> None:
    """A file name with a newline printed two lines (the second could read `error: fake.yaml: ...`);
    a terminal escape reached the terminal raw."""
    missing = tmp_path / "zz\nerror: fake.yaml"
    line = _one_error_line(_run("validate", str(missing)), "zz\\nerror: fake.yaml: file not found")
    assert "\x1b" not in line
    folder = tmp_path / "a\x1b[31mdir"
    folder.mkdir()
    line = _one_error_line(_run("validate", str(folder)), "a\\x1b[31mdir' is a directory")
    odd = tmp_path / "job \u00e9 #1.yaml"  # printable non-ASCII stays as it is
    odd.write_text(JOB.replace("max_steps: 10", "max_steps: -1"))
    _one_error_line(_run("validate", str(odd)), f"{odd}: max_steps: must be >= 1 (got -1)")


def test_an_oversized_file_is_refused_by_its_size_before_reading(tmp_path: Path) -> None:
    """A 2 GB trace was read up to the 1 GiB limit (1.1 GB resident, seconds) before being refused."""
    import resource

    from supervisor.config.loader import read_bytes
    from supervisor.errors import TraceError

    sparse = tmp_path / "big.jsonl"
    with open(sparse, "wb") as fh:
        fh.truncate(3 << 30)  # sparse: no disk used
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TraceError, match="larger than 1,073,741,824 bytes"):
        read_bytes(sparse, error=TraceError, expected="a trace file", max_bytes=1 << 30)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: nothing read
    _one_error_line(_run("analyze", str(sparse)), "larger than")


def test_a_missing_entrypoint_script_is_found_by_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`entrypoint: trian.py` passed `validate`; `launch` started Ray and its workers to fail there."""
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.yaml"
    for entry in ("trian.py", "python trian.py --lr 3e-4"):
        job.write_text(JOB.replace("m:f", entry))
        _one_error_line(
            _run("validate", str(job)), f"{job}: entrypoint: script 'trian.py' not found in {tmp_path}"
        )
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text("def main(config, ctx):\n    pass\n")
    nested = tmp_path / "sub" / "job.yaml"
    nested.write_text(JOB.replace("m:f", "train.py"))  # relative to where launch runs, not the job file
    _one_error_line(_run("validate", str(nested)), "is next to the job file but not in")
    nested.write_text(JOB.replace("m:f", "sub/train.py"))
    assert _run("validate", str(nested)).returncode == 0
    remote = JOB.replace("m:f", "trian.py") + "ray: {address: 'head:6379'}\n"
    job.write_text(remote)  # a cluster may hold files this machine lacks: not checked
    assert _run("validate", str(job)).returncode == 0


def test_hostile_environment_settings_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """$SUPERVISOR_MAX_INPUT_BYTES=abc was a traceback at import (every command, even --help);
    $SUPERVISOR_INCIDENT_DB naming a folder was exit 3 'disk I/O error'."""
    import os
    import sys

    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(f'{{"step": {i}, "loss": 2.0}}\n' for i in range(1, 30)))
    env = {**os.environ, "SUPERVISOR_MAX_INPUT_BYTES": "abc"}
    done = subprocess.run([sys.executable, "-m", "supervisor.cli.main", "analyze", str(trace)],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    _one_error_line(done, "$SUPERVISOR_MAX_INPUT_BYTES: must be a whole number of bytes >= 1 (got 'abc')")
    monkeypatch.setenv("SUPERVISOR_INCIDENT_DB", str(tmp_path))
    _one_error_line(_run("incidents", "list"), f"{tmp_path}: is a directory, expected an incident database")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl"]


def test_a_wide_yaml_file_is_refused_quickly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flat 8 MB job.yaml (500k keys, no aliases) ran past 20 s in PyYAML before any limit applied."""
    from supervisor.config import loader

    wide = tmp_path / "wide.yaml"
    wide.write_text("".join(f"k{i}: {i}\n" for i in range(1_000_000)))  # ~12 MB
    _one_error_line(_run("validate", str(wide)), f"larger than {loader.MAX_YAML_BYTES:,} bytes")
    monkeypatch.setattr(loader, "MAX_NODES", 1000)  # the real 200,000 takes PyYAML seconds to reach
    with pytest.raises(ConfigError, match="more than 1,000 values at line 1, column 2000"):
        parse_yaml("[" + "1," * 5000 + "1]", source="x.yaml")  # refused while parsing, not after


_DEEP = "[" * 5000 + "]" * 5000  # 10 KB: far under every size limit, deeper than json's C decoder goes
_ROWS = "".join(f'{{"step": {s}, "loss": {3.0 - s / 100}}}\n' for s in range(100))


@pytest.mark.parametrize(
    ("name", "content", "fmt"),
    [
        ("t.jsonl", _ROWS + '{"step": 5, "loss": 1.0, "attrs": ' + _DEEP + "}\n", "auto"),
        ("trainer_state.json", '{"log_history": ' + _DEEP + "}", "hf_trainer"),
        ("wandb.json", _DEEP, "wandb"),
        ("metrics.csv", "step,loss,sources\n" + "".join(f"{s},{3 - s / 100},{{}}\n" for s in range(99)) + f'99,1.0,"{_DEEP}"\n', "csv"),
    ],
    ids=["jsonl-line", "hf-trainer", "wandb", "csv-cell"],
)  # fmt: skip
def test_deeply_nested_json_in_a_trace_is_skipped_or_one_line(
    tmp_path: Path, name: str, content: str, fmt: str
) -> None:
    """Reported (issue 29): JSON nested deeply was a RecursionError traceback in 4 trace readers."""
    path = tmp_path / name
    path.write_text(content)
    done = _run("analyze", str(path), "--format", fmt, "--json")
    if done.returncode == 2:
        _one_error_line(done, str(path))
    else:
        assert done.returncode in (0, 1), done.stderr


def test_json_output_to_a_full_device_is_one_line(tmp_path: Path) -> None:
    """Reported (issue 29): `--json > /dev/full` was a traceback."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(_ROWS)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.cli.main", "analyze", str(trace), "--json"],
            stdout=full, stderr=subprocess.PIPE, text=True, timeout=120,
        )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 3 and lines == [
        "error: <stdout>: cannot write the output: No space left on device"
    ], done.stderr

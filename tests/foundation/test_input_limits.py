"""The shared file reader under hostile input: one line, exit 2, bounded time and memory (issue 18).

Each case is one the issue reported: a FIFO hung forever, /dev/zero was read whole, a 1 MB
gzip bomb reached 2.1 GB, a corrupt gzip raised zlib.error, YAML nested 100k deep raised
RecursionError, billion-laughs aliases passed `validate`, a 5000-digit integer raised ValueError.
"""

from __future__ import annotations

import gzip
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.config.loader import MAX_DEPTH, MAX_YAML_BYTES, parse_yaml, read_bytes, read_yaml
from supervisor.errors import ConfigError, TraceError

JOB = "name: t\nentrypoint: m:f\nstorage: {path: runs}\nmax_steps: 10\n"


def _cli(*args: str, mem_mb: int = 1536, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The real console entry point under an address-space limit: a blow-up is a MemoryError, not a swapped box."""

    def limit() -> None:
        cap = mem_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli.main", *args],
        capture_output=True, text=True, timeout=timeout, preexec_fn=limit,
    )  # fmt: skip


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """The same command in this process (fast): exit code and stderr as the console script gives them."""
    res = CliRunner().invoke(cli, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception
    return subprocess.CompletedProcess(list(args), res.exit_code, "", res.output)


def _one_error_line(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 2, done.stderr[-1500:]
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and needle in lines[0], done.stderr[-1500:]


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    for args in (["validate", str(fifo)], ["analyze", str(fifo)], ["policy", "validate", str(fifo)]):
        _one_error_line(_run(*args), "is a FIFO (named pipe)")


def test_fifo_swapped_in_after_stat_does_not_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Second line of defence: a FIFO that got past ``stat`` is opened O_NONBLOCK and refused by ``fstat``."""
    import supervisor.config.loader as loader

    regular = tmp_path / "regular"
    regular.write_text("x")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    real_stat = os.stat
    monkeypatch.setattr(loader.os, "stat", lambda p, *a, **k: real_stat(regular if Path(p) == fifo else p))
    with pytest.raises(ConfigError, match="is a FIFO"):
        read_bytes(fifo, error=ConfigError, expected="a YAML file")


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom", "/dev/null"])
def test_devices_are_refused(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"{device} missing")
    with pytest.raises(ConfigError, match="is a character device"):
        read_yaml(device)
    with pytest.raises(TraceError, match="is a character device"):
        read_bytes(device, error=TraceError, expected="a trace file")


def test_devices_through_the_cli() -> None:
    _one_error_line(_run("analyze", "/dev/zero"), "is a character device")
    _one_error_line(_run("validate", "/dev/urandom"), "is a character device")


def test_oversized_files_stop_at_the_limit(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (MAX_YAML_BYTES + 10))
    with pytest.raises(ConfigError, match=f"larger than {MAX_YAML_BYTES:,} bytes"):
        read_yaml(big)
    with pytest.raises(ConfigError, match=f"larger than {MAX_YAML_BYTES:,} characters"):
        parse_yaml("a: 1\n" * (MAX_YAML_BYTES // 5 + 1), source="--set a")  # a --set value
    with pytest.raises(TraceError, match="larger than 1,000 bytes"):
        read_bytes(big, error=TraceError, expected="x", max_bytes=1000)


def test_gzip_bomb_is_refused_early_and_small(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb", compresslevel=9) as out:
        chunk = b"\0" * (1 << 20)
        for _ in range(64):  # 64 MiB of zeros -> ~65 KB on disk (ratio ~1000x)
            out.write(chunk)
    assert bomb.stat().st_size < 1 << 20
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(TraceError, match="expands more than 200x"):
        read_bytes(bomb, error=TraceError, expected="a trace file")
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 200, grown_mb
    _one_error_line(_cli("analyze", str(bomb), mem_mb=1024), "decompression bomb")


def test_gzip_round_trip_and_corrupt_gzip(tmp_path: Path) -> None:
    good = tmp_path / "t.jsonl.gz"
    good.write_bytes(gzip.compress(b'{"step": 1, "loss": 2.0}\n' * 100))
    assert read_bytes(good, error=TraceError, expected="x").count(b"\n") == 100
    corrupt = tmp_path / "c.jsonl.gz"
    corrupt.write_bytes(good.read_bytes()[:40] + b"\xff" * 64)
    with pytest.raises(TraceError, match="corrupt gzip data"):
        read_bytes(corrupt, error=TraceError, expected="x")
    _one_error_line(_run("analyze", str(corrupt)), "corrupt gzip data")


def test_deep_yaml_is_refused_before_recursion(tmp_path: Path) -> None:
    deep = tmp_path / "job.yaml"
    deep.write_text(JOB + "config: " + "[" * 100_000 + "]" * 100_000 + "\n")
    _one_error_line(_run("validate", str(deep)), f"nested deeper than {MAX_DEPTH} levels at line 5")
    flow = "{a: " * 50_000 + "1" + "}" * 50_000
    with pytest.raises(ConfigError, match="nested deeper"):
        parse_yaml(flow, source="x")
    fine = "a: " + "[" * (MAX_DEPTH - 2) + "1" + "]" * (MAX_DEPTH - 2)
    assert parse_yaml(fine, source="x") is not None


def test_alias_bombs_and_recursive_aliases(tmp_path: Path) -> None:
    laughs = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    bomb = tmp_path / "job.yaml"
    bomb.write_text(JOB + "config:\n" + "".join(f"  {line}\n" for line in laughs))
    _one_error_line(_cli("validate", str(bomb), mem_mb=1024, timeout=30), "values once aliases are expanded")
    with pytest.raises(ConfigError, match="recursive alias"):
        parse_yaml("a: &a [1, *a]", source="x")
    deep_by_alias = ["l0: &l0 [1]"] + [f"l{i}: &l{i} [[[[[[[[[[*l{i - 1}]]]]]]]]]]" for i in range(1, 10)]
    with pytest.raises(ConfigError, match="deeper than 64 levels once aliases are expanded"):
        parse_yaml("\n".join(deep_by_alias), source="x")
    # Ordinary anchors still work: shared defaults.
    assert parse_yaml("d: &d {lr: 1}\nx: *d\ny: {<<: *d, wd: 0}", source="x")["y"] == {"lr": 1, "wd": 0}


def test_huge_integers_and_non_finite_numbers(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB.replace("max_steps: 10", "max_steps: " + "9" * 5000))
    _one_error_line(_run("validate", str(job)), "integer with 5000 digits (at most 100)")
    for extra, needle in (
        ("telemetry: {z_threshold: 1e308}", "telemetry.z_threshold: must be <="),
        ("telemetry: {z_threshold: .inf}", "telemetry.z_threshold: input should be a finite number"),
        (
            "runtime: {directive_timeout_s: .nan}",
            "runtime.directive_timeout_s: input should be a finite number",
        ),
        ("resources: {num_workers: 1000000000000}", "resources.num_workers: must be <= 65536"),
        ("resources: {num_workers: 1e12}", "resources.num_workers: input should be a valid integer"),
    ):
        job.write_text(JOB + extra + "\n")
        with pytest.raises(ConfigError) as err:
            from supervisor.config.job import load_job

            load_job(job)
        assert needle in str(err.value), err.value


def test_yaml_safe_dump_of_every_good_job_still_loads(tmp_path: Path) -> None:
    doc = yaml.safe_load(JOB) | {"config": {"nested": [[1, 2], {"a": [3]}]}}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert read_yaml(path)["config"] == doc["config"]


def test_plot_to_an_unwritable_path_or_of_huge_values(tmp_path: Path) -> None:
    """Reported: `--plot` to an unwritable path or with 1e308 values raised tracebacks."""
    import json

    trace = tmp_path / "t.jsonl"
    rows = [
        {"step": s, "loss": 1e308 if s == 80 else 3.0 - s / 100, "grad_norm": 1e308 if s == 90 else 1.0}
        for s in range(120)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _one_error_line(
        _run("analyze", str(trace), "--plot", str(tmp_path / "no" / "dir" / "x.png")), "cannot write the plot"
    )
    done = _run("analyze", str(trace), "--plot", str(tmp_path / "x.png"))
    assert done.returncode in (0, 1) and (tmp_path / "x.png").stat().st_size > 0, done.stderr


def test_gzip_with_a_gib_of_zero_padding_is_refused_at_once(tmp_path: Path) -> None:
    """Reported (issue 29): a gzip followed by 1 GiB of zero padding ran past 300 s (gzip.GzipFile
    skips padding one byte per read). A few KiB of padding, as tape blocks leave, still reads."""
    body = gzip.compress(b'{"step": 1, "loss": 2.0}\n' * 100)
    padded = tmp_path / "padded.jsonl.gz"
    with open(padded, "wb") as f:
        f.write(body)
        f.truncate(len(body) + (1 << 30))  # sparse: no GiB written to this disk
    _one_error_line(_run("analyze", str(padded)), "bytes of zero padding")
    small = tmp_path / "small.jsonl.gz"
    small.write_bytes(body + b"\0" * 4096 + body)  # padding between two members, as concatenated files have
    assert read_bytes(small, error=TraceError, expected="x").count(b"\n") == 200


def test_a_gib_binary_trace_is_refused_from_its_head(tmp_path: Path) -> None:
    """Reported (issue 29): any 1 GiB input cost 2.1 GB of memory before it was refused."""
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate((1 << 30) - 16)  # under the 1 GiB input limit; sparse, all NUL bytes
    _one_error_line(_cli("analyze", str(big), mem_mb=768), "binary content")

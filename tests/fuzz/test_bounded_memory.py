"""Issue 29 point 8: hostile input costs bounded memory. A trace is streamed a line at a time
(``traces.base.TraceLines``): memory holds the records, never the whole text, its decoded copy and
a list of its lines at once (a 1 GiB valid text trace peaked at ~2 GiB); a file over the input
limit is refused by its size before anything is read, in one line naming it, exit code 2. Inputs
are small: a few MiB against a lowered limit, or a sparse file (no disk, no bytes to read)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from supervisor.cli.main import cli
from supervisor.config import loader
from supervisor.errors import TraceError
from supervisor.traces import read_trace


def peak_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def record(step: int) -> str:
    return json.dumps({"step": step, "loss": 3.0 - 0.001 * step, "grad_norm": 1.0})


def test_a_trace_is_streamed_never_held_whole(tmp_path: Path) -> None:
    # 12 MiB: 300 records among lines that carry none, and one line past MAX_LINE_CHARS.
    path = tmp_path / "noisy.jsonl"
    noise = "# " + "x" * 2000 + "\n"
    with open(path, "w", encoding="utf-8") as out:
        for step in range(300):
            out.write(record(step) + "\n")
            out.write(noise * 20)
            if step == 150:
                out.write("{" + "y" * (2 << 20) + "}\n")
    size = path.stat().st_size
    assert size > 12 << 20
    data, peak = peak_bytes(lambda: read_trace(path))
    assert [r.step for r in data.records] == list(range(300)) and data.format == "jsonl"
    assert data.skipped_lines == 6001 and any("longer than" in n for n in data.notes)
    # The 1 MiB head (as bytes and as text) and 1 MiB of a line at a time: never the file.
    assert peak < 6 << 20, f"peak {peak:,} bytes for a {size:,}-byte trace"  # was > 2x the file


def test_a_log_that_is_one_long_line_is_read_in_bounded_pieces(tmp_path: Path) -> None:
    path = tmp_path / "one-line.log"
    path.write_text("iteration 1/ 10 | lm loss: 3.0 |" + " pad" * (6 << 20) + "\n")  # 24 MiB, one line
    with pytest.raises(TraceError) as err:
        read_trace(path, "megatron")
    assert "no parsable line as megatron" in str(err.value) and "longer than" in str(err.value)
    assert str(path) in str(err.value)
    _, peak = peak_bytes(lambda: pytest.raises(TraceError, read_trace, path, "megatron"))
    assert peak < 6 << 20  # the head and one 1 MiB piece of the line at a time, never 24 MiB


def test_a_file_just_over_the_limit_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loader, "MAX_INPUT_BYTES", 64 << 10)
    path = tmp_path / "big.jsonl"
    line = record(1) + "\n"
    path.write_text(line * ((64 << 10) // len(line) + 1))
    assert path.stat().st_size > 64 << 10
    res = CliRunner().invoke(cli, ["analyze", str(path)])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert str(path) in lines[0] and "larger than 65,536 bytes" in lines[0]
    assert "Traceback" not in res.output


def test_a_sparse_file_past_the_real_limit_costs_no_memory(tmp_path: Path) -> None:
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as out:
        out.truncate(loader.MAX_INPUT_BYTES + 1)  # a hole: no disk used, nothing worth reading
    res, peak = peak_bytes(lambda: CliRunner().invoke(cli, ["analyze", str(path)]))
    assert res.exit_code == 2 and "larger than" in res.output and str(path) in res.output
    assert peak < 16 << 20

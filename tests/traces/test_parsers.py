"""Each reader on small inline samples: fields, absent values, garbage counting, auto-detection."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest

from supervisor.errors import TraceError
from supervisor.traces import ALL_FORMATS, detect_format, parse_text, read_trace

MEGATRON = """\
# Notes from the logbook
Some prose about the run.
[default7]: iteration     100/  1000 | consumed samples: 2048 | learning rate: 6.000E-05 | global batch size: 2048 | lm loss: 2.500000E+00 | loss scale: 4096.0 | grad norm: 1.250 | number of skipped iterations:   0 | number of nan iterations:   0 |
[default7]: iteration     101/  1000 | learning rate: 6.000E-05 | lm loss: 2.400000E+00 | loss scale: 4096.0 | grad norm: 1.250 | number of skipped iterations:   0 | number of nan iterations:   0 |
[2022-01-19 13:09:13,305] [INFO] [stage_1_and_2.py:1644:step] [deepscale] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 4096.0, reducing to 2048.0
 iteration     102/  1000 | learning rate: 6.000E-05 | lm loss: 2.600000E+00 | loss scale: 2048.0 | grad norm: 1.250 | number of skipped iterations:   1 | number of nan iterations:   0 |
 iteration     103/  1000 | learning rate: 6.000E-05 | loss scale: 1024.0 | grad norm: 3.000 | number of skipped iterations:   1 | number of nan iterations:   0 |
 iteration     104/  1000 | learning rate: 6.000E-05 | lm loss: 2.300000E+00 | loss scale: 1024.0 | grad norm: 0.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


def test_megatron_lines_in_prose() -> None:
    data = parse_text(MEGATRON, "auto")
    assert data.format == "megatron"
    assert [r.step for r in data.records] == [100, 101, 102, 104]
    assert data.skipped_lines == 3  # two prose lines + the iteration without `lm loss`
    r100, r101, r102, r104 = data.records
    assert (r100.loss, r100.grad_norm, r100.lr, r100.loss_scale) == (2.5, 1.25, 6e-05, 4096.0)
    assert r101.grad_norm is None  # the same grad norm printed again: stale
    assert r102.overflow and r102.grad_norm is None  # the OVERFLOW line belongs to the next iteration
    assert r104.grad_norm is None  # 0.000 means "not computed"
    assert any("103" in n for n in data.notes)


def test_megatron_excerpts_are_ordered_and_deduplicated() -> None:
    line = " iteration {s}/ 10 | lm loss: {v} | grad norm: {g} |"
    text = "\n".join(
        [line.format(s=7, v=3.0, g=1.5), line.format(s=5, v=2.0, g=1.1), line.format(s=7, v=3.5, g=1.7)]
    )
    data = parse_text(text, "megatron")
    assert [(r.step, r.loss) for r in data.records] == [(5, 2.0), (7, 3.5)]


def test_nanogpt_and_llmc_lines() -> None:
    text = "\n".join(
        [
            "iter 0: loss 10.9876, time 1234.56ms, mfu -100.00%",
            "step 0: train loss 10.98, val loss 10.99",
            "iter 1: loss nan, time 12.00ms, mfu 1.00%",
            "step    2/100 | train loss 4.250000 | norm 1.5000 | lr 6.00e-04 | 35.00 ms | 50.0% bf16 MFU",
            "s:3 trl:4.1 lr:0.0006 norm:1.2",
            "s:3 tel:4.3",
        ]
    )
    data = parse_text(text, "auto")
    assert data.format == "nanogpt"
    assert [r.step for r in data.records] == [0, 1, 2, 3]
    assert math.isnan(data.records[1].loss)
    assert (data.records[2].grad_norm, data.records[2].lr) == (1.5, 6e-4)
    assert data.records[3].grad_norm == 1.2
    assert data.skipped_lines == 2


def test_hf_trainer_state() -> None:
    state = {
        "log_history": [
            {"epoch": 0.1, "grad_norm": 1.5, "learning_rate": 5e-5, "loss": 2.5, "step": 10},
            {"epoch": 0.1, "eval_loss": 2.6, "step": 10},
            {"epoch": 0.2, "grad_norm": 2.0, "learning_rate": 5e-5, "loss": 2.4, "step": 20},
            {"train_loss": 2.45, "step": 20},
        ]
    }
    data = parse_text(json.dumps(state), "auto", "out/trainer_state.json")
    assert data.format == "hf_trainer"
    assert [(r.step, r.loss, r.grad_norm) for r in data.records] == [(10, 2.5, 1.5), (20, 2.4, 2.0)]
    assert data.skipped_lines == 2


def test_jsonl_with_nonfinite_values_and_garbage(tmp_path: Path) -> None:
    lines = [
        '{"step": 1, "rank": 0, "loss": 2.0, "grad_norm": 1.0, "samples": ["a"], "sources": {"code": {"tokens": 10, "loss_sum": 20.0}}}',
        '{"step": 1, "rank": 1, "loss": NaN, "grad_norm": Infinity}',
        "not json at all",
        '{"step": "x", "loss": 1}',
        "",
    ]
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    data = read_trace(path)
    assert data.format == "jsonl" and data.skipped_lines == 2
    assert data.records[0].sources == {"code": {"tokens": 10, "loss_sum": 20.0}}
    assert math.isnan(data.records[1].loss) and data.records[1].is_nonfinite


def test_csv_with_absent_fields() -> None:
    text = "step,rank,loss,grad_norm,samples,events\n1,0,2.5,1.0,a;b,\n2,0,2.4,,,resumed\n3,0,oops,,,\n"
    data = parse_text(text, "auto")
    assert data.format == "csv" and data.skipped_lines == 1
    assert data.records[0].samples == ["a", "b"]
    assert data.records[1].grad_norm is None and data.records[1].events == ["resumed"]


def test_auto_detection_prefers_the_most_common_form() -> None:
    assert detect_format("hello\n" + MEGATRON) == "megatron"
    assert detect_format('{"step": 1, "loss": 2}\n') == "jsonl"
    assert detect_format("just prose\nand more prose\n") is None


def test_missing_file_and_unparsable_text_raise_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="file not found"):
        read_trace(tmp_path / "nope.jsonl")
    prose = tmp_path / "prose.md"
    prose.write_text("nothing\nto see\n")
    with pytest.raises(TraceError, match="no parsable line"):
        read_trace(prose)
    with pytest.raises(TraceError, match="no parsable line as megatron"):
        read_trace(prose, "megatron")
    with pytest.raises(TraceError, match="valid: auto, " + ", ".join(ALL_FORMATS)):
        read_trace(prose, "protobuf")

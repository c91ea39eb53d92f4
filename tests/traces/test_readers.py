"""Readers for logs people already have: modded-nanogpt, TensorBoard, W&B, Lightning, rank files.

Samples are written the way the tools write them (TensorBoard through tensorboardX's real
writer; the W&B and Lightning texts copied in form from real exports). Every reader is
auto-detected, and lines it cannot use are counted, never fatal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from supervisor.errors import TraceError
from supervisor.traces import FieldMap, detect_format, parse_text, read_run, read_trace
from supervisor.traces.synthetic import synthetic_records

MODDED = """import os
print(f"step:{step+1}/{args.num_iterations} train_loss:{train_loss.item():.4f} train_time:{approx_time:.0f}ms")
====================================================================================================
step:0/1750 val_loss:10.8258 train_time:0ms step_avg:nanms
step:1/1750 train_loss:10.8258 train_time:24389ms step_avg:nanms
step:2/1750 train_loss:10.2140 train_time:24489ms step_avg:nanms
step:3/1750 train_loss:9.7100 train_time:24589ms step_avg:nanms
step:3/1750 val_loss:9.9000 train_time:24600ms step_avg:100.00ms
step:4/1750 train_loss:9.3010 train_time:24700ms step_avg:103.67ms
step:5/1750 train_loss:garbled train_time:24800ms step_avg:103.67ms
peak memory consumption: 22400 MiB
"""

VAL_ONLY = """step:0/1770 val_loss:10.8258 train_time:0ms step_avg:nanms
step:1/1770 train_time:24286ms step_avg:nanms
step:2/1770 train_time:24883ms step_avg:nanms
step:125/1770 val_loss:4.5001 train_time:36000ms step_avg:99.00ms
step:250/1770 val_loss:4.0502 train_time:48000ms step_avg:99.00ms
"""

# Lightning CSVLogger: one row per log call (lr from LearningRateMonitor on its own rows).
LIGHTNING = """epoch,lr-AdamW,step,train_loss_epoch,train_loss_step,val_loss
,0.001,0,,,
0,,0,,2.5,
,0.001,1,,,
0,,1,,2.4,
0,,1,,,2.6
0,,1,2.45,,
,0.001,2,,,
0,,2,,nan,
"""

WANDB_PANEL = """"Step","run-a - train/loss","run-a - train/loss__MIN","run-a - train/loss__MAX","run-b - train/loss"
"0","2.5","2.5","2.5","3.0"
"1","2.4","2.4","2.4","2.9"
"2","","","","2.8"
"3","2.2","2.2","2.2",""
"""


def test_modded_nanogpt_steps_val_loss_and_timing() -> None:
    assert detect_format(MODDED) == "modded_nanogpt"
    data = parse_text(MODDED)
    assert [r.step for r in data.records] == [1, 2, 3, 4]
    assert data.records[0].loss == pytest.approx(10.8258)
    assert data.records[2].attrs == {"val_loss": 9.9}
    assert data.records[1].step_time == pytest.approx(0.1)
    # script lines, the separator, the garbled loss and the memory line are counted, not fatal
    assert data.skipped_lines == 5


def test_modded_nanogpt_without_train_loss_reads_val_loss() -> None:
    data = parse_text(VAL_ONLY)
    assert [(r.step, r.loss) for r in data.records] == [(0, 10.8258), (125, 4.5001), (250, 4.0502)]
    assert "no train_loss" in data.notes[0]


def test_lightning_rows_of_one_step_are_merged(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text(LIGHTNING)
    data = read_trace(path)
    assert data.format == "lightning"
    assert [(r.step, r.lr) for r in data.records] == [(0, 0.001), (1, 0.001), (2, 0.001)]
    assert [r.loss for r in data.records][:2] == [2.5, 2.4]
    assert data.records[2].loss != data.records[2].loss  # NaN is kept: it is evidence
    assert "loss<-'train_loss_step'" in data.notes[0]


def test_wandb_panel_export_reads_the_first_run() -> None:
    data = parse_text(WANDB_PANEL)
    assert data.format == "wandb"
    assert [(r.step, r.loss) for r in data.records] == [(0, 2.5), (1, 2.4), (3, 2.2)]
    assert any("2 runs" in n for n in data.notes)


def test_wandb_history_json_and_jsonl(tmp_path: Path) -> None:
    rows = [
        {"_step": i, "_runtime": i * 1.5, "train/loss": 3 - i / 10, "train/grad_norm": 1.0} for i in range(5)
    ]
    rows.append({"_step": 5, "eval/loss": 2.0})  # a row without the train loss is not an error
    as_list = tmp_path / "history.json"
    as_list.write_text(json.dumps(rows))
    as_lines = tmp_path / "wandb-history.jsonl"
    as_lines.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    columns = tmp_path / "history_columns.json"  # pandas DataFrame.to_json() default layout
    columns.write_text(
        json.dumps({k: {str(i): r.get(k) for i, r in enumerate(rows)} for k in rows[0]}, indent=1)
    )
    a, b, c = read_trace(as_list), read_trace(as_lines), read_trace(columns, "wandb")
    assert a.format == b.format == c.format == "wandb"
    assert (
        [r.step for r in a.records]
        == [r.step for r in b.records]
        == [r.step for r in c.records]
        == [0, 1, 2, 3, 4]
    )
    assert a.records[1].grad_norm == 1.0 and b.skipped_lines == 1


def test_field_map_override_and_unknown_field() -> None:
    text = "step,epoch,my_objective,val_loss\n1,0,2.5,\n2,0,2.4,3.0\n"
    data = parse_text(text, fmap=FieldMap.parse(["loss=my_objective"]))
    assert [r.loss for r in data.records] == [2.5, 2.4]
    guessed = parse_text("step,epoch,objective_loss,val_loss\n1,0,2.5,\n")
    assert guessed.records[0].loss == 2.5 and "objective_loss" in " ".join(guessed.notes)
    with pytest.raises(TraceError, match="unknown field 'los'"):
        FieldMap.parse(["los=x"])
    with pytest.raises(TraceError, match="no loss column"):
        parse_text("step,epoch,val_loss\n1,0,2.0\n")


def test_tensorboard_run_directory_with_split_and_rank_dirs(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    for rank in (0, 1):
        w = SummaryWriter(str(tmp_path / "run" / f"rank{rank}" / "train"))
        for step in range(1, 21):
            w.add_scalar("loss", 3.0 - step * 0.01 + rank * 0.001, step)
            w.add_scalar("grad_norm", 1.0, step)
            w.add_scalar("learning_rate", 1e-3, step)
        w.add_text("note", "not a scalar", 1)
        w.close()
    ev = SummaryWriter(str(tmp_path / "run" / "rank0" / "eval"))
    ev.add_scalar("loss", 9.0, 10)  # eval/loss must not be read as the training loss
    ev.close()
    data = read_trace(tmp_path / "run")
    assert data.format == "tensorboard"
    assert len(data.records) == 40 and {r.rank for r in data.records} == {0, 1}
    first = [r for r in data.records if r.step == 10]
    assert [r.loss for r in first] == pytest.approx([2.9, 2.901])
    assert first[0].grad_norm == 1.0 and first[0].lr == pytest.approx(1e-3)
    assert "loss<-'train/loss'" in data.notes[0]


def test_tensorboard_single_file_with_a_damaged_tail(tmp_path: Path) -> None:
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(tmp_path))
    for step in range(30):
        w.add_scalar("train/loss", 2.0, step)
    w.close()
    (f,) = tmp_path.glob("*tfevents*")
    f.write_bytes(f.read_bytes() + b"\x10\x00\x00\x00garbage")
    data = read_trace(f)
    assert len(data.records) == 30
    with pytest.raises(TraceError, match="use --map loss=TAG"):
        read_trace(f, "tensorboard", FieldMap.parse(["loss=nope"]))


def _write_rank_files(tmp_path: Path) -> list[Path]:
    recs = synthetic_records(60, 2, seed=1)
    paths = []
    for rank in (0, 1):
        p = tmp_path / f"trace_rank{rank}.jsonl"
        lines = [json.dumps({**r.to_dict(), "rank": 0}) for r in recs if r.rank == rank]
        p.write_text("\n".join(lines) + "\nnot a record\n")
        paths.append(p)
    return paths


def test_rank_files_merge_into_one_run(tmp_path: Path) -> None:
    paths = _write_rank_files(tmp_path)
    data = read_run(paths)
    assert data.skipped_lines == 2
    assert [(r.step, r.rank) for r in data.records[:4]] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert {r.world_size for r in data.records} == {2}
    (tmp_path / "notes.md").write_text("no records here\n")
    whole = read_trace(tmp_path)  # the directory: the same run, the prose file noted
    assert [(r.step, r.rank) for r in whole.records] == [(r.step, r.rank) for r in data.records]
    assert any("notes.md" in n for n in whole.notes)


def test_rank_files_keep_a_replay_in_order(tmp_path: Path) -> None:
    for rank in (0, 1):
        steps = [*range(1, 11), *range(6, 13)]  # a rollback to 5 re-ran 6..10
        (tmp_path / f"rank_{rank}.jsonl").write_text(
            "\n".join(json.dumps({"step": s, "loss": 2.0}) for s in steps) + "\n"
        )
    data = read_trace(tmp_path)
    steps = [r.step for r in data.records]
    assert steps[:20] == [s for s in range(1, 11) for _ in (0, 1)]
    assert steps[20:] == [s for s in range(6, 13) for _ in (0, 1)]


def test_empty_directory_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no trace or log files"):
        read_trace(tmp_path)
